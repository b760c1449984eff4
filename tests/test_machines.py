"""The machine catalogue (``mmt/conf/machine/*.yaml``, shipped with mmt).

Every current Lightning machine name has an entry with sane facts and a sourced price (no network: the files are
read as they are), Hydra finds the entries whatever the case of the name, the retired A10G entries say they are
legacy, and an app's own ``conf/machine/<name>.yaml`` overrides the shipped entry of that name.
"""

import math
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from omegaconf import OmegaConf

from conftest import REPO, app_env, results, run_app
from mmt.planning.machine import catalogue_names, machine_from_config

CATALOGUE = REPO / "launcher_plugin" / "mmt" / "conf" / "machine"

# lightning_sdk 2026.10.13 `Machine` names that the catalogue covers (see conf/machine/SOURCES.md)
LIGHTNING_MACHINES = [
    "CPU_SMALL", "CPU", "CPU_X_2", "CPU_X_4", "CPU_X_8", "CPU_X_16",
    "T4_SMALL", "T4", "T4_X_2", "T4_X_4", "T4_X_8",
    "L4", "L4_X_2", "L4_X_4", "L4_X_8",
    "L40S", "L40S_X_2", "L40S_X_4", "L40S_X_8",
    "RTXP_6000", "RTXP_6000_X_2", "RTXP_6000_X_4", "RTXP_6000_X_8",
    "A100", "A100_X_2", "A100_X_4", "A100_X_8",
    "H100", "H100_X_2", "H100_X_4", "H100_X_8",
    "H200", "H200_X_2", "H200_X_4", "H200_X_8",
    "B200", "B200_X_8",
]
# Lightning names left out on purpose (no public host memory, disk or instance: see SOURCES.md)
NOT_COVERED = ["DATA_PREP", "DATA_PREP_MAX", "DATA_PREP_ULTRA"]
# kept for configs that still name them; Lightning no longer offers A10G
LEGACY = ["a10g", "a10g_x_4"]

KEYS = ("name", "accelerator", "gpu_type", "gpus", "cpus", "memory_gb", "gpu_memory_gb", "instance_type",
        "price_per_hour", "price_source")


def _entries():
    return sorted(p.stem for p in CATALOGUE.glob("*.yaml"))


def _load(name: str) -> dict:
    return yaml.safe_load((CATALOGUE / f"{name}.yaml").read_text())


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


# --------------------------------------------------------------------------------------------- the files


def test_every_lightning_machine_has_an_entry():
    missing = [m for m in LIGHTNING_MACHINES if not (CATALOGUE / f"{m.lower()}.yaml").is_file()]
    assert not missing, f"no catalogue file for {missing}"
    assert not set(LIGHTNING_MACHINES) & set(NOT_COVERED)


def test_no_entry_outside_the_lists():
    """Each file is a current Lightning machine or a listed legacy one, and the planner sees the same set."""
    expected = sorted({m.lower() for m in LIGHTNING_MACHINES} | set(LEGACY))
    assert _entries() == expected
    assert catalogue_names() == expected


@pytest.mark.parametrize("name", _entries())
def test_entry_is_well_formed(name):
    text = (CATALOGUE / f"{name}.yaml").read_text()
    raw = _load(name)
    legacy = name in LEGACY

    # the first line names the Lightning machine, as the other files do
    first = text.splitlines()[0]
    assert first.startswith(f"# Lightning machine {name.upper()} ("), first
    # the same keys in the same order everywhere; `legacy` is the last key of the legacy entries only
    assert tuple(raw) == KEYS + (("legacy",) if legacy else ())

    assert raw["name"] == name
    assert raw["accelerator"] in ("cpu", "gpu")
    gpus = raw["gpus"]
    assert isinstance(gpus, int) and not isinstance(gpus, bool) and gpus >= 0
    assert (raw["accelerator"] == "gpu") == (gpus > 0)
    if gpus:
        assert isinstance(raw["gpu_type"], str) and raw["gpu_type"]
        assert _is_number(raw["gpu_memory_gb"]) and raw["gpu_memory_gb"] > 0
    else:
        assert raw["gpu_type"] is None and raw["gpu_memory_gb"] is None
    assert isinstance(raw["cpus"], int) and raw["cpus"] > 0
    assert _is_number(raw["memory_gb"]) and raw["memory_gb"] > 0
    assert isinstance(raw["instance_type"], str) and raw["instance_type"].strip()

    source = raw["price_source"]
    assert isinstance(source, str) and len(source.strip()) > 20
    price = raw["price_per_hour"]
    if price is None:
        assert re.search(r"no (on-demand )?price|not sourced|could not", source, re.IGNORECASE), \
            f"{name}: price_per_hour is null but price_source gives no reason: {source!r}"
    else:
        assert _is_number(price) and price > 0
        assert "read 2026-" in source, f"{name}: price_source does not say when the price was read"

    # the planner accepts the entry as it is
    machine = machine_from_config(OmegaConf.create(raw))
    assert machine.name == name and machine.gpus == gpus and machine.legacy == legacy


@pytest.mark.parametrize("name", LEGACY)
def test_a10g_entries_are_legacy(name):
    raw = _load(name)
    assert raw["legacy"] is True
    assert list(raw)[-1] == "legacy"
    assert "legacy: Lightning no longer offers A10G" in (CATALOGUE / f"{name}.yaml").read_text().splitlines()[0]


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


APP = '''\
import hydra
from omegaconf import DictConfig


@hydra.main(version_base="1.3", config_path="conf", config_name="config")
def main(cfg: DictConfig) -> float:
    return cfg.machine.price_per_hour


if __name__ == "__main__":
    main()
'''
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
    return subprocess.run([sys.executable, str(app / "app.py"), "-m", "hydra/launcher=mmt_local", *overrides,
                           f"hydra.sweep.dir={sweep_dir}"], cwd=app, env=app_env(tag), capture_output=True,
                          text=True, timeout=120)


def test_primary_config_dir_comes_before_the_catalogue(own_app):
    """Hydra's order: the app's own conf/ dir, then mmt's catalogue (an added hydra.searchpath comes after both)."""
    info = subprocess.run([sys.executable, str(own_app / "app.py"), "--info", "searchpath"], cwd=own_app,
                          env=app_env(), capture_output=True, text=True, timeout=120)
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
