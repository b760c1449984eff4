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


def test_the_hydra_state_a_job_restores_is_what_singleton_get_state_gives():
    """prepare.hydra_state skips get_state's deep copies (the payload's pickle is the copy): a job's process must
    restore the same singletons and resolvers from it, and a change made after the pickle must not reach the job."""
    import cloudpickle
    from hydra.core.config_store import ConfigStore
    from hydra.core.plugins import Plugins
    from hydra.core.singleton import Singleton
    from omegaconf.basecontainer import BaseContainer

    from mmt.launching.prepare import hydra_state

    compose_train()  # Hydra's singletons as an app's launcher has them
    ConfigStore.instance().store(name="mmt_state_probe", node={"a": 1})
    OmegaConf.register_new_resolver("mmt_state_probe", lambda: 1, replace=True)
    try:
        ours, hydras = cloudpickle.dumps(hydra_state()), cloudpickle.dumps(Singleton.get_state())
        ConfigStore.instance().store(name="mmt_state_probe", node={"a": 2})  # after the pickle: not the job's
    finally:
        ConfigStore.instance().repo.pop("mmt_state_probe.yaml", None)
        OmegaConf.clear_resolver("mmt_state_probe")
    restored, expected = cloudpickle.loads(ours), cloudpickle.loads(hydras)
    assert Plugins not in restored["instances"]
    assert [kind.__qualname__ for kind in restored["instances"]] == [
        kind.__qualname__ for kind in expected["instances"]
    ]
    assert set(restored["omegaconf_resolvers"]) == set(expected["omegaconf_resolvers"])
    assert "mmt_state_probe" in restored["omegaconf_resolvers"]
    store = next(i for k, i in restored["instances"].items() if k.__qualname__ == "ConfigStore")
    assert store.repo["mmt_state_probe.yaml"].node == {"a": 1}
    assert (
        store.repo.keys()
        == next(i for k, i in expected["instances"].items() if k.__qualname__ == "ConfigStore").repo.keys()
    )
    assert "mmt_state_probe" not in BaseContainer._resolvers


def test_a_forked_rank_reseeds_numpy_only_where_the_agent_imported_numpy_random(monkeypatch):
    """after_fork.reset: numpy's global RandomState, imported before the fork, is drawn afresh in each rank; a numpy
    whose lazy ``numpy.random`` was never imported is not made to import it (7 ms of every rank's start)."""
    import sys
    import types

    import numpy.random

    from mmt.worker import after_fork

    before = numpy.random.get_state()[1].copy()
    after_fork.reset()
    assert (numpy.random.get_state()[1] != before).any()

    class LazyNumpy(types.ModuleType):
        def __getattr__(self, name: str) -> None:
            raise AssertionError(f"numpy.{name} looked up: a lazy import in every rank")

    monkeypatch.setitem(sys.modules, "numpy", LazyNumpy("numpy"))
    monkeypatch.delitem(sys.modules, "numpy.random")
    after_fork.reset()
