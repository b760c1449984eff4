"""TensorFlow, JAX and LitData through mmt, for real: the frameworks installed (scripts/setup_frameworks.sh), real
processes, real ports, on the local backend and on the SLURM test cluster. Nothing is mocked.

Each test needs its framework importable: without it the test skips, saying so, unless MMT_REQUIRE_FRAMEWORKS=1
(CI), where that is a failure. Tests on the cluster take the ``slurm_cluster`` fixture (marked ``slurm``; it skips
or, with MMT_REQUIRE_SLURM=1, fails where the cluster cannot run). The pure side (what each process gets, the port
rules): tests/unit/test_framework_env.py.
"""

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Dict, List

import pytest

from helpers.app import job_dirs, results, run_app
from helpers.paths import REPO

EXAMPLES = REPO / "examples" / "frameworks"
PY = sys.executable
# a worker imports TensorFlow in 10-20 s on two shared cores; the limit is far above, and the seed's snippet must
# fail well inside it
TF_LIMIT = ("hydra.launcher.timeout_min=5",)
LEGACY_KERAS = "+env.TF_USE_LEGACY_KERAS=1"  # Keras 3's model.fit fails under MultiWorkerMirroredStrategy


def _require(*modules: str) -> None:
    missing = [name for name in modules if importlib.util.find_spec(name) is None]
    if not missing:
        return
    why = f"{', '.join(missing)} not installed here (scripts/setup_frameworks.sh installs it)"
    if os.environ.get("MMT_REQUIRE_FRAMEWORKS") == "1":
        pytest.fail(f"MMT_REQUIRE_FRAMEWORKS=1 but {why}")
    pytest.skip(why)


@pytest.fixture
def tensorflow():
    _require("tensorflow", "tf_keras")


@pytest.fixture
def jax():
    _require("jax")


@pytest.fixture
def litdata():
    _require("litdata")


def _command(script: Path, *args: str) -> str:
    return "command='" + " ".join([PY, str(script), *args]) + "'"


def _logs(job: Path) -> str:
    return "".join(p.read_text(errors="replace") for p in sorted((job / "logs").glob("*.log")))


def _one_job(sweep: Path, done: subprocess.CompletedProcess) -> Path:
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    [job] = job_dirs(sweep)
    return job


# ------------------------------------------------------------------------------------------------ TensorFlow


def _trains_keras(sweep: Path, tag: str, *where: str, num_nodes: int, devices: int) -> None:
    done = run_app(
        _command(EXAMPLES / "keras_mwms.py"),
        "command_mode=per_rank",
        f"num_nodes={num_nodes}",
        f"devices={devices}",
        "hydra.launcher.framework=tensorflow",
        LEGACY_KERAS,
        *TF_LIMIT,
        *where,
        sweep_dir=sweep,
        tag=tag,
        timeout=420,
    )
    job = _one_job(sweep, done)
    world = num_nodes * devices
    # every worker finished, in one world, and the strategy kept their weights equal
    finished = re.findall(r"worker (\d+) of (\d+) done: loss ([\d.]+) -> ([\d.]+), weights (\w+)", _logs(job))
    assert sorted(int(w[0]) for w in finished) == list(range(world)), _logs(job)[-3000:]
    assert {int(w[1]) for w in finished} == {world}
    assert len({w[4] for w in finished}) == 1, finished
    assert all(float(last) < float(first) for _, _, first, last, _ in finished), finished
    assert results(sweep)[0]["status"] == "COMPLETED"


@pytest.mark.parametrize("num_nodes, devices", [(2, 1), (1, 2)])
def test_keras_trains_with_multi_worker_mirrored_strategy_locally(num_nodes, devices, tensorflow, tmp_path, tag):
    _trains_keras(tmp_path, tag, num_nodes=num_nodes, devices=devices)


def test_keras_trains_with_multi_worker_mirrored_strategy_on_slurm(tensorflow, slurm_cluster, tmp_path, tag):
    _trains_keras(tmp_path, tag, "cluster=slurm", num_nodes=2, devices=1)


def _snippet_fails_fast(sweep: Path, tag: str, *where: str) -> None:
    """The guide's snippet lists MASTER_ADDR:MASTER_PORT once per worker: every worker claims rank 0's address. The
    job must fail within seconds of TensorFlow starting, saying so, not wait for its time limit."""
    done = run_app(
        _command(EXAMPLES / "seed_tf_config.py"),
        "command_mode=per_rank",
        "num_nodes=2",
        "devices=1",
        "hydra.launcher.framework=tensorflow",
        *TF_LIMIT,
        *where,
        sweep_dir=sweep,
        tag=tag,
        timeout=420,
    )
    assert done.returncode != 0
    [result] = results(sweep)
    assert result["status"] == "FAILED", result
    said = result["failure"]["exception"]
    assert said.startswith("FrameworkAddressError: TF worker ") and "MASTER_PORT" in said, said
    assert "TF_CONFIG" in said and "HINT: delete the script's TF_CONFIG code" in said, said
    assert "\n" not in said
    assert said in done.stderr  # the launcher's own report names it too
    assert result["duration_s"] < 120, result["duration_s"]  # the time limit is 300 s


def test_the_guides_tf_config_snippet_fails_fast_naming_the_cause(tensorflow, tmp_path, tag):
    _snippet_fails_fast(tmp_path, tag)


def test_the_guides_tf_config_snippet_fails_fast_naming_the_cause_on_slurm(tensorflow, slurm_cluster, tmp_path, tag):
    _snippet_fails_fast(tmp_path, tag, "cluster=slurm")


def test_the_guides_snippet_in_a_job_that_does_not_say_it_is_tensorflow_fails_naming_the_key(tensorflow, tmp_path, tag):
    """The seed's snippet as a user copies it, without hydra.launcher.framework: mmt wrote no TF_CONFIG, and finds
    out only from the failure (TensorFlow could not start its gRPC server); it names the key that fixes it."""
    done = run_app(
        _command(EXAMPLES / "seed_tf_config.py"),
        "command_mode=per_rank",
        "num_nodes=2",
        "devices=1",
        *TF_LIMIT,
        sweep_dir=tmp_path,
        tag=tag,
        timeout=420,
    )
    assert done.returncode != 0
    [result] = results(tmp_path)
    assert result["status"] == "FAILED", result
    said = result["failure"]["exception"]
    assert said.startswith("FrameworkAddressError: the command runs TensorFlow with a TF_CONFIG it built itself"), said
    assert "HINT: set hydra.launcher.framework=tensorflow" in said and "\n" not in said, said
    assert said in done.stderr  # the launcher's own report names it too
    # far below the time limit (300 s); 40 s once on CI's loaded host, where two TensorFlow imports took most of it
    assert result["duration_s"] < 120, result["duration_s"]


# ------------------------------------------------------------------------------------------------ JAX


def _psum(sweep: Path, tag: str, *where: str, num_nodes: int, devices: int) -> None:
    done = run_app(
        _command(EXAMPLES / "jax_psum.py"),
        "command_mode=per_rank",
        f"num_nodes={num_nodes}",
        f"devices={devices}",
        "hydra.launcher.framework=jax",
        "hydra.launcher.timeout_min=5",
        *where,
        sweep_dir=sweep,
        tag=tag,
        timeout=300,
    )
    job = _one_job(sweep, done)
    world = num_nodes * devices
    said = re.findall(r"process (\d+) of (\d+): psum ([\d.]+) expected ([\d.]+) devices (\d+) ok=(\w+)", _logs(job))
    assert sorted(int(s[0]) for s in said) == list(range(world)), _logs(job)[-3000:]
    # every process put in its index + 1: the sum over all of them, seen by every one
    assert {(int(n), float(got), int(devs)) for _, n, got, _, devs, _ in said} == {
        (world, world * (world + 1) / 2, world)
    }


def test_jax_psum_across_processes_two_by_two_locally(jax, tmp_path, tag):
    _psum(tmp_path, tag, num_nodes=2, devices=2)


def test_jax_psum_across_nodes_on_slurm(jax, slurm_cluster, tmp_path, tag):
    _psum(tmp_path, tag, "cluster=slurm", num_nodes=2, devices=1)


# ------------------------------------------------------------------------------------------------ LitData

ITEMS = 64  # 16 chunks of 4: 4 chunks per rank of a 2 x 2 job


@pytest.fixture(scope="module")
def optimized(tmp_path_factory) -> Path:
    """A litdata.optimize'd dataset of ITEMS small generated items, made once for the module."""
    if importlib.util.find_spec("litdata") is None:
        return Path("/nonexistent")  # the test's own litdata fixture skips (or fails) first
    data = tmp_path_factory.mktemp("litdata") / "optimized"
    made = subprocess.run(
        [PY, str(EXAMPLES / "litdata_stream.py"), "--make", str(data), str(ITEMS)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert made.returncode == 0 and (data / "index.json").exists(), made.stdout[-2000:] + made.stderr[-2000:]
    return data


def _shards(sweep: Path, tag: str, data: Path, *where: str) -> None:
    done = run_app(
        _command(EXAMPLES / "litdata_stream.py", str(data)),
        "command_mode=per_rank",
        "num_nodes=2",
        "devices=2",
        "hydra.launcher.timeout_min=5",
        *where,
        sweep_dir=sweep,
        tag=tag,
        timeout=300,
    )
    job = _one_job(sweep, done)
    text = _logs(job)
    ranks: Dict[int, dict] = {}
    for line in re.findall(r"^litdata (\{.*\})$", text, re.M):
        got = json.loads(line)
        ranks[got["rank"]] = got
    assert sorted(ranks) == [0, 1, 2, 3], text[-3000:]
    for when in ("before", "after", "after_in_order"):  # built before and after init_process_group
        for epoch in range(2):
            shards: List[List[int]] = [ranks[r][when][epoch] for r in range(4)]
            assert all(shards), (when, epoch, shards)  # every rank got a share
            everything = sorted(i for shard in shards for i in shard)
            assert everything == list(range(ITEMS)), (when, epoch, shards)  # disjoint, and every item exactly once
    assert "litdata ok: 4 ranks" in text


def test_litdata_ranks_stream_disjoint_shards_of_every_item_locally(litdata, optimized, tmp_path, tag):
    _shards(tmp_path, tag, optimized)


def test_litdata_ranks_stream_disjoint_shards_of_every_item_on_slurm(litdata, optimized, slurm_cluster, tmp_path, tag):
    _shards(tmp_path, tag, optimized, "cluster=slurm")


# ------------------------------------------------------------------------------------------------ node addresses

# every rank writes what it got and what the addresses resolve to, where it runs
PROBE = """\
import json, os, socket
addrs = os.environ["MMT_NODE_ADDRS"].split(",")
out = dict(rank=int(os.environ["RANK"]), node=int(os.environ["NODE_RANK"]), addrs=addrs,
           own=os.environ["MMT_NODE_ADDR"], host=socket.gethostname(), master=os.environ["MASTER_ADDR"],
           resolved=[socket.gethostbyname(a) for a in addrs], tf=json.loads(os.environ["TF_CONFIG"]),
           global_rank=os.environ["GLOBAL_RANK"], nnodes=os.environ["NNODES"],
           threads=[os.environ.get(k) for k in ("OMP_NUM_THREADS", "TF_NUM_INTRAOP_THREADS", "TF_NUM_INTEROP_THREADS")])
with open(os.path.join(os.environ["MMT_JOB_DIR"], "addr.%d.json" % out["rank"]), "w") as handle:
    json.dump(out, handle)
"""


def _addresses(sweep: Path, tag: str, *where: str) -> List[dict]:
    probe = sweep.parent / "probe.py"
    probe.write_text(PROBE)
    done = run_app(
        _command(probe),
        "command_mode=per_rank",
        "num_nodes=2",
        "devices=2",
        "hydra.launcher.framework=tensorflow",
        *where,
        sweep_dir=sweep,
        tag=tag,
        timeout=240,
    )
    job = _one_job(sweep, done)
    seen = [json.loads((job / f"addr.{rank}.json").read_text()) for rank in range(4)]
    for rank, got in enumerate(seen):
        assert (got["global_rank"], got["nnodes"]) == (str(rank), "2")
        assert len(got["addrs"]) == 2 and got["own"] == got["addrs"][got["node"]] and got["master"] == got["addrs"][0]
        # TF_CONFIG: the same cluster on every rank, in rank order, each worker its own node's address and a port of
        # its own; the task is the rank itself
        workers = got["tf"]["cluster"]["worker"]
        assert workers == seen[0]["tf"]["cluster"]["worker"] and got["tf"]["task"] == {"type": "worker", "index": rank}
        assert [w.rsplit(":", 1)[0] for w in workers] == [got["addrs"][r // 2] for r in range(4)]
        assert len({w.rsplit(":", 1)[1] for w in workers}) == 4
        intra, inter = got["threads"][1:]
        assert intra == got["threads"][0] and inter == str(min(2, int(intra)))
    assert len({tuple(got["addrs"]) for got in seen}) == 1  # every rank sees the same list
    return seen


def test_every_node_address_in_node_order_locally(tmp_path, tag):
    seen = _addresses(tmp_path, tag)
    assert seen[0]["addrs"] == ["127.0.0.1", "127.0.0.1"]  # simulated nodes share this host


def test_every_node_address_in_node_order_on_slurm(slurm_cluster, tmp_path, tag):
    seen = _addresses(tmp_path, tag, "cluster=slurm")
    # the allocation's hosts, expanded, in node order; each resolves (inside the job) to its own host address
    addrs = seen[0]["addrs"]  # two of the test cluster's nodes, whichever SLURM gave the job
    assert len(set(addrs)) == 2 and all(addr.startswith("node") for addr in addrs), addrs
    assert [got["host"] for got in seen] == [addrs[0], addrs[0], addrs[1], addrs[1]]
    resolved = seen[0]["resolved"]  # the test cluster maps nodeN to 127.0.1.N: distinct host addresses
    assert resolved == [f"127.0.1.{addr.removeprefix('node')}" for addr in addrs]
    assert all(got["resolved"] == resolved for got in seen)


# ------------------------------------------------------------------------------------------------ the guard

LISTEN_ON = """\
import socket, sys, time
sock = socket.socket()
sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
sock.bind(("127.0.0.1", int(sys.argv[1])))
sock.listen()
print("listening", flush=True)
time.sleep(60)
"""


def test_the_guard_finds_a_misplaced_server_in_its_own_tree_and_in_another_rank_of_the_job(tmp_path):
    """What a framework job's process reads from /proc: where its own command listens, and (when its command has
    failed) where the job's other processes on this host listen, found by the job's tag (no framework needed)."""
    import socket

    from mmt.core.ports import hold_port
    from mmt.planning.environment import Rendezvous, process_env
    from mmt.planning.machine import UNSPECIFIED_MACHINE
    from mmt.planning.plan import JobPlan
    from mmt.worker.command import ListenerGuard

    job_id = f"guard-{os.getpid()}"
    plan = JobPlan(
        num=0,
        name="g-0",
        job_id=job_id,
        overrides=(),
        job_dir=str(tmp_path),
        num_nodes=2,
        devices=1,
        machine=UNSPECIFIED_MACHINE,
        image=None,
        command="x",
        command_mode="per_rank",
        env={},
        timeout_s=60.0,
        framework="tensorflow",
    )
    held = [hold_port("127.0.0.1") for _ in range(3)]  # MASTER_PORT and a port for each worker, as mmt holds them
    ports = [sock.getsockname()[1] for sock in held]
    rendezvous = Rendezvous("127.0.0.1", ports[0], node_addrs=("127.0.0.1",) * 2, framework_ports=tuple(ports[1:]))
    envs = [
        process_env(
            plan,
            plan.place(i),
            rendezvous=rendezvous,
            inherited=dict(os.environ),
            copied={},
            cores_per_node=1,
            python=None,
        )
        for i in range(2)
    ]
    assert ListenerGuard(envs[1], 1).check_own() is None  # nothing of this process's listens anywhere claimed
    # "rank 0" runs the guide's snippet: its TensorFlow server listens on MASTER_PORT
    rank0 = subprocess.Popen([PY, "-c", LISTEN_ON, str(ports[0])], env=envs[0], stdout=subprocess.PIPE, text=True)
    try:
        assert rank0.stdout.readline().strip() == "listening"
        said = ListenerGuard(envs[1], 1).check_job()  # rank 1, its own command failed: who else is misplaced?
        assert said is not None and said.startswith(
            f"TF worker 0 listens on MASTER_PORT {ports[0]} instead of its own port {ports[1]}"
        ), said
        rank0.kill()
        rank0.wait()
        # listening on its own TF_CONFIG port is fine; on another worker's, it is named
        with socket.socket() as mine:
            mine.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            mine.bind(("127.0.0.1", ports[2]))
            mine.listen()
            assert ListenerGuard(envs[1], 1).check_own() is None
            said = ListenerGuard(envs[0], 0).check_own()
            assert said is not None and said.startswith(
                f"TF worker 0 listens on port {ports[2]}, which mmt holds for TF worker 1's own port"
            ), said
    finally:
        rank0.kill()
        rank0.wait()
        for sock in held:
            sock.close()
