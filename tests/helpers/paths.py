"""Where things are: the repository, the tests, and the data files the tests read."""

from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
REPO = TESTS.parent
# the exact sbatch scripts mmt renders (tests/unit/test_sbatch.py), recorded on a first run
GOLDEN = TESTS / "golden"
# a shared recipe package, pip-installed by the ``shared_recipes`` fixture (the README names this path too)
SHARED_RECIPES = TESTS / "fixtures" / "shared_recipes"
# mmt's machine catalogue, as shipped
CATALOGUE = REPO / "launcher_plugin" / "mmt" / "conf" / "machine"
