"""No library function is a twin of another's signature: a function whose body only passes its
own parameters, in order, to a constructor or function (and calls a method of what that makes)
repeats that signature, and two signatures drift apart. Call the one it wraps. Counted from
four parameters: a thin adapter of fewer is no signature worth keeping in step."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LIBRARY = ("graph_capture", "solver", "executor", "cli")


def _parameters(node: ast.FunctionDef) -> list[str]:
    arguments = node.args
    names = [a.arg for a in (*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs)]
    return [n for n in names if n not in ("self", "cls")]


def _forwarded(call: ast.AST) -> list[str] | None:
    """The names a call passes (by position, or by keyword as the same name), where it passes
    only names; None for anything else."""
    if not isinstance(call, ast.Call):
        return None
    names = [a.id for a in call.args if isinstance(a, ast.Name)]
    names += [k.arg for k in call.keywords if isinstance(k.value, ast.Name) and k.arg == k.value.id]
    return names if len(names) == len(call.args) + len(call.keywords) else None


def _twins() -> list[str]:
    found = []
    for package in LIBRARY:
        for path in sorted((ROOT / package).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                if not isinstance(node, ast.FunctionDef) or node.name == "__init__":
                    continue
                body = node.body[1:] if ast.get_docstring(node) is not None else node.body
                if len(body) != 1 or not isinstance(body[0], ast.Return):
                    continue
                value = body[0].value
                chained = isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute)
                if chained and not value.args and not value.keywords:  # Made(...).method()
                    value = value.func.value
                parameters = _parameters(node)
                if len(parameters) >= 4 and _forwarded(value) == parameters:
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name}")
    return found


def test_no_function_repeats_the_signature_it_wraps():
    assert _twins() == []
