"""Each job of a sweep is composed once: the launcher takes the config the sweeper composed to check the batch."""

import subprocess
import sys

from conftest import REPO, app_env, results

from mmt.launching.compose_once import ComposeOnce, compose_job, forget

# runs an app under Hydra with its config loader counting compositions, and prints the count at the end
COUNTING = """
import atexit, runpy, sys
from hydra._internal.config_loader_impl import ConfigLoaderImpl
calls = []
original = ConfigLoaderImpl.load_sweep_config
def counted(self, master_config, sweep_overrides):
    calls.append(tuple(sweep_overrides))
    return original(self, master_config, sweep_overrides)
ConfigLoaderImpl.load_sweep_config = counted
atexit.register(lambda: print(f"COMPOSED {len(calls)}", flush=True))
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""

APP = """
import hydra

@hydra.main(version_base="1.3", config_path=None, config_name=None)
def main(cfg):
    from hydra.core.hydra_config import HydraConfig
    job = HydraConfig.get().job
    return {"x": float(cfg.x), "num": job.num, "id": job.id, "dir": HydraConfig.get().runtime.output_dir}

if __name__ == "__main__":
    main()
"""


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


def test_a_sweep_composes_each_job_once_and_every_job_gets_its_own_config(tmp_path, tag):
    app = tmp_path / "app.py"
    app.write_text(APP)
    counter = tmp_path / "counting.py"
    counter.write_text(COUNTING)

    def run(*extra: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, str(counter), str(app), "-m", "+x=1,2,3",
                               f"hydra.sweep.dir={tmp_path / 'sweep'}", *extra], cwd=tmp_path, env=app_env(tag),
                              capture_output=True, text=True, timeout=120)

    basic = run()  # Hydra's basic launcher: checked by the sweeper, composed again to run
    assert basic.returncode == 0, basic.stderr[-2000:]
    assert "COMPOSED 6" in basic.stdout
    mmt = run("hydra/launcher=mmt_local")
    assert mmt.returncode == 0, mmt.stderr[-2000:]
    assert "COMPOSED 3" in mmt.stdout
    values = [r["return_value"] for r in results(tmp_path / "sweep")]
    assert [v["x"] for v in values] == [1.0, 2.0, 3.0]
    assert [v["num"] for v in values] == [0, 1, 2] and len({v["id"] for v in values}) == 3
    assert [v["dir"] for v in values] == [str(tmp_path / "sweep" / str(n)) for n in range(3)]
