"""The machine catalogue through Hydra: dry runs find the entries whatever the case of the name, the legacy ones say
so, and an app's own ``conf/machine/<name>.yaml`` overrides the shipped entry of that name. (The files themselves:
tests/unit/test_machines.py.)
"""

import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from helpers.app import app_env, results, run_app
from helpers.paths import CATALOGUE


def _load(name: str) -> dict:
    return yaml.safe_load((CATALOGUE / f"{name}.yaml").read_text())


# ------------------------------------------------------------------------------------- through Hydra (dry runs)


@pytest.mark.parametrize(("spelling", "entry"), [("A100_X_8", "a100_x_8"), ("T4", "t4"), ("h100_X_2", "h100_x_2")])
def test_machine_names_match_in_any_case(tmp_path, spelling, entry):
    result = run_app(f"machine={spelling}", "hydra.launcher.dry_run=true", sweep_dir=tmp_path / "sweep", timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"machine    {entry}:" in result.stdout, result.stdout


def test_legacy_machine_dry_run_says_legacy(tmp_path):
    result = run_app("machine=A10G", "hydra.launcher.dry_run=true", sweep_dir=tmp_path / "sweep", timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    line = next((ln for ln in result.stdout.splitlines() if ln.strip().startswith("machine ")), "")
    assert line.strip().startswith("machine    a10g:"), result.stdout
    assert line.endswith("[legacy: Lightning no longer offers it]"), line


# ------------------------------------------------------------------------------- an app's own conf/machine/


APP = """\
import hydra
from omegaconf import DictConfig


@hydra.main(version_base="1.3", config_path="conf", config_name="config")
def main(cfg: DictConfig) -> float:
    return cfg.machine.price_per_hour


if __name__ == "__main__":
    main()
"""
OWN_PRICE = 1.23


@pytest.fixture
def own_app(tmp_path) -> Path:
    """A ten-line Hydra app with its own conf/ dir: its machine/t4.yaml and machine/cpu.yaml are the shipped
    files with price_per_hour changed to 1.23."""
    app = tmp_path / "app"
    (app / "conf" / "machine").mkdir(parents=True)
    (app / "app.py").write_text(APP)
    (app / "conf" / "config.yaml").write_text("defaults:\n  - machine: t4\n  - _self_\n")
    for name in ("t4", "cpu"):
        shipped = (CATALOGUE / f"{name}.yaml").read_text()
        own, count = re.subn(r"(?m)^price_per_hour: .*$", f"price_per_hour: {OWN_PRICE}", shipped)
        assert count == 1 and _load(name)["price_per_hour"] != OWN_PRICE
        (app / "conf" / "machine" / f"{name}.yaml").write_text(own)
    return app


def _run_own_app(app: Path, *overrides: str, sweep_dir: Path, tag=None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [
            sys.executable,
            str(app / "app.py"),
            "-m",
            "hydra/launcher=mmt_local",
            *overrides,
            f"hydra.sweep.dir={sweep_dir}",
        ],
        cwd=app,
        env=app_env(tag),
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_primary_config_dir_comes_before_the_catalogue(own_app):
    """Hydra's order: the app's own conf/ dir, then mmt's catalogue (an added hydra.searchpath comes after both)."""
    info = subprocess.run(
        [sys.executable, str(own_app / "app.py"), "--info", "searchpath"],
        cwd=own_app,
        env=app_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert info.returncode == 0, info.stdout + info.stderr
    rows = [ln for ln in info.stdout.splitlines() if ln.startswith("|")]
    own = next(i for i, ln in enumerate(rows) if f"file://{own_app / 'conf'}" in ln)
    shipped = next(i for i, ln in enumerate(rows) if "mmt://mmt.conf" in ln)
    assert own < shipped, info.stdout


def test_own_machine_file_overrides_the_shipped_one_in_a_dry_run(own_app, tmp_path):
    result = _run_own_app(own_app, "hydra.launcher.dry_run=true", sweep_dir=tmp_path / "sweep")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "machine    t4:" in result.stdout, result.stdout
    assert f"cost       ${OWN_PRICE:.2f}/h per node" in result.stdout, result.stdout


def test_own_machine_file_reaches_the_task_function(own_app, tmp_path, tag):
    """A real run through mmt (cpu: this host has no GPU): the task sees the app's own price, not the shipped one."""
    sweep = tmp_path / "sweep"
    result = _run_own_app(own_app, "machine=cpu", sweep_dir=sweep, tag=tag)
    assert result.returncode == 0, result.stdout + result.stderr
    [job] = results(sweep)
    assert job["status"] == "COMPLETED", job
    assert job["return_value"] == OWN_PRICE


def test_own_machine_file_overrides_in_lightning_spelling(own_app, tmp_path):
    # machine=T4 is an alias for t4, looked up along the whole search path: the app's own t4.yaml comes first
    result = _run_own_app(own_app, "machine=T4", "hydra.launcher.dry_run=true", sweep_dir=tmp_path / "sweep")
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"cost       ${OWN_PRICE:.2f}/h per node" in result.stdout, result.stdout
