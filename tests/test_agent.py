"""The node agent: one per launcher, for every batch a sweeper hands it; forked ranks see their own rank in state that
libraries computed at import time; an app that never imports torch pays nothing for it; and the package layout
has no import cycle."""

import ast
import re
import subprocess
import sys
from pathlib import Path
from typing import Dict, List, Set

from conftest import REPO, app_env, results, run_app

PACKAGE = REPO / "launcher_plugin" / "mmt"

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
    done = subprocess.run([sys.executable, str(app), "-m", "hydra/launcher=mmt_local", "+hydra.launcher.devices=2",
                           "hydra.launcher.preload=[lightning.pytorch]", f"hydra.sweep.dir={tmp_path / 'sweep'}"],
                          cwd=tmp_path, env=app_env(tag), capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    logs = _logs(tmp_path / "sweep" / "0")
    assert "RANK=0 rank_zero_only.rank=0" in logs and "RANK=1 rank_zero_only.rank=1" in logs
    assert logs.count("CONFIG TREE (rank zero only)") == 1


def test_one_agent_serves_every_batch_of_a_sweep(tmp_path, tag):
    done = run_app("recipe=probe", "num_nodes=1", "devices=1", "+x=1,2,3", "hydra.sweeper.max_batch_size=1",
                   sweep_dir=tmp_path, tag=tag)
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
    done = subprocess.run([sys.executable, str(app), "-m", "hydra/launcher=mmt_local", "+x=1,2",
                           f"hydra.sweep.dir={tmp_path / 'sweep'}"], cwd=tmp_path, env=app_env(tag),
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    # the ranks are forked from the agent: what they find imported, the agent imported
    assert [r["return_value"]["modules"] for r in results(tmp_path / "sweep")] == [[], []]


# ------------------------------------------------------------------------------------------------ the layout


def _module_imports() -> Dict[str, Set[str]]:
    """mmt's modules -> the mmt modules they import at module level (imports inside functions are lazy on purpose)."""
    graph: Dict[str, Set[str]] = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found: Set[str] = set()
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("mmt"):
                found.add(node.module)
                found.update(f"{node.module}.{alias.name}" for alias in node.names)
            elif isinstance(node, ast.Import):
                found.update(alias.name for alias in node.names if alias.name.startswith("mmt"))
        graph[name] = found
    return {name: {dep for dep in deps if dep in graph and dep != name} for name, deps in graph.items()}


def test_no_import_cycle_in_the_engine():
    graph = _module_imports()
    state: Dict[str, int] = {}
    cycles: List[List[str]] = []

    def visit(name: str, path: List[str]) -> None:
        state[name] = 1
        for dep in sorted(graph[name]):
            if state.get(dep) == 1 and not name.startswith(dep + ".") and not dep.startswith(name + "."):
                cycles.append(path[path.index(dep):] + [dep] if dep in path else path + [dep])
            elif dep not in state:
                visit(dep, path + [dep])
        state[name] = 2

    for name in sorted(graph):
        if name not in state:
            visit(name, [name])
    assert cycles == [], cycles


def test_the_folders_show_the_stages_and_the_processes():
    folders = {p.name for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    assert {"planning", "launching", "backends", "agent", "worker", "tune", "service", "cli", "monitor",
            "dashboard", "conf"} <= folders
    assert {p.name for p in (PACKAGE / "backends").iterdir() if p.is_dir() and not p.name.startswith("_")} == \
        {"local", "slurm"}
    plugin = REPO / "launcher_plugin" / "hydra_plugins" / "mmt_launcher"
    assert sorted(p.name for p in plugin.glob("*.py")) == ["__init__.py", "config.py", "mmt_launcher.py",
                                                          "mmt_searchpath.py"]


# ------------------------------------------------------------------------------------------------ GPUs (mocked)


def test_each_simulated_node_sees_its_own_gpus_and_ranks_index_them_by_local_rank(tmp_path, tag):
    # no GPU here: the host's GPUs are faked through CUDA_VISIBLE_DEVICES, which is all mmt reads to slice them,
    # and the probe falls back to gloo (torch sees no CUDA); what is checked is what each rank is given
    done = run_app("recipe=probe", "machine=t4_x_4", "num_nodes=2", "devices=2", sweep_dir=tmp_path, tag=tag,
                   CUDA_VISIBLE_DEVICES="0,1,2,3")
    assert done.returncode == 0, done.stderr[-2000:]
    ranks = results(tmp_path)[0]["return_value"]["ranks"]
    assert [r["cuda_visible_devices"] for r in ranks] == ["0,1", "0,1", "2,3", "2,3"]
    assert [r["local_rank"] for r in ranks] == [0, 1, 0, 1]


def test_a_slurm_node_agent_gives_every_rank_the_nodes_gpus_and_its_local_rank(monkeypatch):
    # SLURM sets the task's CUDA_VISIBLE_DEVICES to the node's GPUs (--gpus-per-node); every forked rank keeps
    # them all and uses cuda:LOCAL_RANK, as Lightning expects (no GPU here: the variables are what is tested)
    from mmt.backends.slurm.task import SlurmTask
    from mmt.planning.environment import Rendezvous
    from mmt.planning.machine import Machine
    from mmt.planning.plan import JobPlan

    plan = JobPlan(num=0, name="g-0", job_id="g", overrides=(), job_dir="/tmp/g", num_nodes=2, devices=2,
                   machine=Machine(name="t4_x_2", accelerator="gpu", gpus=2), image=None, command=None,
                   command_mode="per_node", env={}, timeout_s=60.0)
    task = SlurmTask(plan=plan, attempt_dir="/tmp/g/.mmt/attempts/a", per_node_tasks=True, kill_grace_s=1.0,
                     start_method="fork", max_requeues=0)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5")
    monkeypatch.setenv("SLURM_PROCID", "1")
    facts = {"job_id": "7", "node": "1", "nodelist": "node[1-2]", "cpus_on_node": "8", "restarts": "0"}
    envs = [task._env(facts, index, {}, Rendezvous("node1", 20007)) for index in plan.node_indices(1)]
    assert [e["CUDA_VISIBLE_DEVICES"] for e in envs] == ["4,5", "4,5"]
    assert [(e["RANK"], e["LOCAL_RANK"], e["NODE_RANK"]) for e in envs] == [("2", "0", "1"), ("3", "1", "1")]
    assert all("SLURM_PROCID" not in e for e in envs)  # the contract, not SLURM's per-task view


def test_only_jobdir_spells_the_names_in_a_job_or_sweep_dir():
    # one module owns every file name of a job dir and its private .mmt/ (mmt.jobdir): another spelling would
    # drift from it. (The tuner's trial dirs are its own; MMT_HOME's default ~/.mmt is not a job dir.)
    import mmt

    package = Path(mmt.__file__).parent
    names = ("attempts", "owner.json", "lock", "plan.pkl", "job.pkl", "job.json", "return.pkl", "result.json",
             "metrics.csv", "summary.csv", "summary.png", "multirun.yaml", "logs", "metrics", "checkpoints")
    spelled = re.compile(r"""/ ?["'](%s)["']|["']\.mmt["']""" % "|".join(re.escape(n) for n in names))
    allowed = {"jobdir.py", "service/registry.py"}
    offenders = [f"{path.relative_to(package)}:{number}: {line.strip()}"
                 for path in sorted(package.rglob("*.py"))
                 if str(path.relative_to(package)) not in allowed and path.parent.name != "tune"
                 for number, line in enumerate(path.read_text().splitlines(), 1) if spelled.search(line)]
    assert offenders == [], "\n".join(offenders)
