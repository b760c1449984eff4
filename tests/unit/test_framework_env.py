"""What mmt writes for other frameworks, and how it holds and checks their ports (issue 18), with no process started:
every node's address, LitData's names, TF_CONFIG, JAX's coordinator, TensorFlow's threads, the SLURM port windows,
and the rule that names a misplaced framework server. (Running the frameworks: tests/e2e/test_frameworks.py.)"""

import hashlib
import json
import os
import re

import pytest

from helpers.config import compose_train
from helpers.paths import REPO
from helpers.plans import local_plan
from mmt.backends.slurm.nodes import expand_nodelist
from mmt.backends.slurm.task import (
    FRAMEWORK_PORT_BASE,
    FRAMEWORK_PORT_WINDOW,
    PORT_BASE,
    PORT_SPAN,
    framework_port,
    master_port,
)
from mmt.core.errors import ConfigError
from mmt.core.rank_env import RankInfo, misplaced_listener, port_claims, process_index, scrubbed
from mmt.planning.dryrun import render
from mmt.planning.environment import Rendezvous, process_env
from mmt.planning.plan import JobPlan, Limits, plan_job
from mmt.planning.validate import env_vars

SEED_DOC = REPO.parent / "shared" / "seed" / "multi-node-training.md"
SNIPPET = REPO / "examples" / "frameworks" / "seed_tf_config.py"


def _plan(num_nodes=2, devices=2, framework="none", command="python x.py", mode="per_rank", env=None) -> JobPlan:
    return local_plan(
        num_nodes=num_nodes, devices=devices, command=command, command_mode=mode, env=env or {}, framework=framework
    )


def _envs(plan: JobPlan, addrs=("hostA", "hostB"), ports=None, inherited=None, cores=8):
    ports = tuple(range(31000, 31000 + plan.framework_port_count)) if ports is None else ports
    rendezvous = Rendezvous("hostA", 12345, node_addrs=tuple(addrs[: plan.num_nodes]), framework_ports=ports)
    return [
        process_env(
            plan,
            plan.place(i),
            rendezvous=rendezvous,
            inherited=inherited or {},
            copied={},
            cores_per_node=cores,
            python=None,
        )
        for i in range(plan.process_count)
    ]


# ------------------------------------------------------------------------------------------ every node's address


def test_every_node_address_in_node_order_and_each_nodes_own():
    envs = _envs(_plan())
    assert {e["MMT_NODE_ADDRS"] for e in envs} == {"hostA,hostB"}
    assert [e["MMT_NODE_ADDR"] for e in envs] == ["hostA", "hostA", "hostB", "hostB"]
    assert RankInfo.from_env(envs[3]).node_addrs == ("hostA", "hostB")
    assert RankInfo.from_env({}).node_addrs == ()


def test_without_node_addresses_every_node_is_the_master_address():
    plan = _plan()
    env = process_env(
        plan,
        plan.place(2),
        rendezvous=Rendezvous("127.0.0.1", 1),
        inherited={},
        copied={},
        cores_per_node=2,
        python=None,
    )
    assert (env["MMT_NODE_ADDRS"], env["MMT_NODE_ADDR"]) == ("127.0.0.1,127.0.0.1", "127.0.0.1")


@pytest.mark.parametrize(
    "nodelist, hosts",
    [
        ("node[1-2]", ["node1", "node2"]),
        ("node5", ["node5"]),
        ("gpu[01-03,7],login1", ["gpu01", "gpu02", "gpu03", "gpu7", "login1"]),
        ("a[1-2]b[3-4]", ["a1b3", "a1b4", "a2b3", "a2b4"]),
        ("n1,n2", ["n1", "n2"]),
        ("rack1-n[009-011]", ["rack1-n009", "rack1-n010", "rack1-n011"]),
    ],
)
def test_slurm_node_lists_expand_in_order_where_scontrol_cannot_run(nodelist, hosts):
    assert expand_nodelist(nodelist) == hosts


# ------------------------------------------------------------------------------------------ LitData's names


def test_litdata_reads_global_rank_where_rank_is_set_and_nnodes_everywhere():
    per_rank = _envs(_plan())
    assert [e["GLOBAL_RANK"] for e in per_rank] == [e["RANK"] for e in per_rank] == ["0", "1", "2", "3"]
    assert {e["NNODES"] for e in per_rank} == {"2"}
    per_node = _envs(_plan(mode="per_node"))
    assert all("GLOBAL_RANK" not in e and "RANK" not in e for e in per_node)
    assert {e["NNODES"] for e in per_node} == {"2"}


def test_inherited_framework_and_mpi_variables_are_scrubbed():
    inherited = {
        "GLOBAL_RANK": "7",
        "NNODES": "9",
        "TF_CONFIG": "{}",
        "JAX_COORDINATOR_ADDRESS": "x:1",
        "JAX_NUM_PROCESSES": "9",
        "JAX_PROCESS_ID": "8",
        "JAX_LOCAL_DEVICE_IDS": "3",
        "JAX_COORDINATOR_PORT": "1",
        "OMPI_COMM_WORLD_RANK": "5",
        "PMI_RANK": "5",
        "PMIX_RANK": "5",
        "MMT_NODE_ADDRS": "a,b,c",
        "HOME": "/root",
    }
    assert scrubbed(inherited) == {"HOME": "/root"}
    env = _envs(_plan(), inherited=inherited)[1]
    assert (env["GLOBAL_RANK"], env["NNODES"], env["MMT_NODE_ADDRS"]) == ("1", "2", "hostA,hostB")
    assert not {"TF_CONFIG", "JAX_COORDINATOR_ADDRESS", "OMPI_COMM_WORLD_RANK", "PMI_RANK"} & set(env)


@pytest.mark.parametrize(
    "name, said",
    [
        ("GLOBAL_RANK", "belongs to the rank contract"),
        ("NNODES", "belongs to the rank contract"),
        ("TF_CONFIG", "hydra.launcher.framework=tensorflow"),
        ("JAX_COORDINATOR_ADDRESS", "or jax"),
        ("MMT_NODE_ADDRS", "belongs to the rank contract"),
        ("OMPI_COMM_WORLD_RANK", "OMPI_* variables are removed"),
    ],
)
def test_a_user_may_not_set_them_through_env(name, said):
    with pytest.raises(ConfigError, match=re.escape(said)):
        env_vars("env", {name: "1"})


# ------------------------------------------------------------------------------------------ TensorFlow


def test_tf_config_gives_every_worker_its_own_host_and_port_in_rank_order_the_same_on_every_rank():
    envs = _envs(_plan(framework="tensorflow"))
    configs = [json.loads(e["TF_CONFIG"]) for e in envs]
    workers = ["hostA:31000", "hostA:31001", "hostB:31002", "hostB:31003"]
    assert all(c["cluster"] == {"worker": workers} for c in configs)
    assert [c["task"] for c in configs] == [{"type": "worker", "index": i} for i in range(4)]
    assert [process_index(e) for e in envs] == [0, 1, 2, 3]


def test_tf_config_per_node_is_one_worker_per_node_and_refused_with_more_devices(tmp_path):
    envs = _envs(_plan(devices=1, framework="tensorflow", mode="per_node"))
    assert [json.loads(e["TF_CONFIG"])["cluster"]["worker"] for e in envs] == [["hostA:31000", "hostB:31001"]] * 2
    config = compose_train(
        "recipe=probe", "command='python x.py'", "num_nodes=2", "devices=2", "hydra.launcher.framework=tensorflow"
    )
    with pytest.raises(ConfigError, match=r"hydra.launcher.framework='tensorflow'.*HINT: add command_mode=per_rank"):
        plan_job(
            config.hydra.launcher,
            num=0,
            name="t-0",
            job_id="u-0",
            overrides=[],
            job_dir=str(tmp_path),
            limits=Limits(64, 64, 64, "test"),
            launcher_env=os.environ,
        )


def test_the_framework_key_is_read_per_job_and_checked(tmp_path):
    def plan(*overrides):
        config = compose_train("recipe=probe", *overrides)
        return plan_job(
            config.hydra.launcher,
            num=0,
            name="t-0",
            job_id="u-0",
            overrides=list(overrides),
            job_dir=str(tmp_path),
            limits=Limits(64, 64, 64, "test"),
            launcher_env=os.environ,
        )

    assert plan().framework == "none" and plan().framework_port_count == 0
    assert plan("num_nodes=2", "devices=2", "hydra.launcher.framework=tensorflow").framework_port_count == 4
    assert plan("num_nodes=2", "hydra.launcher.framework=jax").framework_port_count == 1
    with pytest.raises(
        ConfigError,
        match=r"Invalid hydra.launcher.framework='tf': expected one of none, tensorflow, "
        r"jax",
    ):
        plan("hydra.launcher.framework=tf")


def test_tensorflow_threads_follow_openmp_unless_the_user_set_them():
    env = _envs(_plan(devices=2, framework="tensorflow"), cores=8)[0]
    assert (env["OMP_NUM_THREADS"], env["TF_NUM_INTRAOP_THREADS"], env["TF_NUM_INTEROP_THREADS"]) == ("4", "4", "2")
    env = _envs(_plan(devices=8, framework="tensorflow"), cores=8)[0]
    assert (env["TF_NUM_INTRAOP_THREADS"], env["TF_NUM_INTEROP_THREADS"]) == ("1", "1")
    mine = _envs(_plan(framework="tensorflow", env={"TF_NUM_INTEROP_THREADS": "6", "OMP_NUM_THREADS": "3"}))[0]
    assert (mine["TF_NUM_INTRAOP_THREADS"], mine["TF_NUM_INTEROP_THREADS"]) == ("3", "6")
    assert "TF_NUM_INTRAOP_THREADS" not in _envs(_plan())[0] and "TF_CONFIG" not in _envs(_plan())[0]


# ------------------------------------------------------------------------------------------ JAX


def test_jax_gets_process_0s_coordinator_and_its_process_id_per_rank_and_per_node():
    envs = _envs(_plan(framework="jax"), ports=(31555,))
    assert {e["JAX_COORDINATOR_ADDRESS"] for e in envs} == {"hostA:31555"}
    assert [(e["JAX_NUM_PROCESSES"], e["JAX_PROCESS_ID"], e["JAX_LOCAL_DEVICE_IDS"]) for e in envs] == [
        ("4", "0", "0"),
        ("4", "1", "1"),
        ("4", "2", "0"),
        ("4", "3", "1"),
    ]
    per_node = _envs(_plan(framework="jax", mode="per_node"), ports=(31555,))
    assert [(e["JAX_NUM_PROCESSES"], e["JAX_PROCESS_ID"]) for e in per_node] == [("2", "0"), ("2", "1")]
    assert all("JAX_LOCAL_DEVICE_IDS" not in e for e in per_node)  # one process sees all of its node's devices
    assert "JAX_COORDINATOR_ADDRESS" not in _envs(_plan())[0]


def test_an_ipv6_address_is_bracketed():
    plan = _plan(num_nodes=1, devices=1, framework="jax")
    [env] = _envs(plan, addrs=("::1",), ports=(31000,))
    assert env["JAX_COORDINATOR_ADDRESS"] == "[::1]:31000"


# ------------------------------------------------------------------------------------------ ports on SLURM


def test_slurm_framework_ports_neighbouring_jobs_never_share_and_a_jobs_are_distinct():
    for job in range(1, 400):  # ports repeat every 346 job ids: this covers every residue
        mine = {framework_port(str(job), i) for i in range(FRAMEWORK_PORT_WINDOW)}
        assert len(mine) == FRAMEWORK_PORT_WINDOW
        for near in range(job + 1, job + 50):
            assert not mine & {framework_port(str(near), i) for i in range(FRAMEWORK_PORT_WINDOW)}, (job, near)
        # below Linux's ephemeral range, and clear of every MASTER_PORT
        assert min(mine) >= FRAMEWORK_PORT_BASE >= PORT_BASE + PORT_SPAN and max(mine) < 32768
        assert master_port(str(job)) < FRAMEWORK_PORT_BASE


def test_slurm_refuses_more_tensorflow_workers_per_node_than_its_port_window():
    from mmt.backends.slurm.backend import SlurmBackend

    backend = SlurmBackend.watcher()  # default settings: nothing is submitted
    problems = backend.problems(_plan(num_nodes=1, devices=FRAMEWORK_PORT_WINDOW + 1, framework="tensorflow"))
    assert any("at most 8 workers per node" in str(p) for p in problems), problems


# ------------------------------------------------------------------------------------------ a misplaced server


def test_a_tensorflow_worker_on_master_port_is_named_as_the_guides_snippet():
    env = _envs(_plan(framework="tensorflow"))[1]
    assert port_claims(env) == {31000 + i: port_claims(env)[31000 + i] for i in range(4)}
    assert misplaced_listener(env, {1: [31001], 0: [31000, 45555]}) is None  # own ports, and anything unclaimed
    said = misplaced_listener(env, {0: [31000], 1: [12345]})
    assert said.startswith("TF worker 1 listens on MASTER_PORT 12345 instead of its own port 31001")
    assert "\n" not in said
    assert "HINT: delete the script's TF_CONFIG code" in said
    said = misplaced_listener(env, {2: [31000]})
    assert said.startswith("TF worker 2 listens on port 31000, which mmt holds for TF worker 0's own port"), said


def test_jax_rules_are_about_the_coordinator_only():
    env = _envs(_plan(framework="jax"), ports=(31555,))[2]
    assert misplaced_listener(env, {0: [31555, 12345], 1: [40000]}) is None  # process 0 may use MASTER_PORT too
    assert misplaced_listener(env, {3: [31555]}).startswith(
        "JAX process 3 listens on port 31555, which mmt holds for JAX's coordinator"
    )
    assert port_claims(_envs(_plan())[0]) == {}  # no framework: no rule at all


# ------------------------------------------------------------------------------------------ dry run, the snippet


def test_the_dry_run_shows_the_framework_variables_with_placeholders():
    text = render(_plan(devices=1, framework="tensorflow"), [])
    assert "MMT_NODE_ADDRS=<node0>,<node1>" in text and "NNODES=2" in text
    assert (
        'TF_CONFIG={"cluster":{"worker":["<node0>:<port0>","<node1>:<port1>"]},"task":{"type":"worker","index":1}}'
        in text
    )
    assert "framework  tensorflow: <nodeN> is node N's address" in text


def test_the_snippet_example_is_the_guides_code_plus_its_missing_import():
    text = SNIPPET.read_text()
    header, body = text.split("import json\n", 1)
    assert all(line.startswith("#") for line in header.splitlines())
    assert hashlib.sha256(body.encode()).hexdigest() == (
        "27a7d70a3c27352212ca49ce1c2dd84126b58b754518d95943f3dea1be072deb"
    )
    assert "json" not in body.split("os.environ['TF_CONFIG']")[0]  # the guide uses json without importing it
    if SEED_DOC.exists():
        assert body in SEED_DOC.read_text()
