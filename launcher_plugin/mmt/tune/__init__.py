"""The micro-batch tuner (``python tune.py recipe=...``): the search, the trial runner, the tuned tables."""

from mmt.tune.runner import run
from mmt.tune.search import Trial, TuneError, TuneSettings, choose, confirm, refine, search, sweep

__all__ = ["Trial", "TuneError", "TuneSettings", "choose", "confirm", "refine", "run", "search", "sweep"]
