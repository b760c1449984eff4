"""Restarts inside the allocation on the real SLURM test cluster (hydra.launcher.max_restarts): the LM
recipe's rank SIGKILLed mid-training ends with the uninterrupted weights, in one SLURM job that never queued again;
a detached job concludes itself with every run; the restart count is one for all ranks of a run."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.app import app_env, results, run_app
from helpers.processes import wait_gone, wait_until
from helpers.restarts import SMALL_LM, epoch_length

pytestmark = pytest.mark.slurm

MMT = str(Path(sys.executable).with_name("mmt"))
# on the SLURM test cluster, restarted at once
SLURM_LM = ("cluster=slurm", *SMALL_LM, "hydra.launcher.restart_backoff_s=0", "hydra.launcher.poll_interval_s=0.5")


@pytest.fixture(autouse=True)
def _cluster(slurm_cluster):
    yield


def test_an_lm_job_restarts_inside_its_allocation_and_ends_with_the_uninterrupted_weights(tmp_path, tag):
    straight = run_app(*SLURM_LM, sweep_dir=tmp_path / "straight", tag=tag, timeout=300)
    assert straight.returncode == 0, straight.stderr[-3000:]
    expected = results(tmp_path / "straight")[0]["return_value"]
    epoch = epoch_length(tmp_path / "straight" / "0" / "metrics.csv")
    done = run_app(
        *SLURM_LM,
        "recipe.fail_rank=3",
        f"recipe.fail_step={epoch + 2}",
        sweep_dir=tmp_path / "restarted",
        tag=tag,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    result = results(tmp_path / "restarted")[0]
    value = result["return_value"]
    assert result["status"] == "COMPLETED" and result["restarts"] == 1
    [run] = result["earlier_runs"]
    assert run["restart"] == 0 and "rank 3 (node 1) was killed by SIGKILL" in run["error"]
    # one SLURM job: the restart never waited in the queue (no requeue; SLURM's own restart count stays 0)
    job_id = result["scheduler_id"]
    assert "was requeued" not in done.stdout
    accounted = subprocess.run(["sacct", "-n", "-X", "-j", job_id, "-o", "Restarts"], capture_output=True, text=True)
    if accounted.returncode == 0 and accounted.stdout.strip():
        assert accounted.stdout.split()[0] == "0"
    assert value["resumed_from_checkpoint"] is True and value["steps"] == expected["steps"] == 40
    assert value["weight_digests"] == expected["weight_digests"] and value["val_loss"] == expected["val_loss"]
    assert wait_gone(tag) == []


COUNTING = (
    'echo "$MMT_RESTART_COUNT $RANK" >> {notes}; '
    'if [ "$RANK" = 2 ] && [ "$MMT_RESTART_COUNT" = 0 ]; then '
    'while [ "$(grep -c "^0 " {notes})" -lt 4 ]; do sleep 0.05; done; exit 4; fi'
)


def test_a_detached_slurm_job_concludes_itself_with_every_run_one_count_per_run(tmp_path, tag):
    notes = tmp_path / "notes"
    name = f"sdetached-{tag[:6]}"
    submitted = subprocess.run(
        [MMT, "run", "--cluster", "slurm", "--name", name, "--num-machines", "2", "--devices", "2"]
        + ["--command-mode", "per_rank", "--max-restarts", "2", "--detach"]
        + ["--set", "hydra.launcher.restart_backoff_s=0", "--command", COUNTING.format(notes=notes)],
        cwd=tmp_path,
        env=app_env(tag),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert submitted.returncode == 0, submitted.stderr[-3000:]
    result_file = tmp_path / "outputs" / "mmt" / name / "0" / "result.json"
    wait_until(result_file.exists, 180, "the job's own conclusion")  # written inside the allocation
    result = json.loads(result_file.read_text())
    assert result["status"] == "COMPLETED" and result["restarts"] == 1
    assert "rank 2 (node 1) raised CommandFailedError" in result["earlier_runs"][0]["error"]
    seen = sorted(tuple(map(int, line.split())) for line in notes.read_text().splitlines())
    assert seen == [(count, rank) for count in range(2) for rank in range(4)]
    listed = subprocess.run([MMT, "list", "--json"], cwd=tmp_path, env=app_env(tag), capture_output=True, text=True)
    row = {r["name"]: r for r in json.loads(listed.stdout)}[name]
    assert row["status"] == "Completed" and row["restarts"] == 1


def test_a_deadlocked_rank_on_slurm_is_found_by_the_node_agents_and_named_with_its_stack(tmp_path, tag):
    # rank 3 (node 1) never joins the process group; ranks 0-2 wait for it; the node agents watch the whole job
    done = run_app(
        "cluster=slurm",
        "recipe=probe",
        "num_nodes=2",
        "devices=2",
        "recipe.fail_rank=3",
        "recipe.fail_mode=hang",
        "recipe.fail_at=start",
        "hydra.launcher.hang_timeout_min=0.1",
        "hydra.launcher.poll_interval_s=0.5",
        sweep_dir=tmp_path,
        tag=tag,
        timeout=180,
    )
    assert done.returncode != 0
    result = results(tmp_path)[0]
    error = result["error"]
    assert result["status"] == "FAILED" and "hung: no progress (output or training step) for 6 s" in error, error
    assert "ranks 0, 1, 2 at probe.py:81 in probe (inside " in error and "rank 3 at probe.py:35 in _inject" in error
    stacks = tmp_path / "0" / "stacks"
    assert 'probe.py", line 35 in _inject' in (stacks / "node1.rank3.txt").read_text()
    assert all((stacks / f"node{n}.rank{r}.txt").read_text() for n, r in ((0, 0), (0, 1), (1, 2)))
    assert wait_gone(tag) == []
