"""Images per role on cluster=local: each role's nodes run in its own image (``roles.<name>.image``), the job's
``image`` is every role's default, ``image: null`` runs a role here. Real podman (with runc), mmt's test image
(scripts/build_test_image.py: /etc/mmt-test-image is a file only the image has), real gloo; every process and
container gone afterwards.

The app (tests/fixtures/roles_images/) has a trainer role (2 x 1, one all-reduce in its own world) and a scorer role
(1 x 1) that serves until the trainers end; every process writes where it ran."""

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict

from helpers.app import app_env, results
from helpers.images import assert_no_containers_left
from helpers.paths import REPO

APP = REPO / "tests" / "fixtures" / "roles_images" / "app.py"
SCORE_COMMAND = "+roles.scorer.command='python3 tests/fixtures/roles_images/score.py'"


def run_roles(*overrides: str, sweep_dir: Path, tag: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(APP), *overrides, f"hydra.sweep.dir={sweep_dir}"],
        cwd=REPO,
        env=app_env(tag),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def where(job: Path) -> Dict[str, dict]:
    """Where each process ran: ``{"trainer.0": {"in_image": ..., "world": ...}, ...}``."""
    return {path.name[len("where.") : -len(".json")]: json.loads(path.read_text()) for path in job.glob("where.*")}


def roles_of(result: dict) -> list:
    return [(role["name"], role["status"]) for role in result["roles"]]


def test_a_role_in_its_image_the_other_here_each_its_own_world(podman_image, tmp_path, tag):
    done = run_roles(f"+roles.scorer.image={podman_image['image']}", sweep_dir=tmp_path, tag=tag)
    assert done.returncode == 0, done.stdout + done.stderr
    (result,) = results(tmp_path)
    assert result["status"] == "COMPLETED"
    # the scorer stopped by mmt once the trainers (the primary role) had ended: a stop, not a failure
    assert roles_of(result) == [("trainer", "COMPLETED"), ("scorer", "STOPPED")]
    assert where(tmp_path / "0") == {
        "trainer.0": {"in_image": False, "world": 2, "all_reduce": 2},
        "trainer.1": {"in_image": False, "world": 2, "all_reduce": 2},
        "scorer.0": {"in_image": True, "world": 1},
    }
    assert_no_containers_left(tmp_path)


def test_the_jobs_image_is_every_roles_default_and_image_null_runs_a_role_here(podman_image, tmp_path, tag):
    done = run_roles(f"+image={podman_image['image']}", "+roles.scorer.image=null", sweep_dir=tmp_path, tag=tag)
    assert done.returncode == 0, done.stdout + done.stderr
    (result,) = results(tmp_path)
    assert result["status"] == "COMPLETED"
    found = where(tmp_path / "0")
    assert [found[f"trainer.{r}"]["in_image"] for r in range(2)] == [True, True]
    assert found["trainer.0"]["all_reduce"] == 2 and found["scorer.0"]["in_image"] is False
    assert_no_containers_left(tmp_path)


def test_a_roles_command_runs_in_its_image(podman_image, tmp_path, tag):
    """The image brings the role's program (as a vLLM or reward server's image does): the command is exec'd into
    the role's node containers with the role's contract; the trainers run here."""
    done = run_roles(
        f"+roles.scorer.image={podman_image['image']}",
        SCORE_COMMAND,
        "+roles.scorer.command_mode=per_rank",
        sweep_dir=tmp_path,
        tag=tag,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    (result,) = results(tmp_path)
    assert result["status"] == "COMPLETED" and roles_of(result) == [("trainer", "COMPLETED"), ("scorer", "STOPPED")]
    found = where(tmp_path / "0")
    assert found["scorer.0"] == {"in_image": True, "world": 1, "command": True}
    assert found["trainer.0"]["in_image"] is False
    assert_no_containers_left(tmp_path)


def test_a_role_in_its_image_that_raises_stops_the_others_naming_it(podman_image, tmp_path, tag):
    started = time.monotonic()
    done = run_roles(
        f"+roles.scorer.image={podman_image['image']}", "fail=true", "train_s=600", sweep_dir=tmp_path, tag=tag
    )
    assert done.returncode != 0
    assert time.monotonic() - started < 120  # the trainers, set to train for 10 minutes, were stopped
    (result,) = results(tmp_path)
    assert result["status"] == "FAILED"
    assert result["failure"]["role"] == "scorer" and "RuntimeError: the scorer broke" in result["failure"]["exception"]
    assert roles_of(result) == [("trainer", "STOPPED"), ("scorer", "FAILED")]
    assert "role scorer rank 0 (node 0) raised RuntimeError: the scorer broke" in done.stdout + done.stderr
    assert_no_containers_left(tmp_path)


def test_dry_run_shows_each_roles_image_and_a_missing_one_is_one_line(podman_image, tmp_path, tag):
    image = podman_image["image"]
    dry = run_roles(f"+roles.scorer.image={image}", "hydra.launcher.dry_run=true", sweep_dir=tmp_path, tag=tag)
    assert dry.returncode == 0, dry.stdout + dry.stderr
    assert "    image (none: this environment)" in dry.stdout and f"    image {image}" in dry.stdout
    # the scorer's node 0: its container, whose process is mmt's node agent in the image's python3
    (container,) = [line for line in dry.stdout.splitlines() if line.startswith("    container  ")]
    assert "podman run" in container and f" {image} -u -m mmt.agent.node " in container
    assert not (tmp_path / "0" / "logs").exists()  # nothing ran
    bad = run_roles("+roles.scorer.image=localhost/mmt-no-such-image:1", sweep_dir=tmp_path / "bad", tag=tag)
    assert bad.returncode != 0
    said = [line for line in bad.stderr.splitlines() if line.strip()]
    assert said[0].startswith("Invalid roles.scorer.image='localhost/mmt-no-such-image:1': podman has no such image")
    assert len(said) == 1 or said[1].startswith("Set the environment variable HYDRA_FULL_ERROR"), bad.stderr
    assert not (tmp_path / "bad").exists() or not list((tmp_path / "bad").glob("*/logs"))
