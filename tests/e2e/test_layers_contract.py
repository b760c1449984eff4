"""The layers contract (import-linter, imports inside functions counted) as CI runs it, and its self-check: the same
contract over a copy of the code with one lazy upward import must fail. Runs `lint-imports` as a process, so not the
unit tier."""

import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SOURCE = REPO / "launcher_plugin"
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")


def _lint_imports(source: Path, config: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(LINT_IMPORTS), "--config", str(config), "--no-cache"],
        capture_output=True,
        text=True,
        cwd=source.parent,
        env={"PYTHONPATH": str(source), "PATH": "/usr/bin:/bin"},
        timeout=120,
    )


def test_the_layers_contract_holds() -> None:
    run = _lint_imports(SOURCE, REPO / "pyproject.toml")
    assert run.returncode == 0, run.stdout + run.stderr
    assert "0 broken" in run.stdout


def test_the_contract_fails_on_an_upward_import_even_inside_a_function(tmp_path: Path) -> None:
    """The CI self-check: the same contract over a copy of the code with one lazy upward import."""
    copy = tmp_path / "launcher_plugin"
    shutil.copytree(SOURCE, copy, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    errors = copy / "mmt" / "core" / "errors.py"
    errors.write_text(errors.read_text() + "\n\ndef _sneaky() -> None:\n    from mmt.sdk import Job  # noqa\n")
    config = tmp_path / "pyproject.toml"
    shutil.copy(REPO / "pyproject.toml", config)
    run = _lint_imports(copy, config)
    assert run.returncode != 0
    assert "BROKEN" in run.stdout and "mmt.core.errors -> mmt.sdk" in run.stdout
