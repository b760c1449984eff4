"""command=...: any command on every node (per_node) or every rank (per_rank), with the rank contract.

The seed's three example scripts (examples/seed/, copied unchanged from the Lightning guide) run through it on
2 nodes x 2 devices, and each must see the world of 4 it should. (That they are the guide's code:
tests/unit/test_command_mode.py.)
"""

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.app import job_dirs, results, run_app
from helpers.paths import REPO

SEED = REPO / "examples" / "seed"


PY = sys.executable
# run by every node/rank: writes its view of the contract to the job dir
DUMP_ENV = """\
import json, os
keys = [k for k in os.environ if k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "NODE_RANK", "LOCAL_WORLD_SIZE",
        "NUM_NODES", "MASTER_PORT") or k.startswith(("PL_TRAINER_", "LT_", "MMT_GLOBAL", "MMT_MICRO"))]
who = os.environ.get("RANK", "node" + os.environ["NODE_RANK"])
with open(os.path.join(os.environ["MMT_JOB_DIR"], "env." + who + ".json"), "w") as handle:
    json.dump({k: os.environ[k] for k in keys}, handle)
"""


@pytest.fixture(scope="module")
def corpora(tmp_path_factory):
    """The offline data files the seed scripts expect in ./data: the seed Trainer and raw PyTorch scripts split
    off 2 x 2000 samples, so they need the larger corpus; Fabric iterates over all of it, so it gets the small one."""
    root = tmp_path_factory.mktemp("corpora")
    for name, extra, blocks in (("large", ["--min-blocks", "4101"], 4101), ("small", [], 1872)):
        done = subprocess.run(
            [PY, "-m", "recipes.corpus", str(root / name), *extra],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0 and f": {blocks} blocks of 35 tokens" in done.stdout, done.stdout + done.stderr
    return {name: root / name / "wikitext-2.txt" for name in ("large", "small")}


def _workdir(tmp_path: Path, corpus: Path) -> Path:
    cwd = tmp_path / "cwd"
    (cwd / "data").mkdir(parents=True)
    shutil.copy(corpus, cwd / "data" / "wikitext-2.txt")
    return cwd


def _logs(job: Path) -> str:
    return "".join(p.read_text() for p in sorted((job / "logs").glob("*.log")))


def _members(text: str) -> list:
    return sorted(re.findall(r"Initializing distributed: GLOBAL_RANK: (\d), MEMBER: (\d)/(\d)", text))


def test_seed_trainer_script_runs_unchanged_per_node(tmp_path, tag, corpora):
    cwd = _workdir(tmp_path, corpora["large"])
    # PL_TRAINER_* only shortens the validation and test loops (Trainer defaults from the environment);
    # the topology comes from the launcher
    done = run_app(
        f"command='cd {cwd} && {PY} {SEED / 'trainer.py'}'",
        "command_mode=per_node",
        "num_nodes=2",
        "devices=2",
        "+env.PL_TRAINER_LIMIT_VAL_BATCHES=2",
        "+env.PL_TRAINER_LIMIT_TEST_BATCHES=2",
        sweep_dir=tmp_path / "sweep",
        tag=tag,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    [job] = job_dirs(tmp_path / "sweep")
    assert sorted(p.name for p in (job / "logs").iterdir()) == ["node0.log", "node1.log"]  # one process per node
    # Lightning started the second rank of each node itself, and all four joined one world of 4
    assert _members(_logs(job)) == [("0", "1", "4"), ("1", "2", "4"), ("2", "3", "4"), ("3", "4", "4")]
    assert "GLOBAL_RANK: 2" in (job / "logs" / "node1.log").read_text()
    assert (cwd / "ptl_ddp.ckpt").stat().st_size > 0 and "test_loss" in done.stdout
    assert results(tmp_path / "sweep")[0]["return_value"]["exit_code"] == 0


def test_seed_fabric_script_runs_unchanged_per_node(tmp_path, tag, corpora):
    cwd = _workdir(tmp_path, corpora["small"])
    done = run_app(
        f"command='cd {cwd} && {PY} {SEED / 'fabric.py'}'",
        "num_nodes=2",
        "devices=2",
        sweep_dir=tmp_path / "sweep",
        tag=tag,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    [job] = job_dirs(tmp_path / "sweep")
    node0 = (job / "logs" / "node0.log").read_text()
    assert _members(_logs(job)) == [("0", "1", "4"), ("1", "2", "4"), ("2", "3", "4"), ("3", "4", "4")]
    # 1872 samples / 4 ranks / 20 per batch = 24 iterations per rank, printed every 10: 0, 10, 20 (a world of
    # 2 would print up to 40, a single process up to 90)
    assert re.findall(r"iteration: (\d+) - loss", node0) == ["0", "10", "20"]


def test_seed_raw_pytorch_script_runs_unchanged_per_rank(tmp_path, tag, corpora):
    cwd = _workdir(tmp_path, corpora["large"])
    done = run_app(
        f"command='cd {cwd} && {PY} {SEED / 'pytorch_ddp.py'}'",
        "command_mode=per_rank",
        "num_nodes=2",
        "devices=2",
        sweep_dir=tmp_path / "sweep",
        tag=tag,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    [job] = job_dirs(tmp_path / "sweep")
    assert len(list((job / "logs").glob("node*.rank*.log"))) == 4
    rank0 = (job / "logs" / "node0.rank0.log").read_text()
    # 4101 - 4000 = 101 training samples / 4 ranks = 26 per rank: 2 batches of 20 per epoch, 2 epochs
    # (a world of 1 would take 6 per epoch); only rank 0 prints
    assert re.findall(r"epoch/it: (\d+/\d+),", rank0) == ["0/0", "0/1", "1/0", "1/1"]
    assert "epoch/it" not in _logs(job).replace(rank0, "")
    assert (cwd / "pytorch_ddp.ckpt").stat().st_size > 0


def test_raw_pytorch_script_runs_per_node_under_torchrun(tmp_path, tag, corpora):
    # per node, the raw script's own fallback (mp.spawn, rank = local rank) cannot work; torchrun per node can
    cwd = _workdir(tmp_path, corpora["large"])
    torchrun = (
        f"{PY} -m torch.distributed.run --nnodes=$NUM_NODES --nproc-per-node=$LOCAL_WORLD_SIZE "
        "--node-rank=$NODE_RANK --master-addr=$MASTER_ADDR --master-port=$MASTER_PORT"
    )
    done = run_app(
        f"command='cd {cwd} && {torchrun} {SEED / 'pytorch_ddp.py'}'",
        "num_nodes=2",
        "devices=2",
        sweep_dir=tmp_path / "sweep",
        tag=tag,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    [job] = job_dirs(tmp_path / "sweep")
    assert re.findall(r"epoch/it: (\d+/\d+),", _logs(job)) == ["0/0", "0/1", "1/0", "1/1"]


@pytest.mark.parametrize("mode", ["per_node", "per_rank"])
def test_command_environment_in_each_mode(mode, tmp_path, tag):
    script = tmp_path / "dump_env.py"
    script.write_text(DUMP_ENV)
    done = run_app(
        f"command='{PY} {script}'",
        f"command_mode={mode}",
        "num_nodes=2",
        "devices=2",
        sweep_dir=tmp_path / "sweep",
        tag=tag,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    [job] = job_dirs(tmp_path / "sweep")
    envs = {p.name: json.loads(p.read_text()) for p in job.glob("env.*.json")}
    hints = {"PL_TRAINER_NUM_NODES": "2", "PL_TRAINER_DEVICES": "2", "LT_NUM_NODES": "2", "LT_DEVICES": "2"}
    common = {"WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2", "NUM_NODES": "2", **hints}
    ports = {env.pop("MASTER_PORT") for env in envs.values()}
    assert len(ports) == 1
    if mode == "per_node":  # the framework inside creates the ranks: no RANK/LOCAL_RANK to mislead it
        assert envs == {f"env.node{n}.json": {**common, "NODE_RANK": str(n)} for n in (0, 1)}
    else:
        assert envs == {
            f"env.{r}.json": {**common, "NODE_RANK": str(r // 2), "RANK": str(r), "LOCAL_RANK": str(r % 2)}
            for r in range(4)
        }
    # a command replaces the recipe: no batch plan, and nothing of it in the environment
    assert (
        "batch      (none: a command chooses its own batch size)"
        in run_app(f"command='{PY} {script}'", "hydra.launcher.dry_run=true", sweep_dir=tmp_path / "dry").stdout
    )


def test_a_failing_node_fails_the_job_and_stops_the_other(tmp_path, tag):
    done = run_app(
        "command='if [ $NODE_RANK = 1 ]; then exit 3; fi; sleep 60'",
        "num_nodes=2",
        "devices=2",
        sweep_dir=tmp_path,
        tag=tag,
    )
    assert done.returncode != 0
    [result] = results(tmp_path)
    assert result["status"] == "FAILED" and result["duration_s"] < 30
    assert result["failure"]["node_rank"] == 1
    assert "exited with code 3" in result["failure"]["exception"]
    # a node's command failed, not a rank: the message says so
    assert "the command on node 1 raised CommandFailedError" in done.stderr
    assert "the other nodes were stopped" in done.stderr
    # a command's exit code is its whole story: one line in its log, none of mmt's own frames anywhere
    assert "Traceback" not in done.stdout + done.stderr and not result["failure"]["traceback"]
    log = (tmp_path / "0" / "logs" / "node1.log").read_text()
    assert log.splitlines()[-1] == "mmt: command 'if [ $NODE_RANK = 1 ]; then exit 3; fi; sleep 60' exited with code 3"


def test_processes_a_command_leaves_behind_are_stopped(tmp_path, tag):
    # `setsid` puts the sleeper in a session of its own, out of reach of the rank's process group
    done = run_app("command='setsid sleep 300 & echo started'", "num_nodes=2", sweep_dir=tmp_path, tag=tag)
    assert done.returncode == 0, done.stderr[-3000:]
    [job] = job_dirs(tmp_path)
    assert _logs(job).count("mmt: stopped 1 process(es) the command left running") == 2

    # the `tag` fixture fails the test if any process of it is still running


def test_a_timed_out_command_takes_its_torchrun_workers_with_it(tmp_path, tag):
    # torchrun's workers run in sessions of their own; the job's time limit must still end all of them
    command = f"{PY} -m torch.distributed.run --nnodes=1 --nproc-per-node=2 --master-port=0 --no-python sleep 300"
    done = run_app(
        f"command='{command}'",
        "num_nodes=2",
        "devices=2",
        "hydra.launcher.timeout_min=0.1",
        sweep_dir=tmp_path,
        tag=tag,
    )
    assert done.returncode != 0
    [result] = results(tmp_path)
    assert result["status"] == "TIMEOUT"


def test_the_topology_variables_are_the_launchers(tmp_path):
    done = run_app("command='true'", "+env.PL_TRAINER_DEVICES=8", sweep_dir=tmp_path)
    assert done.returncode != 0
    assert "Invalid env.PL_TRAINER_DEVICES=***: PL_TRAINER_DEVICES belongs to the rank contract" in done.stderr
    assert "HINT: drop it; use num_nodes/devices to change the topology" in done.stderr
