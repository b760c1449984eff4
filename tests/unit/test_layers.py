"""The package graph: no cycle between packages (imports inside functions counted), and no backend named as a string
outside mmt.backends. The import-linter contract itself, run as a command: tests/e2e/test_layers_contract.py."""

import ast
import sys
from pathlib import Path
from typing import Dict, List, Set

import grimp

REPO = Path(__file__).resolve().parents[2]
SOURCE = REPO / "launcher_plugin"
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")


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
