"""A backend is one package: no code outside ``mmt/backends/<name>/`` names a scheduler's commands or the noun of its
jobs in a string it uses (prose, docstrings and comments aside). Generic code reads a backend's words from the
registry (``mmt.backends.registry``: its spec's noun, help and name)."""

import ast
import re
from pathlib import Path
from typing import Iterator, List, Set, Tuple

from helpers.paths import REPO

ROOT = REPO / "launcher_plugin"
# the schedulers' commands and their jobs' nouns
NAMED = re.compile(
    r"SLURM job|Ray job|\bray (job|start|status)\b"
    r"|\b(sbatch|squeue|scancel|scontrol|sacct|sinfo|srun|slurmctld|submitit)\b"
)
# strings that are other software's own words, matched as they are: never a command mmt runs or a noun it says
OTHERS_WORDS = {
    # Lightning's warning on a host with SLURM installed, filtered from every rank (mmt.worker.guards)
    ("mmt/planning/environment.py", "The `srun` command is available on your system but is not used"),
}


def _docstrings(tree: ast.AST) -> Set[int]:
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                found.add(id(first.value))
    return found


def _strings(path: Path) -> Iterator[Tuple[int, str]]:
    tree = ast.parse(path.read_text())
    docs = _docstrings(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs:
            yield node.lineno, node.value


def _outside_backends() -> Iterator[Path]:
    for path in sorted(ROOT.rglob("*.py")):
        parts = path.relative_to(ROOT).parts
        if parts[:2] == ("mmt", "backends") and len(parts) > 3:
            continue  # inside one backend's own package
        yield path


def test_no_code_outside_a_backend_names_a_schedulers_commands_or_its_jobs():
    offenders: List[str] = []
    for path in _outside_backends():
        rel = path.relative_to(ROOT).as_posix()
        for line, text in _strings(path):
            if NAMED.search(text) and (rel, text) not in OTHERS_WORDS:
                offenders.append(f"{path.relative_to(REPO)}:{line}: {text[:90]!r}")
    assert offenders == []


def test_the_scan_finds_what_it_looks_for(tmp_path):
    """The scan itself: a string naming sbatch is found, the same words in a docstring or comment are not."""
    sample = tmp_path / "sample.py"
    sample.write_text(
        '"""sbatch in prose."""\n# squeue in a comment\nCOMMAND = ["sbatch", "--parsable"]\nx = f"SLURM job {1}"\n'
    )
    found = [text for _, text in _strings(sample) if NAMED.search(text)]
    assert found == ["sbatch", "SLURM job "]
