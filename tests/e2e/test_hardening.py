"""Nothing lost, round 3 (issue 17), as users meet it: real launchers, real processes, the real registry."""

import json
import subprocess
import sys
from pathlib import Path

from helpers.app import app_env, results, run_app
from helpers.paths import REPO

MMT = [sys.executable, "-m", "mmt.cli.main"]


def _mmt(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([*MMT, *args], cwd=REPO, env=app_env(), capture_output=True, text=True, timeout=timeout)


def test_a_command_reaches_the_shell_byte_for_byte(tmp_path: Path) -> None:
    """Items 4 and 5: backslashes are not doubled, and ${VAR} is the shell's, not an OmegaConf interpolation."""
    command = r'''printf '[%s]' "a\b" "\$HOME" "${NODE_RANK}" "${UNSET_VAR:-dflt}" '\${x}' "it's"'''
    done = _mmt("run", "--name", f"bytes-{tmp_path.name}", "--command", command, "--set", f"hydra.sweep.dir={tmp_path}")
    assert done.returncode == 0, done.stdout + done.stderr
    log = (tmp_path / "0" / "logs" / "node0.log").read_text()
    assert log == r"[a\b][$HOME][0][dflt][\${x}][it's]", log


def test_an_env_reference_in_a_command_is_never_resolved_by_the_launcher(tmp_path: Path) -> None:
    """Item 5: ${oc.env:SECRET} stays text: the launcher neither resolves nor records the secret."""
    done = subprocess.run(
        [
            *MMT,
            "run",
            "--name",
            f"secret-{tmp_path.name}",
            "--command",
            "echo 'literal ${oc.env:MMT_TEST_SECRET}'",
            "--set",
            f"hydra.sweep.dir={tmp_path}",
        ],
        cwd=REPO,
        env=app_env(MMT_TEST_SECRET="hunter2-token"),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "hunter2-token" not in done.stdout + done.stderr
    assert "hunter2-token" not in (tmp_path / "0" / "result.json").read_text()
    assert (tmp_path / "0" / "logs" / "node0.log").read_text() == "literal ${oc.env:MMT_TEST_SECRET}\n"


def test_a_failed_jobs_overrides_are_printed_with_env_values_masked(tmp_path: Path) -> None:
    """Item 6: Hydra's 'Error executing job with overrides' line does not leak +env values."""
    done = run_app("recipe=probe", "recipe.fail_rank=0", "+env.API_TOKEN=tok-s3cr3t", sweep_dir=tmp_path)
    assert done.returncode != 0
    assert "Error executing job with overrides" in done.stderr + done.stdout
    assert "tok-s3cr3t" not in done.stdout + done.stderr


def test_a_dollar_in_a_swept_value_does_not_fail_the_launch(tmp_path: Path) -> None:
    """Item 10: matplotlib's mathtext raised on '$x^^y$' after every job had ended; the sweep's results were lost."""
    done = run_app("command='echo $$'", "+tag='$x^^y$',plain,'a$b'", sweep_dir=tmp_path)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert [r["status"] for r in results(tmp_path)] == ["COMPLETED"] * 3
    assert (tmp_path / "summary.png").exists()
    assert json.loads((tmp_path / "0" / "result.json").read_text())["overrides"][1] == "+tag='$x^^y$'"
