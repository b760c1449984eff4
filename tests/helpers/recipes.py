"""The fixture recipe package (tests/fixtures/shared_recipes): a shared recipe repo, installed as pip would."""

import shutil
import subprocess
import sys
from pathlib import Path

from helpers.paths import SHARED_RECIPES

SHARED_SEARCHPATH = "hydra.searchpath=[pkg://mmt_shared_recipes.conf]"


def install_shared_recipes(root: Path) -> Path:
    """Install the fixture package into ``root``/site (built from a copy under ``root``: the repo's copy stays
    clean); put the returned path on PYTHONPATH to use it."""
    source = root / "src"
    shutil.copytree(SHARED_RECIPES, source)  # pip builds in the source tree: keep the repo's copy clean
    site = root / "site"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--no-deps",
            "--no-build-isolation",
            "--no-input",
            "--disable-pip-version-check",
            "--quiet",
            "--target",
            str(site),
            str(source),
        ],
        check=True,
        capture_output=True,
        text=True,
        timeout=120,
    )
    return site
