"""A backend from outside mmt (tests/fixtures/fakesched: each node a subprocess of a fake scheduler on this host),
registered as another package would register one (a module of Hydra's plugin namespace), with no change to
launcher_plugin/: `cluster=fakesched` runs the 2 x 2 probe, its dry run, a detached job that `mmt list` follows and
`mmt stop` stops, and `mmt wait`. Real processes: the scheduler, mmt's node agents, the ranks (gloo)."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from helpers.app import app_env, results, run_app
from helpers.paths import REPO
from helpers.processes import wait_until

FIXTURE = REPO / "tests" / "fixtures" / "fakesched"
MMT = str(Path(sys.executable).with_name("mmt"))
PROBE = ("cluster=fakesched", "recipe=probe", "num_nodes=2", "devices=2")


def _env(tag: str) -> dict:
    """The environment of a user who installed the fakesched package: it is importable, nothing else differs."""
    env = app_env(tag)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(FIXTURE), env.get("PYTHONPATH", "")]))
    return env


def _mmt(tag: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([MMT, *args], cwd=REPO, env=_env(tag), capture_output=True, text=True, timeout=120)


def _row(tag: str, name: str) -> dict:
    listed = _mmt(tag, "list", "--json")
    assert listed.returncode == 0, listed.stderr[-3000:]
    return {row["name"]: row for row in json.loads(listed.stdout)}.get(name, {})


def _app(tag: str, tmp_path: Path, *overrides: str) -> subprocess.CompletedProcess:
    env = _env(tag)
    return run_app(*overrides, sweep_dir=tmp_path, tag=tag, timeout=180, PYTHONPATH=env["PYTHONPATH"])


def test_a_backend_from_outside_mmt_runs_the_probe_two_by_two(tmp_path, tag):
    done = _app(tag, tmp_path, *PROBE)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    [result] = results(tmp_path)
    assert result["status"] == "COMPLETED" and result["return_value"]["all_reduce"] == 10.0, result
    assert [(r["rank"], r["node_rank"]) for r in result["return_value"]["ranks"]] == [(0, 0), (1, 0), (2, 1), (3, 1)]
    assert "submitted as fakesched job fake-" in done.stdout


def test_its_dry_run_shows_its_own_lines_and_starts_nothing(tmp_path, tag):
    done = _app(tag, tmp_path, *PROBE, "hydra.launcher.dry_run=true")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "mmt dry run: 1 job(s) on cluster=fakesched" in done.stdout
    assert "backend    fakesched: one job of the fake scheduler, its 2 node(s) subprocesses" in done.stdout
    assert results(tmp_path) == [] and not (tmp_path / "0" / ".mmt").exists()


def test_a_detached_job_is_listed_stopped_and_waited_for_by_its_noun(tmp_path, tag):
    name = f"fake-{tag[:6]}"
    done = _app(tag, tmp_path, *PROBE, "recipe.hold_s=120", "hydra.launcher.detach=true", f"hydra.launcher.name={name}")
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"mmt: detached job 0 {name}-0 (fakesched job fake-" in done.stdout, done.stdout
    wait_until(lambda: _row(tag, f"{name}-0").get("status") == "Running", 60, "mmt list to show it running")
    row = _row(tag, f"{name}-0")
    assert row["cluster"] == "fakesched" and row["scheduler_job"].startswith("fakesched job fake-"), row
    inspected = _mmt(tag, "inspect", f"{name}-0")
    assert "scheduler_job fakesched job fake-" in inspected.stdout, inspected.stdout
    time.sleep(2)
    stopped = _mmt(tag, "stop", f"{name}-0")
    assert stopped.returncode == 0 and f"{name}-0: fakesched job fake-" in stopped.stdout, stopped
    waited = _mmt(tag, "wait", f"{name}-0", "--timeout", "60")
    assert waited.returncode == 1, waited  # the job's status: stopped is not completed
    assert _row(tag, f"{name}-0")["status"] == "Stopped"
    [result] = results(tmp_path)
    assert result["status"] == "INTERRUPTED" and "stopped on request (mmt stop)" in result["error"], result


def test_no_code_of_mmt_names_the_backend_from_outside():
    named = [
        str(path)
        for path in (REPO / "launcher_plugin").rglob("*")
        if path.suffix in (".py", ".yaml") and "fakesched" in path.read_text()
    ]
    assert named == []
