"""Each job of a sweep is composed once at most: a real sweep under Hydra, its config loader counting compositions.
Jobs that differ from a sibling in plain values only are derived from its config, not composed by Hydra at all.
(The mechanisms on their own: tests/unit/test_compose_once.py, tests/unit/test_sibling_compose.py.)"""

import subprocess
import sys

from helpers.app import app_env, results

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


def test_a_sweep_composes_each_job_once_at_most_and_every_job_gets_its_own_config(tmp_path, tag):
    app = tmp_path / "app.py"
    app.write_text(APP)
    counter = tmp_path / "counting.py"
    counter.write_text(COUNTING)

    def run(*extra: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, str(counter), str(app), "-m", "+x=1,2,3", f"hydra.sweep.dir={tmp_path / 'sweep'}", *extra],
            cwd=tmp_path,
            env=app_env(tag),
            capture_output=True,
            text=True,
            timeout=120,
        )

    basic = run()  # Hydra's basic launcher: checked by the sweeper, composed again to run
    assert basic.returncode == 0, basic.stderr[-2000:]
    assert "COMPOSED 6" in basic.stdout
    mmt = run("hydra/launcher=mmt_local")
    assert mmt.returncode == 0, mmt.stderr[-2000:]
    assert "COMPOSED 1" in mmt.stdout  # x=1 by Hydra; x=2 and x=3 from its config
    values = [r["return_value"] for r in results(tmp_path / "sweep")]
    assert [v["x"] for v in values] == [1.0, 2.0, 3.0]
    assert [v["num"] for v in values] == [0, 1, 2] and len({v["id"] for v in values}) == 3
    assert [v["dir"] for v in values] == [str(tmp_path / "sweep" / str(n)) for n in range(3)]
