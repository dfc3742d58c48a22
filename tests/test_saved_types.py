"""Every type the library saves is read back by its own classmethod, ``Type.load(path, ...)``,
the path first. Graphs are networkx objects, not a type of the library's: `solver.io.save_graph`
writes one and `solver.io.load_graph` reads it, networkx's own read/write convention."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
from types import ModuleType

import pytest

PACKAGES = ("graph_capture", "solver", "executor", "cli")

LOAD_FUNCTIONS = {
    "load_graph": "graphs are networkx DiGraphs, which the library does not subclass",
    "load_schedule": "Schedule.load, then matched to a capture (estimate-mode schedules by "
    "structure): a Schedule file read for the traced executor, not a saved type of its own",
}
"""Public functions named load_* or read_*, each with the reason it is not a `Type.load`."""


def _modules() -> list[ModuleType]:
    found = []
    for name in PACKAGES:
        package = importlib.import_module(name)
        found.append(package)
        for info in pkgutil.walk_packages(package.__path__, f"{name}."):
            if info.name.endswith("__main__"):
                continue
            found.append(importlib.import_module(info.name))
    return found


MODULES = _modules()

SAVED = sorted(
    {
        cls
        for module in MODULES
        for cls in vars(module).values()
        if inspect.isclass(cls) and cls.__module__ == module.__name__ and "save" in vars(cls)
    },
    key=lambda cls: f"{cls.__module__}.{cls.__qualname__}",
)


def test_the_saved_types_are_found() -> None:
    names = {cls.__name__ for cls in SAVED}
    assert {"Schedule", "Device", "Rematerialized", "CheckpointPlan", "CompiledModel"} <= names


@pytest.mark.parametrize("cls", SAVED, ids=lambda cls: cls.__name__)
def test_every_saved_type_loads_with_a_load_classmethod_taking_the_path_first(cls) -> None:
    assert isinstance(inspect.getattr_static(cls, "load", None), classmethod), cls
    assert next(iter(inspect.signature(cls.load).parameters)) == "path"
    assert next(iter(inspect.signature(cls.save).parameters)) == "self"
    assert list(inspect.signature(cls.save).parameters)[1] == "path"


def test_no_public_function_loads_what_a_type_s_load_reads() -> None:
    loaders = {
        name
        for module in MODULES
        for name in getattr(module, "__all__", ())
        if name.startswith(("load_", "read_")) and inspect.isfunction(getattr(module, name))
    }
    assert loaders <= set(LOAD_FUNCTIONS), loaders - set(LOAD_FUNCTIONS)
