"""mmt: multi-machine training for Hydra apps.

What training code imports: the rank-env contract (:class:`RankInfo`), and :func:`mark_phase` to add a phase of
its own to the job's timeline (``<job dir>/.mmt/timeline.jsonl``). The job SDK (``Job``, ``MMT``, ``Machine``,
``Status``, shaped like Lightning's) loads on first use, so that ``import mmt`` in every rank stays light. The Hydra
launcher itself is the plugin ``hydra_plugins.mmt_launcher``.
"""

from typing import Any

from mmt.core.rank_env import RankInfo
from mmt.core.timeline import mark as mark_phase
from mmt.core.version import VERSION

__all__ = ["RankInfo", "mark_phase", "Job", "MMT", "Machine", "Status"]
__version__ = VERSION

_SDK = ("Job", "MMT", "Machine", "Status")


def __getattr__(name: str) -> Any:
    if name in _SDK:
        from mmt import sdk

        return getattr(sdk, name)
    raise AttributeError(f"module 'mmt' has no attribute {name!r}")
