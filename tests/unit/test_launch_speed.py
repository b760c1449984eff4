"""What keeps the launch path short, checked without starting anything: the job's timeline (marks from several
writers read back in order, lost quietly where the job dir is gone), and the local agent's early preload (only what
every job of the sweep preloads)."""

import time

import pytest
from omegaconf import OmegaConf, open_dict

from helpers.config import compose_train
from mmt.core import timeline
from mmt.core.jobdir import JobDir
from mmt.launching.prepare import expected_preload


def test_marks_from_several_writers_read_back_in_time_order(tmp_path):
    path = JobDir(tmp_path).timeline
    timeline.mark_at(path, timeline.RANK_EXIT, 30.0, process=1)
    timeline.mark_at(path, timeline.LAUNCHER_START, 10.0)
    timeline.mark_at(path, timeline.AGENT_READY, 20.0, node=0)
    with open(path, "a") as handle:
        handle.write('{"phase": "cut short"')  # a writer killed mid-line
    events = timeline.read(path)
    assert [(e.phase, e.t) for e in events] == [("launcher_start", 10.0), ("agent_ready", 20.0), ("rank_exit", 30.0)]
    assert events[2].where == {"process": 1}


def test_a_mark_where_the_job_dir_is_gone_is_lost_quietly(tmp_path, monkeypatch):
    timeline.mark_at(tmp_path / "gone" / "timeline.jsonl", timeline.SUBMIT)
    monkeypatch.delenv(timeline.TIMELINE_VAR, raising=False)
    timeline.mark("first_collective")  # outside an mmt rank: nothing to write to
    assert not (tmp_path / "gone").exists()


def test_a_rank_marks_its_own_phase_through_the_variable_the_worker_sets(tmp_path, monkeypatch):
    monkeypatch.setenv(timeline.TIMELINE_VAR, str(tmp_path / "timeline.jsonl"))
    from mmt import mark_phase

    mark_phase("first_collective", rank=3)
    [event] = timeline.read(tmp_path / "timeline.jsonl")
    assert event.phase == "first_collective" and event.where == {"rank": 3}
    assert abs(event.t - time.time()) < 5


def _master(*typed: str, sweeper_params=None, **values):
    """The master config of ``python train.py -m <typed>`` as the launcher's setup() gets it: the sweep overrides
    are not in it, only in hydra.overrides.task."""
    config = compose_train(*(o for o in typed if "," not in o))
    with open_dict(config):
        config.hydra.overrides.task = list(typed)
        for key, value in values.items():
            OmegaConf.update(config, key, value, force_add=True)
        if sweeper_params is not None:
            config.hydra.sweeper = {"_target_": "hydra_plugins.hydra_optuna_sweeper.optuna_sweeper.OptunaSweeper"}
            config.hydra.sweeper.params = sweeper_params
    return config


@pytest.mark.parametrize(
    "typed, expected",
    [
        (("recipe=probe",), ("torch.distributed",)),
        (("recipe=probe", "recipe.hold_s=1,2", "num_nodes=1,2"), ("torch.distributed",)),
        (("recipe=probe,lm",), ()),  # the jobs differ in what they preload: each job's start says
        (("recipe=probe", "hydra.launcher.preload=[json],[csv]"), ()),
        (("recipe=probe", "command='echo hi'"), ()),  # a command starts its own interpreters
    ],
)
def test_the_agent_preloads_early_only_what_every_job_of_the_sweep_preloads(typed, expected):
    assert expected_preload(_master(*typed)) == expected


def test_this_process_started_before_now_on_the_wall_clock():
    started = timeline.process_start_time()
    assert started is not None and time.time() - 24 * 3600 < started <= time.time()


def test_a_sweeper_that_chooses_the_recipe_gets_no_early_preload():
    assert expected_preload(_master("recipe=probe", sweeper_params={"recipe.hold_s": "range(0,3)"})) == (
        "torch.distributed",
    )
    assert expected_preload(_master("recipe=probe", sweeper_params={"recipe": "choice(probe,lm)"})) == ()
