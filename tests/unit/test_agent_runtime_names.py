"""The shared agent layer names no container runtime: what podman or docker needs (the flags of its ``rm``) is the
local backend's to know (mmt.backends.local.images), and it passes it down with each container. Docstrings and
comments may name them; string literals, the code's own values, may not."""

import ast
from pathlib import Path
from typing import List, Set

REPO = Path(__file__).resolve().parents[2]
AGENT = REPO / "launcher_plugin" / "mmt" / "agent"
RUNTIMES = ("podman", "docker")


def _docstrings(tree: ast.AST) -> Set[int]:
    """The ids of the docstring constants of a module and of its classes and functions."""
    documented = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
    return {
        id(node.body[0].value)  # type: ignore[attr-defined]
        for node in ast.walk(tree)
        if isinstance(node, documented) and ast.get_docstring(node, clean=False) is not None
    }


def _runtime_literals(source: str, name: str) -> List[str]:
    tree = ast.parse(source, name)
    docstrings = _docstrings(tree)
    return [
        f"{name}:{node.lineno} {node.value!r}"
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and id(node) not in docstrings
        and any(runtime in node.value.lower() for runtime in RUNTIMES)
    ]


def test_no_string_literal_in_the_agent_names_a_container_runtime() -> None:
    found = [hit for path in sorted(AGENT.rglob("*.py")) for hit in _runtime_literals(path.read_text(), path.name)]
    assert not found, f"mmt.agent names a container runtime (the local backend passes what it needs): {found}"


def test_the_scan_finds_literals_and_f_strings_but_not_docstrings_or_comments() -> None:
    code = (
        '"""Runs podman."""\n'
        "def f(runtime):\n"
        '    """Or docker."""\n'
        "    # podman 4 removes none\n"
        '    if runtime == "podman":\n'
        '        return f"{runtime} is Docker"\n'
    )
    assert [hit.split(" ")[0] for hit in _runtime_literals(code, "x.py")] == ["x.py:5", "x.py:6"]
