"""The node agent: one per launcher, for every batch a sweeper hands it; forked ranks see their own rank in state that
libraries computed at import time; an app that never imports torch pays nothing for it. (The package layout is
checked in tests/unit/test_agent.py.)"""

import subprocess
import sys
from pathlib import Path

from helpers.app import app_env, results, run_app

RANK_ZERO_APP = """
import os, sys, hydra
from lightning.pytorch.utilities import rank_zero_only

@rank_zero_only
def print_config_once(cfg):
    print("CONFIG TREE (rank zero only)", flush=True)

@hydra.main(version_base="1.3", config_path=None, config_name=None)
def main(cfg):
    print(f"RANK={os.environ['RANK']} rank_zero_only.rank={rank_zero_only.rank}", flush=True)
    print_config_once(cfg)   # before any Trainer exists
    return {"torch_in_agent": "torch" in sys.modules}

if __name__ == "__main__":
    main()
"""


def _app(tmp_path: Path, source: str) -> Path:
    path = tmp_path / "app.py"
    path.write_text(source)
    return path


def _logs(job: Path) -> str:
    return "".join(p.read_text() for p in sorted((job / "logs").glob("*.log")))


def test_ranks_forked_after_lightning_was_preloaded_know_their_own_rank(tmp_path, tag):
    app = _app(tmp_path, RANK_ZERO_APP)
    done = subprocess.run(
        [
            sys.executable,
            str(app),
            "-m",
            "hydra/launcher=mmt_local",
            "+hydra.launcher.devices=2",
            "hydra.launcher.preload=[lightning.pytorch]",
            f"hydra.sweep.dir={tmp_path / 'sweep'}",
        ],
        cwd=tmp_path,
        env=app_env(tag),
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    logs = _logs(tmp_path / "sweep" / "0")
    assert "RANK=0 rank_zero_only.rank=0" in logs and "RANK=1 rank_zero_only.rank=1" in logs
    assert logs.count("CONFIG TREE (rank zero only)") == 1


def test_one_agent_serves_every_batch_of_a_sweep(tmp_path, tag):
    done = run_app(
        "recipe=probe",
        "num_nodes=1",
        "devices=1",
        "+x=1,2,3",
        "hydra.sweeper.max_batch_size=1",
        sweep_dir=tmp_path,
        tag=tag,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    jobs = results(tmp_path)
    assert len(jobs) == 3
    agents = {job["return_value"]["ranks"][0]["ppid"] for job in jobs}
    assert len(agents) == 1, "every batch forked from the same agent (torch imported once)"


TORCH_FREE_APP = """
import sys, hydra

@hydra.main(version_base="1.3", config_path=None, config_name=None)
def main(cfg):
    return {"modules": sorted(m for m in ("torch", "lightning", "numpy") if m in sys.modules)}

if __name__ == "__main__":
    main()
"""


def test_an_app_that_never_imports_torch_pays_nothing_for_it(tmp_path, tag):
    app = _app(tmp_path, TORCH_FREE_APP)
    done = subprocess.run(
        [sys.executable, str(app), "-m", "hydra/launcher=mmt_local", "+x=1,2", f"hydra.sweep.dir={tmp_path / 'sweep'}"],
        cwd=tmp_path,
        env=app_env(tag),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    # the ranks are forked from the agent: what they find imported, the agent imported
    assert [r["return_value"]["modules"] for r in results(tmp_path / "sweep")] == [[], []]


# ------------------------------------------------------------------------------------------------ GPUs (mocked)


def test_each_simulated_node_sees_its_own_gpus_and_ranks_index_them_by_local_rank(tmp_path, tag):
    # no GPU here: the host's GPUs are faked through CUDA_VISIBLE_DEVICES, which is all mmt reads to slice them,
    # and the probe falls back to gloo (torch sees no CUDA); what is checked is what each rank is given
    done = run_app(
        "recipe=probe",
        "machine=t4_x_4",
        "num_nodes=2",
        "devices=2",
        sweep_dir=tmp_path,
        tag=tag,
        CUDA_VISIBLE_DEVICES="0,1,2,3",
    )
    assert done.returncode == 0, done.stderr[-2000:]
    ranks = results(tmp_path)[0]["return_value"]["ranks"]
    assert [r["cuda_visible_devices"] for r in ranks] == ["0,1", "0,1", "2,3", "2,3"]
    assert [r["local_rank"] for r in ranks] == [0, 1, 0, 1]
