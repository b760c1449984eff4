"""Each job of a sweep is composed once: the launcher takes the config the sweeper composed to check the batch.
(A real sweep, counting Hydra's compositions: tests/e2e/test_compose_once.py.)"""

from mmt.launching.compose_once import ComposeOnce, compose_job, forget


class _Loader:
    def __init__(self) -> None:
        self.made = 0

    def load_sweep_config(self, master_config, sweep_overrides):
        self.made += 1
        return {"overrides": list(sweep_overrides), "made": self.made}


def test_a_checked_job_is_taken_once_and_a_job_nobody_checked_is_composed():
    loader = _Loader()
    ComposeOnce.install(loader)
    ComposeOnce.install(loader)  # a second launcher setup on the same loader wraps it once
    master = object()
    checked = loader.load_sweep_config(master, ["x=1"])  # the sweeper checks the batch
    assert compose_job(loader, master, ["x=1"]) is checked and loader.made == 1
    again = compose_job(loader, master, ["x=1"])  # taken once: the launcher changes what it gets
    assert again is not checked and loader.made == 2
    assert compose_job(loader, master, ["x=2"])["overrides"] == ["x=2"] and loader.made == 3
    assert compose_job(loader, object(), ["x=1"])["made"] == 4  # another master config is another sweep


def test_two_jobs_with_the_same_overrides_in_one_batch_get_configs_of_their_own():
    loader = _Loader()
    ComposeOnce.install(loader)
    master = object()
    loader.load_sweep_config(master, ["x=1"])
    loader.load_sweep_config(master, ["x=1"])  # Optuna may propose the same trial twice in one batch
    first, second = compose_job(loader, master, ["x=1"]), compose_job(loader, master, ["x=1"])
    assert first is not second


def test_what_a_batch_left_is_dropped_at_its_end():
    loader = _Loader()
    ComposeOnce.install(loader)
    master = object()
    loader.load_sweep_config(master, ["x=1"])
    forget(loader)
    assert compose_job(loader, master, ["x=1"])["made"] == 2
