"""cluster=ray's pure side: its settings (each bad value one line naming the key), the placement check that refuses
a job the cluster can never hold, how a run is concluded from its records, the task file and the rank environment
an actor hands on. No Ray, no process, no network: tests/e2e/test_ray*.py run the real cluster."""

import os
import pickle
import signal
import stat
import sys
import time
from pathlib import Path

import pytest
from omegaconf import OmegaConf

import mmt
from helpers.plans import local_plan
from hydra_plugins.mmt_launcher.config import RayLauncherConf
from mmt.backends.ray import placement
from mmt.backends.ray.actor import inherited_env, node_cores
from mmt.backends.ray.api import ClusterNode, RayJob
from mmt.backends.ray.conclusion import LostNode, RunEnd, conclude, ended_outside
from mmt.backends.ray.settings import RaySettings, cluster_address
from mmt.backends.ray.task import JobRef, RayTask, entrypoint, read_task_file, shown, write_task_file
from mmt.core.errors import ConfigError
from mmt.core.jobdir import Attempt
from mmt.core.states import JobState
from mmt.planning.machine import Machine
from mmt.records.schema import ErrorRecord, ExitRecord

CPU4 = Machine(name="cpu", accelerator="cpu", gpus=0, cpus=4)
GPU8 = Machine(name="h100_x_8", accelerator="gpu", gpus=8, cpus=96)


def _settings(**values):
    cfg = OmegaConf.structured(RayLauncherConf)
    for key, value in values.items():
        OmegaConf.update(cfg, key, value, merge=False, force_add=True)
    return RaySettings.from_config(cfg)


def _node(ip: str, alive: bool = True, **resources: float) -> ClusterNode:
    return ClusterNode(ip=ip, node_id=ip.replace(".", "") * 4, alive=alive, head=False, resources=resources)


WORKERS = [_node(f"127.0.0.{n}", CPU=4.0) for n in (6, 7, 8)]
HEAD = ClusterNode(ip="127.0.0.5", node_id="h" * 56, alive=True, head=True, resources={"CPU": 0.0})


# ------------------------------------------------------------------------------------------------ settings


def test_the_defaults_take_the_address_from_rays_own_variable_and_the_bundle_from_the_machine(monkeypatch):
    monkeypatch.setenv("RAY_API_SERVER_ADDRESS", "127.0.0.5:8265")
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    settings = _settings()
    assert settings.address == "http://127.0.0.5:8265"
    assert settings.bundle(local_plan(machine=CPU4)) == {"CPU": 4.0}
    assert settings.bundle(local_plan(machine=GPU8)) == {"CPU": 96.0, "GPU": 8.0}
    assert settings.runtime_env.to_ray() == {}
    tuned = _settings(cpus_per_node=2, gpus_per_node=1, **{"resources_per_node.TPU": 4})
    assert tuned.bundle(local_plan(machine=GPU8)) == {"CPU": 2.0, "GPU": 1.0, "TPU": 4.0}


def test_no_address_anywhere_is_said_by_the_backend_not_at_config_time(monkeypatch):
    for name in ("RAY_API_SERVER_ADDRESS", "RAY_ADDRESS"):
        monkeypatch.delenv(name, raising=False)
    from mmt.backends.ray.backend import RayBackend

    backend = RayBackend(_settings())  # a dry run still prints its plan
    [problem] = backend.problems(local_plan())
    assert problem.key == "hydra.launcher.address" and "RAY_API_SERVER_ADDRESS" in str(problem)
    assert "scripts/ray_cluster.sh start" in str(problem) and "\n" not in str(problem)


@pytest.mark.parametrize(
    "key, value, said",
    [
        ("address", "ray://head:10001", "the Ray dashboard's address"),
        ("cpus_per_node", 0, "expected a number > 0"),
        ("gpus_per_node", -1, "expected a whole number >= 0"),
        ("resources_per_node.CPU", 2, "it has a key of its own, hydra.launcher.cpus_per_node"),
        ("resources_per_node.TPU", -1, "expected an amount >= 0"),
        ("runtime_env.conda", "env.yaml", "mmt passes working_dir, pip and env_vars to Ray's runtime env"),
        ("runtime_env.pip", [1], "expected a list of pip requirements"),
        ("runtime_env.env_vars.MASTER_ADDR", "x", "belongs to the rank contract"),
        ("runtime_env.working_dir", "/nonexistent/dir", "no such directory on this machine"),
        ("poll_interval_s", 0, "expected a number > 0"),
    ],
)
def test_a_bad_setting_is_one_line_naming_the_key_the_value_and_what_is_allowed(key, value, said):
    with pytest.raises(ConfigError) as raised:
        _settings(**{key: value})
    message = str(raised.value)
    assert raised.value.key == f"hydra.launcher.{key}" and said in message and "HINT: " in message, message
    assert "\n" not in message


def test_an_address_from_rays_variable_that_is_not_one_names_the_variable():
    with pytest.raises(ConfigError) as raised:
        cluster_address(None, {"RAY_ADDRESS": "auto"})
    assert raised.value.key == "RAY_ADDRESS"
    assert cluster_address(None, {"RAY_ADDRESS": "http://h:8265/"}) == "http://h:8265"
    assert cluster_address(None, {}) is None


def test_the_runtime_env_is_rays_own_and_a_local_working_dir_is_made_absolute(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "app").mkdir()
    settings = _settings(
        **{"runtime_env.working_dir": "app", "runtime_env.pip": ["requests==2.32.3"], "runtime_env.env_vars.X": 1}
    )
    assert settings.runtime_env.to_ray() == {
        "working_dir": str(tmp_path / "app"),
        "pip": ["requests==2.32.3"],
        "env_vars": {"X": "1"},
    }
    assert settings.runtime_env.local_working_dir
    assert not _settings(**{"runtime_env.working_dir": "s3://bucket/app.zip"}).runtime_env.local_working_dir


# ------------------------------------------------------------------------------------------------ placement


def test_a_job_the_alive_nodes_can_hold_is_not_refused_and_dead_or_small_nodes_do_not_count():
    plan = local_plan(num_nodes=3)
    assert placement.refusal(plan, {"CPU": 4.0}, [HEAD, *WORKERS], "the cluster") is None
    dead = [WORKERS[0], WORKERS[1], _node("127.0.0.8", alive=False, CPU=4.0)]
    assert placement.refusal(plan, {"CPU": 4.0}, [HEAD, *dead], "the cluster") is not None
    small = [WORKERS[0], WORKERS[1], _node("127.0.0.8", CPU=2.0)]
    assert placement.refusal(plan, {"CPU": 4.0}, small, "the cluster") is not None


def test_too_many_nodes_is_refused_naming_num_nodes_what_it_asks_and_what_the_cluster_has():
    found = placement.refusal(local_plan(num_nodes=4), {"CPU": 4.0}, [HEAD, *WORKERS], "the cluster at http://h:8265")
    assert found is not None and (found.key, found.value) == ("num_nodes", 4)
    assert found.line == (
        "job 0 asks 4 Ray nodes with {CPU: 4} each (STRICT_SPREAD: one node per mmt node, 4 x 2 ranks); the cluster "
        "at http://h:8265 has 3 that can hold one: 127.0.0.6 {CPU: 4}, 127.0.0.7 {CPU: 4}, 127.0.0.8 {CPU: 4}; "
        "too small: 127.0.0.5 {CPU: 0}"
    )


def test_a_resource_no_node_has_is_refused_naming_its_key():
    found = placement.refusal(local_plan(), {"CPU": 4.0, "GPU": 8.0}, WORKERS, "the cluster")
    assert found is not None and (found.key, found.value) == ("hydra.launcher.gpus_per_node", 8.0)
    assert "has 0 that can hold one; too small: 127.0.0.6 {CPU: 4, GPU: 0}" in found.line
    custom = placement.refusal(local_plan(), {"CPU": 1.0, "TPU": 1.0}, WORKERS, "the cluster")
    assert custom is not None and custom.key == "hydra.launcher.resources_per_node.TPU"


# ------------------------------------------------------------------------------------------------ conclusion


def _attempt(tmp_path: Path) -> Attempt:
    attempt = Attempt(tmp_path / ".mmt" / "attempts" / "a")
    attempt.dir.mkdir(parents=True)
    return attempt


def _end(**fields) -> RunEnd:
    return RunEnd(started_at=100.0, ended_at=110.0, **fields)


def test_every_rank_done_with_a_result_is_completed(tmp_path):
    plan, attempt = local_plan(job_dir=str(tmp_path)), _attempt(tmp_path)
    for index in range(4):
        attempt.write_done(index, 0)
    attempt.primary_return.write_bytes(b"x")
    outcome = conclude(plan, attempt, _end(), "mmt-x")
    assert (outcome.status, outcome.duration_s, outcome.scheduler_id) == (JobState.COMPLETED, 10.0, "mmt-x")


def test_a_lost_node_is_the_failure_whatever_its_peers_raised_about_it(tmp_path):
    plan, attempt = local_plan(job_dir=str(tmp_path)), _attempt(tmp_path)
    ErrorRecord(exception="RuntimeError: Connection reset by peer").write(attempt.error_file(0))  # a broken gloo
    lost = LostNode(node=1, ip="127.0.0.7", node_id="1a2b3c4d5e6f")
    outcome = conclude(plan, attempt, _end(lost=(lost,), stopped_at=105.0), "mmt-x")
    assert outcome.status == JobState.FAILED and outcome.failure is None
    assert outcome.detail == "Ray job mmt-x lost node 127.0.0.7 (Ray node 1a2b3c4d): node 1 of the job, ranks 2-3"


def test_a_rank_that_failed_before_the_driver_stopped_the_others_is_named_not_those_it_stopped(tmp_path):
    plan, attempt = local_plan(job_dir=str(tmp_path)), _attempt(tmp_path)
    t0 = time.time()
    ExitRecord(code=3, stopped=False, time=t0).write(attempt.exit_file(2))
    for index in (0, 1, 3):
        ExitRecord(code=-signal.SIGTERM, stopped=False, time=t0 + 1).write(attempt.exit_file(index))
    outcome = conclude(plan, attempt, _end(stopped_at=t0 + 0.5), "mmt-x")
    assert outcome.status == JobState.FAILED and (outcome.failure.rank, outcome.failure.exit_code) == (2, 3)


@pytest.mark.parametrize(
    "end, status, detail",
    [
        (_end(stopped_because="stopped on request (mmt stop)"), "INTERRUPTED", "stopped: stopped on request"),
        (_end(timed_out=True), "TIMEOUT", "Ray job mmt-x reached its time limit; all 4 ranks were still running"),
        (_end(refused="job 0 asks 2 Ray nodes ..."), "FAILED", "job 0 asks 2 Ray nodes ..."),
        (_end(died=((1, "killed"),)), "FAILED", "the Ray actor of node 1 (its node agent) died, its Ray node alive"),
    ],
    ids=["stopped", "time-limit", "refused", "actor-died"],
)
def test_how_a_run_that_did_not_complete_ended(tmp_path, end, status, detail):
    outcome = conclude(local_plan(job_dir=str(tmp_path)), _attempt(tmp_path), end, "mmt-x")
    assert outcome.status.value == status and outcome.detail.startswith(detail), outcome


def test_a_job_whose_driver_was_killed_is_concluded_from_what_ray_says(tmp_path):
    plan, attempt = local_plan(job_dir=str(tmp_path)), _attempt(tmp_path)
    ExitRecord(code=-signal.SIGKILL, stopped=False, time=time.time()).write(attempt.exit_file(0))  # fate-shared
    failed = ended_outside(plan, attempt, "mmt-x", "FAILED", "Job entrypoint command failed with exit code -9")
    assert failed.status == JobState.FAILED and failed.failure is None
    assert failed.detail == (
        "Ray job mmt-x ended FAILED before its driver concluded it: Job entrypoint command failed with exit code -9"
    )
    stopped = ended_outside(plan, attempt, "mmt-x", "STOPPED", "")
    assert stopped.status == JobState.INTERRUPTED and "stopped outside mmt (ray job stop)" in stopped.detail


# ------------------------------------------------------------------------------------------------ the job's files


def test_the_task_file_is_the_owners_only_and_the_entrypoint_quotes_what_it_names(tmp_path):
    attempt = _attempt(tmp_path)
    task = RayTask(
        plan=local_plan(job_dir=str(tmp_path)),
        attempt_dir=str(attempt.dir),
        submission_id="mmt-a",
        bundle={"CPU": 4.0},
        project_dir="/work/my app",
        kill_grace_s=1.0,
        start_method="fork",
        copied_env={"HF_TOKEN": "s3cr3t"},
    )
    path = write_task_file(task)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and read_task_file(str(path)) == task
    command = entrypoint(task, path)
    assert command.startswith("cd '/work/my app' && exec python -u -c ")
    assert command.endswith(f" {path} {mmt.__version__} {sys.version_info[0]}.{sys.version_info[1]}")
    assert shown(command) == (
        "cd '/work/my app' && exec python -u -c <mmt's check, then the driver mmt.backends.ray.driver> "
        f"{path} {mmt.__version__} {sys.version_info[0]}.{sys.version_info[1]}"
    )
    assert "s3cr3t" not in repr(task)  # secrets are never printed
    uploaded = RayTask(**{**task.__dict__, "project_dir": None})
    assert entrypoint(uploaded, path).startswith("exec python")  # the runtime env's working_dir is the cwd
    JobRef("http://h:8265", "mmt-a").write(attempt)
    assert JobRef.read(attempt) == JobRef("http://h:8265", "mmt-a")


def test_a_ray_job_as_the_job_api_describes_it():
    job = RayJob.of({"submission_id": "mmt-a", "status": "FAILED", "driver_exit_code": -9, "start_time": 1500})
    assert (job.final, job.driver_exit_code, job.start_time) == (True, -9, 1.5)
    assert not RayJob.of({"submission_id": "mmt-a", "status": "RUNNING"}).final


# ------------------------------------------------------------------------------------------------ what ranks inherit


def test_ranks_inherit_neither_rays_worker_variables_nor_its_thread_count_unless_the_job_set_them():
    environ = {"RAY_RAYLET_PID": "1", "RAY_JOB_ID": "01000000", "OMP_NUM_THREADS": "4", "PATH": "/bin", "X": "1"}
    assert inherited_env(environ, {}) == {"PATH": "/bin", "X": "1"}
    assert inherited_env(environ, {"OMP_NUM_THREADS": "4"})["OMP_NUM_THREADS"] == "4"
    assert node_cores({"CPU": 64.0}) == (os.cpu_count() or 1) and node_cores({"CPU": 1.0}) == 1


def test_cluster_ray_is_a_launcher_of_hydras_config_store_and_plugin_discovery_never_imports_ray():
    from hydra.core.config_store import ConfigStore

    from mmt.backends.registry import backend_class

    had_ray = "ray" in sys.modules
    assert ConfigStore.instance().load("hydra/launcher/mmt_ray.yaml").node.backend == "ray"
    assert backend_class("ray").name == "ray"
    if not had_ray:
        assert "ray" not in sys.modules  # the launcher speaks HTTP; only the cluster's processes import ray
    pickle.dumps(_settings())  # a backend is rebuilt from its settings elsewhere
