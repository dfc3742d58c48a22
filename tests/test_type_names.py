"""A type's name says what it is, and says it once: no public class or type alias is defined at
the top level of two library modules (one name, two things, or one thing written twice)."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("graph_capture", "solver", "executor", "cli")

TWICE: dict[str, str] = {}
"""Names defined in more than one module, each with the reason."""


def _defined(tree: ast.Module) -> list[str]:
    """The public classes and type aliases (capitalized, not CONSTANTS) a module defines."""
    names = []
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            names.append(node.name)
        elif isinstance(node, ast.Assign) and len(node.targets) == 1:
            if isinstance(node.targets[0], ast.Name):
                names.append(node.targets[0].id)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.append(node.target.id)
    return [n for n in names if n[:1].isupper() and not n.isupper()]


def test_no_type_name_is_defined_in_two_modules() -> None:
    where: dict[str, list[str]] = defaultdict(list)
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            for name in _defined(ast.parse(path.read_text(), str(path))):
                where[name].append(str(path.relative_to(ROOT)))
    twice = {name: paths for name, paths in where.items() if len(paths) > 1}
    assert set(twice) <= set(TWICE), {n: p for n, p in twice.items() if n not in TWICE}
