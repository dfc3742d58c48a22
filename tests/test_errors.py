"""Every error remat raises on purpose is a `RematError` (README): the library's `raise`
statements name no bare builtin exception outside `ALLOWED`, every public error class subclasses
`RematError` and is exported where users import from (`solver`, `executor`, `graph_capture`),
and the classes README names are those."""

from __future__ import annotations

import ast
import builtins
import importlib
import inspect
import pkgutil
import re
from pathlib import Path
from types import ModuleType

import pytest

import executor
import graph_capture
import solver
from solver.deadline import check_time_limit
from solver.errors import InternalError, RematError

ROOT = Path(__file__).resolve().parent.parent
LIBRARY = ("graph_capture", "solver", "executor", "cli")
PACKAGES = {"graph_capture": graph_capture, "solver": solver, "executor": executor}
"""Where users import errors from: each package's `__all__` exports its own error classes."""

BUILTIN_EXCEPTIONS = {
    name
    for name, value in vars(builtins).items()
    if isinstance(value, type) and issubclass(value, BaseException)
}

ALLOWED = {
    ("solver/interrupt.py", "KeyboardInterrupt"): (
        "a second Ctrl-C: Python's own interrupt, raised as its default handler would"
    ),
    ("executor/sac/recording/measurer.py", "NotImplementedError"): (
        "the abstract method `Timeline.mark`, which every measurer overrides"
    ),
}
"""(file, builtin exception) -> why that file raises the builtin itself."""


def _raised_name(node: ast.Raise) -> str | None:
    """The name of the class a `raise` statement names (`raise X(...)`, `raise X`,
    `raise m.X(...)`); None for a bare re-raise."""
    if node.exc is None:
        return None
    target = node.exc.func if isinstance(node.exc, ast.Call) else node.exc
    if isinstance(target, ast.Name):
        return target.id
    if isinstance(target, ast.Attribute):
        return target.attr
    return None


def _builtin_raises() -> list[tuple[str, int, str]]:
    """(file, line, builtin exception) of every `raise` of a builtin in the library."""
    found = []
    for package in LIBRARY:
        for path in sorted((ROOT / package).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            for node in ast.walk(ast.parse(path.read_text(), rel)):
                if isinstance(node, ast.Raise) and _raised_name(node) in BUILTIN_EXCEPTIONS:
                    found.append((rel, node.lineno, _raised_name(node)))
    return found


def test_the_library_raises_no_bare_builtin_outside_the_allowlist():
    raises = _builtin_raises()
    bare = [f"{f}:{line}: raise {name}" for f, line, name in raises if (f, name) not in ALLOWED]
    assert not bare, (
        "raise a RematError subclass (solver/errors.py, executor/errors.py, "
        "graph_capture/errors.py; one that is also a ValueError or TypeError where callers "
        "expect that), or an InternalError for a state only remat's bug reaches:\n"
        + "\n".join(bare)
    )
    stale = set(ALLOWED) - {(f, name) for f, _, name in raises}
    assert not stale, f"allowlist entries no raise uses any more: {sorted(stale)}"


def _library_modules() -> list[ModuleType]:
    modules = []
    for package in LIBRARY:
        root = importlib.import_module(package)
        modules.append(root)
        for info in pkgutil.walk_packages(root.__path__, f"{package}."):
            modules.append(importlib.import_module(info.name))
    return modules


def _error_classes() -> list[type[BaseException]]:
    """Every exception class the library defines (not warnings, which are issued, not raised)."""
    return [
        value
        for module in _library_modules()
        for value in vars(module).values()
        if inspect.isclass(value)
        and value.__module__ == module.__name__
        and issubclass(value, BaseException)
        and not issubclass(value, Warning)
    ]


def test_every_public_error_class_is_a_remat_error_exported_by_its_package():
    classes = _error_classes()
    public = [c for c in classes if not c.__name__.startswith("_")]
    not_remat = [
        f"{c.__module__}.{c.__qualname__}" for c in public if not issubclass(c, RematError)
    ]
    assert not not_remat, f"public error classes outside RematError: {not_remat}"
    unexported = []
    for c in public:
        package = PACKAGES.get(c.__module__.split(".")[0])
        if package is not None and getattr(package, c.__name__, None) is not c:
            unexported.append(f"{c.__module__}.{c.__qualname__}")
        elif package is not None and c.__name__ not in package.__all__:
            unexported.append(f"{c.__module__}.{c.__qualname__} (in __all__)")
    assert not unexported, f"error classes not exported where users import from: {unexported}"


@pytest.mark.parametrize("package", sorted(PACKAGES))
def test_every_error_class_a_package_exports_is_a_remat_error(package):
    module = PACKAGES[package]
    exported = [getattr(module, name) for name in module.__all__]
    errors = [e for e in exported if inspect.isclass(e) and issubclass(e, BaseException)]
    assert errors
    assert all(issubclass(e, RematError) for e in errors if not issubclass(e, Warning)), errors


def test_readme_states_it_and_names_exported_remat_errors():
    readme = (ROOT / "README.md").read_text()
    bullet = re.search(
        r"^- Every error remat raises on purpose is a `RematError`.*?(?=^- |^$)",
        readme,
        re.M | re.S,
    )
    assert bullet, "README's statement that every error remat raises is a RematError is gone"
    named = set(re.findall(r"`(\w+Error)`", bullet.group())) - BUILTIN_EXCEPTIONS
    exported = {
        name: getattr(module, name)
        for module in PACKAGES.values()
        for name in module.__all__
        if name.endswith("Error")
    }
    assert named - {"RematError"}, bullet.group()
    assert named <= set(exported), (
        f"README names errors no package exports: {named - set(exported)}"
    )
    assert all(issubclass(exported[name], RematError) for name in named)


def test_an_internal_error_says_it_is_remats_bug_and_asks_for_a_report():
    error = InternalError("a schedule of value 3 under the proven floor 4")
    assert isinstance(error, RematError) and isinstance(error, RuntimeError)
    assert str(error).startswith("internal error: a schedule of value 3 under the proven floor 4")
    assert "remat's bug" in str(error) and "report" in str(error)


def test_argument_checks_raise_remat_errors_that_are_still_value_and_type_errors():
    with pytest.raises(solver.ArgumentError, match="positive number of seconds") as info:
        check_time_limit(0)
    assert isinstance(info.value, ValueError)
    with pytest.raises(solver.ArgumentError, match="unknown heuristic 'nope'"):
        solver.baseline(_chain(), "nope")
    with pytest.raises(solver.SpellingError, match=r"use Rematerialized\.load") as info:
        executor.Rematerialized.from_file()
    assert isinstance(info.value, TypeError)


def _chain():
    import networkx as nx

    graph = nx.DiGraph()
    graph.add_node("a", mem=1, cost=1.0)
    graph.add_node("b", mem=1, cost=1.0)
    graph.add_edge("a", "b")
    return graph
