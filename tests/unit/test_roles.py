"""Jobs with roles (roles.<name>.*), planned from train.py's composed config: each role's own world, the primary
first, every process's rank contract in its role's numbering, the roles' variables; refusals in one line each,
before anything starts; and a job without roles exactly as before."""

import json

import pytest

from helpers.plans import planned
from mmt.core.errors import ConfigError
from mmt.planning import dryrun
from mmt.planning.environment import Rendezvous, RoleSite, role_process_env, roles_document

TRAINER_SCORER = [
    "+roles.trainer.num_nodes=2",
    "+roles.trainer.devices=2",
    "+roles.scorer.num_nodes=1",
    "+roles.scorer.command='python score.py'",
    "+roles.scorer.command_mode=per_rank",
]


def test_roles_primary_first_each_its_own_world(tmp_path):
    # the scorer is listed first on the command line: the trainer (primary by its name) still comes first
    plan = planned(TRAINER_SCORER[2:] + TRAINER_SCORER[:2], tmp_path)
    assert [r.name for r in plan.roles] == ["trainer", "scorer"]
    trainer, scorer = plan.roles
    assert trainer.primary and not scorer.primary and scorer.early_exit == "fail"
    assert (trainer.num_nodes, trainer.devices, trainer.command) == (2, 2, None)
    assert (scorer.num_nodes, scorer.devices, scorer.command) == (1, 1, "python score.py")
    assert plan.num_nodes == 3 and plan.process_count == 5 and plan.world_size == 5
    assert list(trainer.indices) == [0, 1, 2, 3] and list(scorer.indices) == [4]
    assert list(plan.node_indices(1)) == [2, 3] and list(plan.node_indices(2)) == [4]
    assert plan.topology == "trainer 2 x 2 + scorer 1 x 1"
    # process 4 is the scorer's rank 0 of a world of 1, on its node 0
    place = plan.place(4)
    assert (place.rank, place.node_rank, place.world_size) == (0, 0, 1)
    assert plan.describe_process(4) == "role scorer rank 0 (node 0)"
    assert plan.log_path(3) == tmp_path / "logs" / "trainer" / "node1.rank3.log"
    assert plan.log_path(4) == tmp_path / "logs" / "scorer" / "node0.rank0.log"
    # the recipe's batch plan is the trainer's world (4 ranks), and only the trainer gets it
    assert plan.batch is not None and plan.for_role(trainer).batch is plan.batch
    assert plan.for_role(scorer).batch is None


def test_each_process_gets_its_roles_contract_and_every_roles_address(tmp_path):
    plan = planned(TRAINER_SCORER, tmp_path)
    sites = {
        "trainer": RoleSite(Rendezvous("10.0.0.1", 5000, node_addrs=("10.0.0.1", "10.0.0.2")), 5001),
        "scorer": RoleSite(Rendezvous("10.0.0.3", 6000, node_addrs=("10.0.0.3",)), 6001),
    }
    roles_file = str(tmp_path / "roles.json")

    def env(index: int) -> dict:
        return role_process_env(
            plan, index, sites=sites, roles_file=roles_file, inherited={}, copied={}, cores_per_node=2, python=None
        )

    rank3, scorer = env(3), env(4)
    assert {k: rank3[k] for k in ("RANK", "WORLD_SIZE", "NODE_RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")} == {
        "RANK": "3",
        "WORLD_SIZE": "4",
        "NODE_RANK": "1",
        "LOCAL_RANK": "1",
        "MASTER_ADDR": "10.0.0.1",
        "MASTER_PORT": "5000",
    }
    assert {k: scorer[k] for k in ("RANK", "WORLD_SIZE", "NODE_RANK", "MASTER_ADDR", "MASTER_PORT")} == {
        "RANK": "0",
        "WORLD_SIZE": "1",
        "NODE_RANK": "0",
        "MASTER_ADDR": "10.0.0.3",
        "MASTER_PORT": "6000",
    }
    for own, role in ((rank3, "trainer"), (scorer, "scorer")):
        assert own["MMT_ROLE"] == role and own["MMT_ROLES"] == "trainer,scorer"
        assert own["MMT_ROLE_TRAINER_ADDRS"] == "10.0.0.1,10.0.0.2" and own["MMT_ROLE_TRAINER_PORT"] == "5001"
        assert own["MMT_ROLE_SCORER_ADDRS"] == "10.0.0.3" and own["MMT_ROLE_SCORER_PORT"] == "6001"
        assert own["MMT_ROLES_FILE"] == roles_file
    assert "MMT_GLOBAL_BATCH_SIZE" in rank3 and "MMT_GLOBAL_BATCH_SIZE" not in scorer
    document = json.loads(json.dumps(roles_document(plan, sites)))
    assert document["primary"] == "trainer"
    assert document["roles"]["scorer"] == {
        "primary": False,
        "num_nodes": 1,
        "devices": 1,
        "world_size": 1,
        "per_node": False,
        "addrs": ["10.0.0.3"],
        "port": 6001,
        "master_addr": "10.0.0.3",
        "master_port": 6000,
    }


def test_a_job_without_roles_is_planned_as_before(tmp_path):
    plan = planned(["num_nodes=2", "devices=2"], tmp_path)
    assert plan.roles == () and plan.process_count == 4 and plan.topology == "2 x 2"
    assert plan.log_path(3) == tmp_path / "logs" / "node1.rank3.log"
    assert plan.describe_process(3) == "rank 3 (node 1)"


def test_one_role_named_primary_and_a_sweepable_count(tmp_path):
    plan = planned(
        ["+roles.evaluator.num_nodes=1", "+roles.learner.primary=true", "+roles.learner.num_nodes=4"], tmp_path
    )
    assert [(r.name, r.num_nodes, r.primary) for r in plan.roles] == [("learner", 4, True), ("evaluator", 1, False)]


def test_dry_run_shows_each_roles_nodes_command_and_environment(tmp_path):
    plan = planned([*TRAINER_SCORER, "+roles.scorer.env.SCORER_TOKEN=hunter2"], tmp_path)
    text = dryrun.render(plan, [])
    assert "topology   trainer 2 x 2 + scorer 1 x 1 = 3 nodes, 5 ranks" in text
    assert "role trainer (primary: the job ends when it ends): 2 nodes x 2 devices = 4 ranks on cpu: 4 vCPU" in text
    assert "role scorer (early_exit=fail): 1 nodes x 1 devices = 1 ranks on cpu: 4 vCPU" in text
    assert ", runs 'python score.py' once per rank" in text
    assert "MMT_ROLE_SCORER_ADDRS=<scorer0>" in text and "MMT_ROLE_TRAINER_ADDRS=<trainer0>,<trainer1>" in text
    assert "SCORER_TOKEN=***" in text and "hunter2" not in text


REFUSED = [
    (
        ["+roles.trainer.primary=true", "+roles.scorer.primary=true"],
        "Invalid roles.scorer.primary=True: role 'trainer' is primary already",
    ),
    (["+roles.trainer.num_nodes=0"], "Invalid roles.trainer.num_nodes=0: expected a whole number >= 1"),
    (["+roles.a.num_nodes=1", "+roles.b.num_nodes=1"], "Invalid roles='a, b': no role is primary"),
    (["+roles.Trainer.num_nodes=1"], "Invalid roles.Trainer='Trainer': a role's name is lower-case letters"),
    (["+roles.trainer.nodes=2"], "Invalid roles.trainer.nodes=2: not a key of a role"),
    (["+roles.scorer.early_exit=maybe", "+roles.trainer.num_nodes=1"], "Invalid roles.scorer.early_exit='maybe'"),
    (["+roles.trainer.command=''"], "Invalid roles.trainer.command=''"),
    (["+roles.trainer.env.RANK=3"], "Invalid roles.trainer.env"),
    (["+roles.trainer.num_nodes=1", "+roles.scorer.num_nodes=1", "hydra.launcher.framework=jax"], "framework"),
]


@pytest.mark.parametrize("overrides, message", REFUSED, ids=[" ".join(c[0]) for c in REFUSED])
def test_refused_in_one_line(overrides, message, tmp_path):
    with pytest.raises(ConfigError) as raised:
        planned(overrides, tmp_path)
    assert message in str(raised.value)
    assert "\n" not in str(raised.value)
    assert not tmp_path.exists() or not any(tmp_path.iterdir())  # nothing written


def test_a_backend_without_roles_refuses_them(tmp_path):
    """A backend of another package runs no roles unless its class says so: one line, naming the roles."""
    from mmt.backends.base import roles_problems

    class Elsewhere:  # what roles_problems reads of a backend
        name, runs_roles = "elsewhere", False

    plan = planned(TRAINER_SCORER, tmp_path)
    (problem,) = roles_problems(Elsewhere(), plan)  # type: ignore[arg-type]
    assert str(problem).startswith("Invalid roles='trainer, scorer': cluster=elsewhere does not run a job with roles")
    Elsewhere.runs_roles = True
    assert roles_problems(Elsewhere(), plan) == []  # type: ignore[arg-type]


def test_a_role_may_have_its_own_machine_composed_into_it(tmp_path):
    plan = planned([*TRAINER_SCORER, "+machine@roles.scorer.machine=cpu_small"], tmp_path)
    trainer, scorer = plan.roles
    assert (trainer.machine.name, scorer.machine.name, plan.machine.name) == ("cpu", "cpu_small", "cpu")
    hours = plan.timeout_s / 3600
    expected = (2 * trainer.machine.price_per_hour + scorer.machine.price_per_hour) * hours
    assert plan.cost_estimate() == pytest.approx(expected)
    assert "(trainer 2 x $0.19/h + scorer 1 x $0.08/h)" in dryrun.render(plan, [])
    with pytest.raises(ConfigError, match=r"Invalid roles.scorer.machine='cpu_small': expected a machine catalogue"):
        planned([*TRAINER_SCORER, "+roles.scorer.machine=cpu_small"], tmp_path)


def test_on_slurm_one_heterogeneous_job_a_component_per_role(tmp_path):
    """The sbatch script (rendered as the dry run shows it; no cluster needed): the primary's nodes first, then a
    component per role with its own nodes and its machine's CPUs, one srun step over every component whose task
    logs are named by the leader's id (a later component's own %j dir does not exist)."""
    from mmt.backends.slurm.sbatch import SlurmSettings, render_script
    from mmt.core.jobdir import JobDir

    plan = planned([*TRAINER_SCORER, "+machine@roles.scorer.machine=cpu_small"], tmp_path, cluster="slurm")
    settings = SlurmSettings.for_watching()
    script = render_script(plan, settings, str(tmp_path), "mmt-x", JobDir(tmp_path).attempt("a"))
    header = [line for line in script.splitlines() if line.startswith("#SBATCH")]
    split = header.index("#SBATCH hetjob")
    assert "#SBATCH --nodes=2" in header[:split] and "#SBATCH --cpus-per-task=4" in header[:split]
    assert header[split + 1 :] == [
        "#SBATCH --nodes=1",
        "#SBATCH --ntasks-per-node=1",
        "#SBATCH --cpus-per-task=2",
        "#SBATCH --time=60",
    ]
    (srun,) = [line for line in script.splitlines() if line.startswith("srun ")]
    first, second = srun[len("srun ") :].split(" : ")
    assert "--het-group=0 " in first and "--het-group=1 " in second
    for component in (first, second):  # srun's options before a ':' are that component's: the shared ones in each
        assert "--kill-on-bad-exit=1" in component and "%j" not in component and '"$SLURM_JOB_ID"' in component
        assert component.endswith(f"-u -m mmt.backends.slurm.task {JobDir(tmp_path).attempt('a').cluster_task}")
    with pytest.raises(ConfigError, match=r"Invalid hydra.launcher.tasks='per_rank': a job with roles"):
        planned([*TRAINER_SCORER, "hydra.launcher.tasks=per_rank"], tmp_path, cluster="slurm")


def test_each_role_may_have_its_own_image_on_slurm_each_component_enters_its_own(tmp_path):
    """Images per role (pyxis is mocked here: no pyxis on this host, so the script is checked, not run): the job's
    image is every role's default, a role's own replaces it, ``image: null`` runs the role in this environment; each
    srun component enters its role's image; SLURM's OCI containers refuse roles' images in one line."""
    import sys
    from dataclasses import replace

    from mmt.backends.slurm.sbatch import SlurmSettings, render_script
    from mmt.core.jobdir import JobDir

    overrides = [*TRAINER_SCORER, "image=nvcr.io/nvidia/pytorch:24.05-py3", "+roles.scorer.image=vllm/vllm:0.6"]
    plan = planned(overrides, tmp_path, cluster="slurm")
    assert [role.image for role in plan.roles] == ["nvcr.io/nvidia/pytorch:24.05-py3", "vllm/vllm:0.6"]
    assert plan.images == ("nvcr.io/nvidia/pytorch:24.05-py3", "vllm/vllm:0.6")
    assert "    image vllm/vllm:0.6" in dryrun.render(plan, [])
    script = render_script(plan, SlurmSettings.for_watching(), str(tmp_path), "mmt-x", JobDir(tmp_path).attempt("a"))
    (srun,) = [line for line in script.splitlines() if line.startswith("srun ")]
    first, second = srun[len("srun ") :].split(" : ")
    assert "--container-image=nvcr.io/nvidia/pytorch:24.05-py3" in first and "vllm" not in first
    assert "--container-image=vllm/vllm:0.6" in second and "pytorch" not in second
    assert " python3 -u -m mmt.backends.slurm.task " in first and " python3 -u -m mmt.backends.slurm.task " in second
    # apptainer: each component's task runs its role's image through the wrapper
    apptainer = replace(SlurmSettings.for_watching(), container_runtime="apptainer")
    script = render_script(plan, apptainer, str(tmp_path), "mmt-x", JobDir(tmp_path).attempt("a"))
    (srun,) = [line for line in script.splitlines() if line.startswith("srun ")]
    first, second = srun[len("srun ") :].split(" : ")
    assert " nvcr.io/nvidia/pytorch:24.05-py3 python3 -u -m mmt" in first and "apptainer exec" in first
    assert " vllm/vllm:0.6 python3 -u -m mmt" in second and "--container-image" not in srun
    # a role in this environment: no container for its component, this interpreter
    plan = planned([*overrides[:-1], "+roles.scorer.image=null"], tmp_path, cluster="slurm")
    assert [role.image for role in plan.roles] == ["nvcr.io/nvidia/pytorch:24.05-py3", None]
    script = render_script(plan, SlurmSettings.for_watching(), str(tmp_path), "mmt-x", JobDir(tmp_path).attempt("a"))
    (srun,) = [line for line in script.splitlines() if line.startswith("srun ")]
    first, second = srun[len("srun ") :].split(" : ")
    assert "--container-image" in first and "--container-image" not in second and sys.executable in second
    with pytest.raises(ConfigError) as raised:
        planned([*overrides, "hydra.launcher.container_runtime=oci"], tmp_path, cluster="slurm")
    assert str(raised.value).startswith("Invalid roles.trainer.image='nvcr.io/nvidia/pytorch:24.05-py3': a job with")
    assert "\n" not in str(raised.value)


def test_ray_refuses_a_roles_image_naming_it(tmp_path):
    with pytest.raises(ConfigError) as raised:
        planned([*TRAINER_SCORER, "+roles.scorer.image=vllm/vllm:0.6"], tmp_path, cluster="ray")
    assert str(raised.value).startswith("Invalid roles.scorer.image='vllm/vllm:0.6': cluster=ray runs every node")


def test_a_heterogeneous_jobs_components_are_the_job_by_its_leaders_id():
    """squeue lists a heterogeneous job as one row per component (``1814+0``, ``1814+1``): the job is its leader's
    id, in the first component's state (where its batch script runs); without this it was GONE at once."""
    from mmt.backends.slurm.queue import job_ids_in, parse_squeue

    assert job_ids_in("1814+0") == ["1814"] and job_ids_in("1814+1") == []
    states = parse_squeue("1814+0|RUNNING|0|None|\n1814+1|COMPLETING|0|None|\n1815|PENDING|0|Resources|\n")
    assert {job: state.state for job, state in states.items()} == {"1814": "RUNNING", "1815": "PENDING"}


def test_a_job_with_roles_succeeded_when_its_primary_did_and_the_rest_ended_or_were_stopped(tmp_path):
    """A non-primary role's node that had not reached its task when the primary ended (its agent imported the
    preload on a loaded host) is stopped by its agent: it leaves an exit record, stopped, and no done marker. The
    job completed all the same (Ray's conclusion said "its node agents ended without a record of why" before);
    one that failed by itself still fails it."""
    from mmt.core.jobdir import Attempt
    from mmt.records.outcome import all_succeeded
    from mmt.records.schema import ExitRecord

    plan = planned(TRAINER_SCORER, tmp_path / "job")
    attempt = Attempt(tmp_path / "attempt")
    attempt.dir.mkdir(parents=True)
    for index in range(4):
        attempt.write_done(index, 0)
    attempt.primary_return.write_bytes(b"")
    ExitRecord(code=-9, stopped=True).write(attempt.exit_file(4))
    assert all_succeeded(plan, attempt)
    ExitRecord(code=3, stopped=False).write(attempt.exit_file(4))
    assert not all_succeeded(plan, attempt)
