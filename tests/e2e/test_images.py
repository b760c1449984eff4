"""image= on cluster=local: every simulated node in its own podman container, both shapes, and nothing left behind.

Real podman (with runc), a real image built offline from this host's Python (scripts/build_test_image.py: torch,
Lightning, hydra-core, no mmt, /train.py, and /etc/mmt-test-image, a file only the image has), real gloo.
"""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers.app import app_command, app_env, job_dirs, results, run_app
from helpers.images import assert_no_containers_left, containers_of, image_results
from helpers.paths import REPO
from helpers.processes import wait_gone, wait_until

MMT = str(Path(sys.executable).with_name("mmt"))
# the image's own script, with the rank contract and nothing of mmt's
SHAPE_1 = ("command='python3 /train.py'", "command_mode=per_rank", "num_nodes=2", "devices=2")
# every process forked in the job's Python says whether it runs in the image (the ranks are forked by their node's
# agent): sitecustomize, on the ranks' PYTHONPATH through a mount
IN_IMAGE_MARK = """
import os, uuid

def _mark():
    with open(os.path.join(os.path.dirname(__file__), f"fork-{uuid.uuid4().hex}"), "w") as f:
        f.write(str(os.path.exists("/etc/mmt-test-image")))

os.register_at_fork(after_in_child=_mark)
"""


# ------------------------------------------------------------------------------------------------ the two shapes


def test_shape_1_the_image_brings_everything_its_script_runs_on_every_rank_in_a_container(podman_image, tmp_path, tag):
    done = run_app(f"image={podman_image['image']}", *SHAPE_1, sweep_dir=tmp_path, tag=tag)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    [job] = job_dirs(tmp_path)
    assert "left running" not in _logs(job), "the runtime's own processes are not the command's"
    ranks = image_results(job)
    assert [r["rank"] for r in ranks] == [0, 1, 2, 3]
    assert all(r["in_image"] for r in ranks), "every rank ran inside the image"
    assert [(r["node_rank"], r["local_rank"]) for r in ranks] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert {r["sum"] for r in ranks} == {10.0}, "the all-reduce went across both nodes' containers"
    assert len({r["weights"] for r in ranks}) == 1, "one model: identical weights on every rank"
    assert containers_of(str(job)) == []


def test_shape_2_the_task_function_trains_recipe_lm_in_the_image_with_mmt_mounted(podman_image, tmp_path, tag):
    marks = tmp_path / "marks"
    marks.mkdir()
    (marks / "sitecustomize.py").write_text(IN_IMAGE_MARK)
    done = run_app(
        f"image={podman_image['image']}",
        "recipe=lm",
        "num_nodes=2",
        "devices=2",
        "recipe.max_steps=20",
        f"hydra.launcher.container_mounts=[{marks}:{marks}]",
        f"+env.PYTHONPATH={marks}",
        sweep_dir=tmp_path / "sweep",
        tag=tag,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    [result] = results(tmp_path / "sweep")
    value = result["return_value"]
    assert value["world_size"] == 4
    assert value["train_loss_last"] < value["train_loss_first"], "the loss went down"
    assert len(value["weight_digests"]) == 4 and len(set(value["weight_digests"])) == 1
    forked = [p.read_text() for p in marks.glob("fork-*")]
    assert len(forked) >= 4 and set(forked) == {"True"}, "every rank was forked in the image's Python"
    assert_no_containers_left(tmp_path / "sweep")


# ------------------------------------------------------------------------------------------------ nothing left


def _logs(job: Path) -> str:
    return "".join(log.read_text() for log in sorted((job / "logs").glob("node*.log")))


def test_a_successful_command_job_in_an_image_says_nothing_was_left_running(podman_image, tmp_path, tag):
    """Each rank's command is an exec into its node's container: the runtime's own processes for it (the exec client;
    podman's conmon, which watches the exec session, and the clean-up it runs when the session ends) are not
    something the command left running, and no rank says they are. (Three 2 x 2 jobs: whether a rank's look found
    them still there was a race, which at least one rank of most jobs lost.)"""
    words = ("hi", "hello", "hey")
    done = run_app(
        f"image={podman_image['image']}", "command=" + ",".join(f"'echo {word} from $RANK'" for word in words),
        "command_mode=per_rank", "num_nodes=2", "devices=2", sweep_dir=tmp_path, tag=tag,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    jobs = job_dirs(tmp_path)
    assert len(jobs) == len(words)
    for job, word in zip(jobs, words):
        logs = _logs(job)
        assert all(f"{word} from {rank}" in logs for rank in range(4)), logs
        assert "left running" not in logs, logs
        assert containers_of(str(job)) == []


# runs in the container: a process that stays there after its command ended, and writes where mmt stopped it
# (SIGTERM, not the SIGKILL of the container's removal); ready once it can hear SIGTERM
LEFTOVER = """
import os, signal, sys, time

mark = sys.argv[1]


def stopped(*_):
    with open(mark + ".stopped", "w") as f:
        f.write("SIGTERM")
    sys.exit(0)


signal.signal(signal.SIGTERM, stopped)
open(mark + ".ready", "w").close()
time.sleep(300)
"""
LEAVES_ONE = """
mark="$MMT_JOB_DIR/leftover.${RANK:-node$NODE_RANK}"
python3 {script} "$mark" &
while [ ! -e "$mark.ready" ]; do sleep 0.05; done
echo started
"""


@pytest.mark.parametrize("mode", ["per_rank", "per_node"])
def test_a_process_the_command_leaves_running_in_its_container_is_stopped_and_reported(
    podman_image, tmp_path, tag, mode
):
    scripts = tmp_path / "scripts"
    scripts.mkdir()
    (scripts / "leftover.py").write_text(LEFTOVER)
    (scripts / "leaves_one.sh").write_text(LEAVES_ONE.replace("{script}", str(scripts / "leftover.py")))
    done = run_app(
        f"image={podman_image['image']}", f"command='sh {scripts / 'leaves_one.sh'}'", f"command_mode={mode}",
        "num_nodes=2", "devices=2", f"hydra.launcher.container_mounts=[{scripts}:{scripts}:ro]",
        sweep_dir=tmp_path / "sweep", tag=tag,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    [job] = job_dirs(tmp_path / "sweep")
    logs = sorted((job / "logs").glob("node*.log"))
    assert len(logs) == (4 if mode == "per_rank" else 2)
    for log in logs:  # found in the container (its orphan is the container init's, not the rank's) and stopped
        said = [line for line in log.read_text().splitlines() if "left running" in line]
        assert len(said) == 1 and said[0].startswith(
            "mmt: stopped 1 process(es) the command left running in its container: ["
        ), (log.name, said)
    marks = ["0", "1", "2", "3"] if mode == "per_rank" else ["node0", "node1"]
    assert sorted(p.name for p in job.glob("leftover.*.stopped")) == [f"leftover.{m}.stopped" for m in marks]
    assert containers_of(str(job)) == []


def test_a_failing_rank_fails_the_job_naming_it_and_leaves_no_container(podman_image, tmp_path, tag):
    failing = "command='if [ \"$RANK\" = 2 ]; then exit 7; fi; sleep 60'"
    done = run_app(
        f"image={podman_image['image']}", failing, "command_mode=per_rank", "num_nodes=2", "devices=2",
        sweep_dir=tmp_path, tag=tag,
    )  # fmt: skip
    assert done.returncode != 0
    [result] = results(tmp_path)
    assert result["status"] == "FAILED"
    assert result["failure"]["rank"] == 2 and "7" in json.dumps(result["failure"]), result["failure"]
    assert_no_containers_left(tmp_path)


def test_a_restart_runs_in_new_containers_and_leaves_none(podman_image, tmp_path, tag):
    # rank 1 fails on the first run only; the restarted job completes
    once = 'command=\'if [ "$MMT_RESTART_COUNT" = 0 ] && [ "$RANK" = 1 ]; then exit 3; fi; python3 /train.py\''
    done = run_app(
        f"image={podman_image['image']}", once, "command_mode=per_rank", "num_nodes=2", "devices=2",
        "hydra.launcher.max_restarts=1", "hydra.launcher.restart_backoff_s=0.2", sweep_dir=tmp_path, tag=tag,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    [result] = results(tmp_path)
    assert result["status"] == "COMPLETED" and result["restarts"] == 1, result
    assert all(r["in_image"] for r in image_results(job_dirs(tmp_path)[0]))
    assert_no_containers_left(tmp_path)


def test_a_node_whose_container_cannot_start_leaves_no_other_node_s_container(podman_image, tmp_path, tag):
    """mmt.agent.containers with real podman: node 1's name is taken (a run before still being removed, or another
    job), so its container does not start; node 0's, started beside it, is removed, and so is a set of containers
    one of which is gone already (podman 4's `rm -f` removed none of them then)."""
    from mmt.agent import containers

    label = f"mmt.job=test-{tag}"

    def node(rank: int, name: str) -> containers.NodeContainer:
        argv = ("podman", "run", "-d", "--rm", "--pull=never", "--name", name, "--label", label)
        argv += ("--entrypoint", "sleep", podman_image["image"], "infinity")
        return containers.NodeContainer(runtime="podman", name=name, node_rank=rank, run_argv=argv)

    taken = node(1, f"mmt-test-{tag}-n1")
    assert containers.start([taken]) is None
    try:
        why = containers.start([node(0, f"mmt-test-{tag}-n0"), taken])
        assert why is not None and why.startswith("node 1's container did not start: "), why
        assert containers_of(f"test-{tag}") == [], "node 0's container was left running"
        first, second = node(0, f"mmt-test-{tag}-a"), node(1, f"mmt-test-{tag}-b")
        assert containers.start([first, second]) is None
        subprocess.run(["podman", "rm", "-f", "-t", "0", first.name], capture_output=True, check=True)
        containers.remove([first, second])
        assert containers_of(f"test-{tag}") == [], "a container was left when another was gone already"
    finally:
        names = [f"mmt-test-{tag}-{suffix}" for suffix in ("n0", "n1", "a", "b")]
        subprocess.run(["podman", "rm", "-f", "-t", "0", "--ignore", *names], capture_output=True)


def test_ctrl_c_stops_the_ranks_and_removes_the_containers(podman_image, tmp_path, tag):
    launcher = subprocess.Popen(
        app_command(f"image={podman_image['image']}", "command='sleep 120'", "num_nodes=2", sweep_dir=tmp_path),
        cwd=REPO,
        env=app_env(tag),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        job = wait_until(lambda: job_dirs(tmp_path), 60, "the job dir")[0]
        wait_until(lambda: len(list((job / "logs").glob("node*.log"))) == 2, 60, "both nodes started")
        time.sleep(1)
        launcher.send_signal(signal.SIGINT)
        launcher.wait(timeout=60)
    finally:
        launcher.kill()
    [result] = results(tmp_path)
    assert result["status"] == "INTERRUPTED", result
    assert_no_containers_left(tmp_path)


def test_a_sigkilled_launcher_leaves_no_container_once_mmt_list_has_seen_it(podman_image, tmp_path, tag):
    launcher = subprocess.Popen(
        app_command(
            f"image={podman_image['image']}",
            "recipe=probe",
            "recipe.fail_rank=3",
            "recipe.fail_mode=hang",
            "num_nodes=2",
            "devices=2",
            sweep_dir=tmp_path,
        ),  # fmt: skip
        cwd=REPO,
        env=app_env(tag),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        job = wait_until(lambda: job_dirs(tmp_path), 60, "the job dir")[0]
        wait_until(lambda: len(containers_of(str(job))) == 2, 60, "both nodes' containers")
        launcher.kill()  # kill -9: its agent sees it go (parent-death signal) and takes the containers with it
        launcher.wait(timeout=30)
    finally:
        launcher.kill()
    assert wait_gone(tag, 30) == []
    listed = _mmt("list", "--json", cwd=tmp_path, tag=tag)  # concludes the orphan, and removes what is left by label
    assert listed.returncode == 0, listed.stderr
    assert json.loads((job / "result.json").read_text())["status"] == "FAILED"
    wait_until(lambda: containers_of(str(job)) == [], 30, "no container left")


def _mmt(*args: str, cwd: Path, tag: str) -> subprocess.CompletedProcess:
    return subprocess.run([MMT, *args], cwd=cwd, env=app_env(tag), capture_output=True, text=True, timeout=120)


def _row(cwd: Path, name: str, tag: str) -> dict:
    listed = _mmt("list", "--json", cwd=cwd, tag=tag)
    assert listed.returncode == 0, listed.stderr
    return {row["name"]: row for row in json.loads(listed.stdout)}.get(name, {})


def _detached(podman_image: dict, tmp_path: Path, tag: str, name: str) -> str:
    started = _mmt(
        "run", "--name", name, "--num-machines", "2", "--image", podman_image["image"], "--detach",
        "--command", "sleep 120", cwd=tmp_path, tag=tag,
    )  # fmt: skip
    assert started.returncode == 0, started.stdout[-2000:] + started.stderr[-3000:]
    wait_until(lambda: _row(tmp_path, name, tag).get("status") == "Running", 60, "the job running")
    from helpers.service import registered

    job_id = registered(name)[name]["job_id"]
    wait_until(lambda: len(containers_of(job_id)) == 2, 60, "both nodes' containers")
    return job_id


def test_mmt_stop_of_a_detached_job_removes_its_containers(podman_image, tmp_path, tag):
    name = f"img-stop-{tag[:6]}"
    job_id = _detached(podman_image, tmp_path, tag, name)
    stopped = _mmt("stop", name, cwd=tmp_path, tag=tag)
    assert stopped.returncode == 0, stopped.stderr
    wait_until(lambda: _row(tmp_path, name, tag).get("state") in ("INTERRUPTED", "CANCELLED"), 60, "the job stopped")
    wait_until(lambda: containers_of(job_id) == [], 30, "no container left")


def test_a_sigkilled_supervisor_leaves_no_container_once_mmt_list_has_seen_it(podman_image, tmp_path, tag):
    from helpers.service import registered

    name = f"img-kill-{tag[:6]}"
    job_id = _detached(podman_image, tmp_path, tag, name)
    os.kill(registered(name)[name]["supervisor_pid"], signal.SIGKILL)  # kill -9, the OOM killer
    assert wait_gone(tag, 30) == []
    row = _row(tmp_path, name, tag)  # mmt list concludes it
    assert row["state"] == "FAILED", row
    assert containers_of(job_id) == []


# ------------------------------------------------------------------------------------------------ bad input


def _refused(tmp_path: Path, *overrides: str, env_path: str = "") -> str:
    extra = {"PATH": env_path} if env_path else {}
    done = run_app(*overrides, "num_nodes=2", sweep_dir=tmp_path / "sweep", **extra)
    assert done.returncode != 0
    job = tmp_path / "sweep" / "0"
    assert not (job / "logs").exists(), "nothing started"
    assert not list(job.rglob("job.pkl")) and not list(job.rglob("node.*.pkl")), "no payload left"
    if shutil.which("podman"):
        assert containers_of(str(job)) == [], "no container"
    lines = [line for line in done.stderr.splitlines() if line.startswith("Invalid ")]
    assert len(lines) == 1, done.stderr[-3000:]
    return lines[0]


def test_an_image_the_runtime_does_not_have_is_refused_naming_image(podman_image, tmp_path):
    line = _refused(tmp_path, "image=localhost/no-such-image:1", "command='true'")
    assert line.startswith("Invalid image='localhost/no-such-image:1'") and "podman pull" in line


def test_a_runtime_that_is_not_installed_is_refused_saying_what_to_install(podman_image, tmp_path):
    line = _refused(
        tmp_path, f"image={podman_image['image']}", "command='true'", env_path=str(Path(sys.executable).parent)
    )
    assert line.startswith("Invalid hydra.launcher.container_runtime='podman'") and "install" in line


def test_an_image_without_python3_is_refused_for_the_task_function(podman_image, tmp_path):
    line = _refused(tmp_path, f"image={podman_image['without_python']}", "recipe=probe")
    assert line.startswith("Invalid image=") and "no python3" in line


def test_a_command_in_an_image_without_sleep_is_refused_before_anything_starts(podman_image, tmp_path):
    # /bin/sh alone: each node's container waits in `sleep infinity`, so the job used to start, run 35 s and fail
    # with the runtime's "no container with name or ID ... found"
    line = _refused(tmp_path, f"image={podman_image['shell_only']}", "command='echo hi'")
    assert line.startswith(f"Invalid image='{podman_image['shell_only']}': it has no sleep"), line
    assert "HINT:" in line


def test_an_image_whose_python3_is_another_minor_version_is_refused_naming_both(pypy_image, tmp_path):
    asked = subprocess.run(
        ["podman", "run", "--rm", "--entrypoint", "python3", pypy_image, "-c",
         "import sys; print('%d.%d' % sys.version_info[:2])"],
        capture_output=True, text=True,
    )  # fmt: skip
    theirs, ours = asked.stdout.strip(), f"{sys.version_info.major}.{sys.version_info.minor}"
    assert asked.returncode == 0 and theirs and theirs != ours, (asked.stdout, asked.stderr)
    line = _refused(tmp_path, f"image={pypy_image}", "recipe=probe")
    assert line.startswith(f"Invalid image='{pypy_image}'"), line
    assert f"its python3 is {theirs} (pypy), the launcher's is {ours}" in line and "HINT:" in line


def test_a_library_the_task_function_needs_that_the_image_lacks_is_refused_naming_it(podman_image, tmp_path):
    # a recipe whose code lives in a package the image lacks, its preload naming it as every recipe's does (what
    # its ranks import there): named before anything starts, where the ranks used to fail importing it. The
    # project's own packages are mounted (recipes), and torch and mmt's own libraries are in the image
    line = _refused(
        tmp_path, f"image={podman_image['image']}", "recipe=probe", "recipe._target_=mmt_no_such_library.probe",
        "hydra.launcher.preload=[torch.distributed,mmt_no_such_library,recipes.probe]",
    )  # fmt: skip
    assert line.startswith("Invalid image="), line
    assert "has no mmt_no_such_library," in line and "pip install mmt_no_such_library" in line, line


def test_a_missing_mount_source_is_refused_naming_container_mounts(podman_image, tmp_path):
    line = _refused(
        tmp_path, f"image={podman_image['image']}", "command='true'", "hydra.launcher.container_mounts=[/no/such:/data]"
    )
    assert line.startswith("Invalid hydra.launcher.container_mounts='/no/such:/data'")


def test_the_dry_run_prints_node_0s_container_command_with_no_secret_in_it(podman_image, tmp_path):
    secret = "+env.API_TOKEN=s3cr3t-value"
    task = run_app(f"image={podman_image['image']}", "recipe=probe", "num_nodes=2", "devices=2", secret,
                   "hydra.launcher.dry_run=true", sweep_dir=tmp_path / "task")  # fmt: skip
    command = run_app(f"image={podman_image['image']}", *SHAPE_1, secret, "hydra.launcher.dry_run=true",
                      sweep_dir=tmp_path / "command")  # fmt: skip
    for done in (task, command):
        assert done.returncode == 0, done.stderr[-3000:]
        assert "s3cr3t-value" not in done.stdout + done.stderr
    # the task function: node 0's container runs its node agent, in the image's Python
    [run] = [line for line in task.stdout.splitlines() if line.strip().startswith("container ")]
    assert "podman run --rm --init --pull=never --network=host --uts=host" in run and podman_image["image"] in run
    assert "--entrypoint python3" in run and "-u -m mmt.agent.node" in run and "/opt/mmt/mmt:ro" in run
    # a command: a container that waits, and the command exec-ed into it with the contract passed by name
    [run] = [line for line in command.stdout.splitlines() if line.strip().startswith("container ")]
    [first] = [line for line in command.stdout.splitlines() if line.strip().startswith("process 0 ")]
    assert "podman run -d --rm" in run and "/opt/mmt" not in run and run.endswith("infinity")
    assert "podman exec" in first and "-e API_TOKEN" in first and "-e RANK" in first
    assert first.endswith("sh -c 'python3 /train.py'")
    assert job_dirs(tmp_path / "task") == [] or not (job_dirs(tmp_path / "task")[0] / "logs").exists()
