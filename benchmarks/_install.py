"""Another version of mmt beside this one, for a comparison in one run: a git revision (the last release) or a copy
of a source tree, each in a venv of its own that reuses this environment's packages (torch, Lightning, Hydra ...)
and imports mmt, the app and its recipes from its own tree.

The venv has no pip and installs nothing: one ``.pth`` file puts the version's ``launcher_plugin/`` first on the
path, then this environment's site-packages (whose own ``.pth`` files, among them this checkout's editable mmt, are
not read from there). A revision is exported with ``git archive`` and cached by its commit in ``--cache``.
"""

import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CACHE = Path(os.environ.get("MMT_BENCH_CACHE", Path(tempfile.gettempdir()) / "mmt-bench-versions"))


@dataclass(frozen=True)
class Version:
    """One version of mmt: the tree its app runs from, and the interpreter that imports it."""

    label: str
    tree: Path
    python: str


def current() -> Version:
    return Version(label="working tree", tree=REPO, python=sys.executable)


def _base_python() -> str:
    for name in ("python3", "python"):
        candidate = Path(sys.base_prefix) / "bin" / name
        if candidate.exists():
            return str(candidate)
    return sys.executable


def _make_venv(tree: Path, venv: Path) -> str:
    subprocess.run([_base_python(), "-m", "venv", "--without-pip", str(venv)], check=True)
    purelib = Path(
        subprocess.run(
            [str(venv / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()
    )
    ours = sysconfig.get_paths()["purelib"]
    (purelib / "00-mmt-version.pth").write_text(f"{tree / 'launcher_plugin'}\n{ours}\n")
    python = str(venv / "bin" / "python")
    # as scripts/setup.sh does: a process that may not write bytecode would compile mmt again in every process
    subprocess.run(
        [python, "-m", "compileall", "-q", str(tree / "launcher_plugin"), str(tree / "recipes")],
        check=True,
        capture_output=True,
    )
    return python


def of_tree(source: Path, label: str, dest: Path) -> Version:
    """A copy of ``source`` (a checkout, edited or not) in ``dest``, installed beside this one."""
    tree = dest / "tree"
    shutil.copytree(
        source,
        tree,
        ignore=shutil.ignore_patterns(".git", ".venv", "__pycache__", "outputs", "multirun", "*.egg-info", "data"),
    )
    return Version(label=label, tree=tree, python=_make_venv(tree, dest / "venv"))


def of_revision(rev: str, cache: Path = CACHE) -> Version:
    """Git revision ``rev`` of this repository, exported and installed once (cached by its commit)."""
    commit = subprocess.run(
        ["git", "rev-parse", "--verify", f"{rev}^{{commit}}"], cwd=REPO, check=True, capture_output=True, text=True
    ).stdout.strip()
    dest = cache / commit
    python = dest / "venv" / "bin" / "python"
    # ready, for this environment: the venv reads this environment's site-packages, so one made beside another
    # checkout (another .venv, since removed) is made again
    ours = sysconfig.get_paths()["purelib"]
    ready = dest / "ready"
    if python.exists() and ready.exists() and ready.read_text().strip() == ours:
        return Version(label=f"{rev} ({commit[:7]})", tree=dest / "tree", python=str(python))
    shutil.rmtree(dest, ignore_errors=True)
    (dest / "tree").mkdir(parents=True)
    archive = subprocess.Popen(["git", "archive", commit], cwd=REPO, stdout=subprocess.PIPE)
    subprocess.run(["tar", "-x", "-C", str(dest / "tree")], stdin=archive.stdout, check=True)
    if archive.wait() != 0:
        raise SystemExit(f"git archive {commit} failed")
    python_path = _make_venv(dest / "tree", dest / "venv")
    ready.write_text(ours + "\n")
    return Version(label=f"{rev} ({commit[:7]})", tree=dest / "tree", python=python_path)
