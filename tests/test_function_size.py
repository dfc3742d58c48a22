"""No function in the library is longer than 80 lines (from `def` to its last line) or takes
more than 8 parameters (`self` and `cls` not counted), except one whose docstring has a line
starting "Exception to the" that gives the reason (a public entry point whose keyword-only
parameters are the one interface's options, for example)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LIBRARY = ("graph_capture", "solver", "executor", "cli")
MAX_LINES = 80
MAX_PARAMETERS = 8


def _parameters(node: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    arguments = node.args
    names = [
        a.arg for a in (*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs)
    ] + [a.arg for a in (arguments.vararg, arguments.kwarg) if a is not None]
    return sum(1 for name in names if name not in ("self", "cls"))


def _excepted(node: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    docstring = ast.get_docstring(node) or ""
    return any(line.strip().startswith("Exception to the") for line in docstring.splitlines())


def _offenders() -> list[str]:
    found = []
    for package in LIBRARY:
        for path in sorted((ROOT / package).rglob("*.py")):
            tree = ast.parse(path.read_text(), filename=str(path))
            for node in ast.walk(tree):
                if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    continue
                lines = node.end_lineno - node.lineno + 1
                parameters = _parameters(node)
                if (lines > MAX_LINES or parameters > MAX_PARAMETERS) and not _excepted(node):
                    where = f"{path.relative_to(ROOT)}:{node.lineno}"
                    found.append(f"{where} {node.name}: {lines} lines, {parameters} parameters")
    return found


def test_no_library_function_is_too_long_or_takes_too_many_parameters():
    offenders = _offenders()
    assert not offenders, (
        f"over {MAX_LINES} lines or {MAX_PARAMETERS} parameters, with no docstring line "
        "'Exception to the ... rule: <reason>':\n" + "\n".join(offenders)
    )
