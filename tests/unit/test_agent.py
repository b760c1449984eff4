"""The package layout: no import cycle, folders that show the stages and the processes, one module that spells a
job dir's file names; and the GPUs a SLURM node agent hands its ranks (the node agent's processes themselves are
in tests/e2e/test_agent.py)."""

import ast
import re
from pathlib import Path
from typing import Dict, List, Set

from helpers.paths import REPO

PACKAGE = REPO / "launcher_plugin" / "mmt"


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
                cycles.append(path[path.index(dep) :] + [dep] if dep in path else path + [dep])
            elif dep not in state:
                visit(dep, path + [dep])
        state[name] = 2

    for name in sorted(graph):
        if name not in state:
            visit(name, [name])
    assert cycles == [], cycles


def test_the_folders_show_the_stages_and_the_processes():
    folders = {p.name for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    assert {
        "core",
        "planning",
        "records",
        "launching",
        "backends",
        "agent",
        "worker",
        "tune",
        "service",
        "cli",
        "monitor",
        "dashboard",
        "conf",
    } <= folders
    assert {p.name for p in (PACKAGE / "backends").iterdir() if p.is_dir() and not p.name.startswith("_")} == {
        "local",
        "slurm",
        "ray",
    }
    plugin = REPO / "launcher_plugin" / "hydra_plugins" / "mmt_launcher"
    assert sorted(p.name for p in plugin.glob("*.py")) == [
        "__init__.py",
        "_core.py",
        "config.py",
        "mmt_launcher.py",
        "mmt_searchpath.py",
    ]


def test_a_slurm_node_agent_gives_every_rank_the_nodes_gpus_and_its_local_rank(monkeypatch):
    # SLURM sets the task's CUDA_VISIBLE_DEVICES to the node's GPUs (--gpus-per-node); every forked rank keeps
    # them all and uses cuda:LOCAL_RANK, as Lightning expects (no GPU here: the variables are what is tested)
    from mmt.backends.slurm.task import SlurmTask
    from mmt.planning.environment import Rendezvous
    from mmt.planning.machine import Machine
    from mmt.planning.plan import JobPlan

    plan = JobPlan(
        num=0,
        name="g-0",
        job_id="g",
        overrides=(),
        job_dir="/tmp/g",
        num_nodes=2,
        devices=2,
        machine=Machine(name="t4_x_2", accelerator="gpu", gpus=2),
        image=None,
        command=None,
        command_mode="per_node",
        env={},
        timeout_s=60.0,
    )
    task = SlurmTask(
        plan=plan,
        attempt_dir="/tmp/g/.mmt/attempts/a",
        per_node_tasks=True,
        kill_grace_s=1.0,
        start_method="fork",
        max_requeues=0,
    )
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5")
    monkeypatch.setenv("SLURM_PROCID", "1")
    facts = {"job_id": "7", "node": "1", "nodelist": "node[1-2]", "cpus_on_node": "8", "restarts": "0"}
    envs = [task._env(facts, index, {}, Rendezvous("node1", 20007)) for index in plan.node_indices(1)]
    assert [e["CUDA_VISIBLE_DEVICES"] for e in envs] == ["4,5", "4,5"]
    assert [(e["RANK"], e["LOCAL_RANK"], e["NODE_RANK"]) for e in envs] == [("2", "0", "1"), ("3", "1", "1")]
    assert all("SLURM_PROCID" not in e for e in envs)  # the contract, not SLURM's per-task view


def test_only_jobdir_spells_the_names_in_a_job_or_sweep_dir():
    # one module owns every file name of a job dir and its private .mmt/ (mmt.core.jobdir): another spelling would
    # drift from it. (The tuner's trial dirs are its own; MMT_HOME's default ~/.mmt is not a job dir.)
    import mmt

    package = Path(mmt.__file__).parent
    names = (
        "attempts",
        "owner.json",
        "lock",
        "plan.pkl",
        "job.pkl",
        "job.json",
        "return.pkl",
        "result.json",
        "metrics.csv",
        "summary.csv",
        "summary.png",
        "multirun.yaml",
        "logs",
        "metrics",
        "checkpoints",
    )
    spelled = re.compile(r"""/ ?["'](%s)["']|["']\.mmt["']""" % "|".join(re.escape(n) for n in names))
    allowed = {"core/jobdir.py", "records/registry.py"}
    offenders = [
        f"{path.relative_to(package)}:{number}: {line.strip()}"
        for path in sorted(package.rglob("*.py"))
        if str(path.relative_to(package)) not in allowed and path.parent.name != "tune"
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if spelled.search(line)
    ]
    assert offenders == [], "\n".join(offenders)
