"""No function or method in launcher_plugin/ is longer than 80 lines, from its ``def`` line to its last line
(decorators not counted): a longer one is split by section into small functions with names and typed interfaces."""

import ast
from pathlib import Path
from typing import Iterator, List, Tuple, Union

REPO = Path(__file__).resolve().parents[2]
SOURCE = REPO / "launcher_plugin"
MAX_LINES = 80

# long functions allowed by file and qualified name: none (keep it so)
ALLOWED: set = set()

Function = Union[ast.FunctionDef, ast.AsyncFunctionDef]


def _functions(node: ast.AST, prefix: str = "") -> Iterator[Tuple[str, Function]]:
    """Every function and method under ``node``, nested ones too, with its qualified name (``Class.method``)."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield prefix + child.name, child
            yield from _functions(child, f"{prefix}{child.name}.")
        elif isinstance(child, ast.ClassDef):
            yield from _functions(child, f"{prefix}{child.name}.")
        else:
            yield from _functions(child, prefix)


def _long_functions() -> List[Tuple[str, int, int]]:
    """(``file::name``, line of its def, its length in lines) of every function over the limit."""
    found = []
    for path in sorted(SOURCE.rglob("*.py")):
        where = path.relative_to(SOURCE).as_posix()
        for name, function in _functions(ast.parse(path.read_text(), str(path))):
            length = (function.end_lineno or function.lineno) - function.lineno + 1  # lineno: the def, not a decorator
            if length > MAX_LINES:
                found.append((f"{where}::{name}", function.lineno, length))
    return found


def test_no_function_is_longer_than_80_lines() -> None:
    offenders = [
        f"launcher_plugin/{key.split('::')[0]}:{line} {key.split('::')[1]}: {length} lines"
        for key, line, length in _long_functions()
        if key not in ALLOWED
    ]
    assert not offenders, f"functions over {MAX_LINES} lines (split them by section):\n" + "\n".join(offenders)


def test_the_length_counts_from_the_def_line_to_the_last_line_without_decorators() -> None:
    code = "@decorator\n@another(1)\ndef f():\n" + "    x = 1\n" * 79 + "\nclass C:\n    def g(self):\n        pass\n"
    [(name, function), (method, g)] = list(_functions(ast.parse(code)))
    assert (name, function.lineno, function.end_lineno) == ("f", 3, 82)
    assert (method, (g.end_lineno or 0) - g.lineno + 1) == ("C.g", 2)
