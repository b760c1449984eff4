"""The package graph: layers that import only downward (import-linter, imports inside functions counted), no cycle
between packages, and no backend named as a string outside mmt.backends."""

import ast
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Dict, List, Set

import grimp

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


def _subpackage(module: str) -> str:
    parts = module.split(".")
    return ".".join(parts[:2])


def test_no_cycle_between_packages() -> None:
    graph = grimp.build_graph("mmt", "hydra_plugins", include_external_packages=False)
    edges: Dict[str, Set[str]] = {}
    for importer in graph.modules:
        if importer in ("mmt", "hydra_plugins"):  # the package's facade (`from mmt import Job`): not a layer
            continue
        for imported in graph.find_modules_directly_imported_by(importer):
            a, b = _subpackage(importer), _subpackage(imported)
            if a != b and b != "mmt":
                edges.setdefault(a, set()).add(b)
    cycles = [path for path in (_path_back(edges, start) for start in edges) if path]
    assert not cycles, f"package cycles: {cycles}"


def _path_back(edges: Dict[str, Set[str]], start: str) -> List[str]:
    """A path from ``start`` back to itself, if there is one."""
    stack, seen = [(start, [start])], set()
    while stack:
        node, path = stack.pop()
        for nxt in edges.get(node, ()):
            if nxt == start:
                return path + [start]
            if nxt not in seen:
                seen.add(nxt)
                stack.append((nxt, path + [nxt]))
    return []


def _backend_names() -> Set[str]:
    from mmt.backends.registry import names

    return set(names())


def test_no_backend_name_is_compared_as_a_string_outside_backends() -> None:
    names, found = _backend_names(), []
    for path in SOURCE.rglob("*.py"):
        if "backends" in path.relative_to(SOURCE).parts:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Compare):
                texts = [c.value for c in ast.walk(node) if isinstance(c, ast.Constant) and isinstance(c.value, str)]
                if names & set(texts):
                    found.append(f"{path.relative_to(SOURCE)}:{node.lineno}")
            if isinstance(node, ast.Call) and getattr(node.func, "attr", "") in ("endswith", "startswith"):
                texts = [c.value for c in ast.walk(node) if isinstance(c, ast.Constant) and isinstance(c.value, str)]
                if any("Slurm" in t or "Local" in t for t in texts):
                    found.append(f"{path.relative_to(SOURCE)}:{node.lineno}")
    assert not found, f"backend names matched outside mmt.backends: {found}"
