"""The library's modules import each other without circles, and in one direction only.

The graph: one node per module of graph_capture/, solver/, executor/ and cli/ (a package's
``__init__.py`` is the package's node), and an edge for every ``import`` and ``from ... import``
in a module's text: at module level, inside functions and under ``if TYPE_CHECKING``, since a
circle closed by an import inside a function, or by one for a type, still ties the two modules
together. Relative imports are resolved against the importing module's package.

- ``import a.b.c``: an edge to ``a.b.c``. The parent packages ``a`` and ``a.b``, which Python
  initialises first, are not edges: a module inside a package runs once its package has begun
  initialising, so importing a sibling's full path reads nothing from the package's
  ``__init__``.
- ``from a.b import n``: an edge to ``a.b.n`` where ``n`` is a module of the library, else to
  ``a.b`` (the name is read from ``a.b``'s namespace). So ``from pkg import name`` inside
  ``pkg.x``, a name ``pkg/__init__.py`` re-exports, is an edge to the package's ``__init__``,
  and a circle wherever that ``__init__`` imports ``pkg.x`` (directly or not): the name may not
  be bound yet when ``pkg.x`` runs. Inside a package, import the module that defines a name.

The direction (graph_capture -> solver <- executor, cli above them all): solver imports none of
graph_capture, executor, cli and torch; graph_capture imports neither executor nor cli; executor
does not import cli.
"""

from __future__ import annotations

import ast
from pathlib import Path

import networkx as nx

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("graph_capture", "solver", "executor", "cli")
FORBIDDEN = {
    "solver": {"graph_capture", "executor", "cli", "torch"},
    "graph_capture": {"executor", "cli"},
    "executor": {"cli"},
    "cli": set(),
}


def _modules() -> dict[str, tuple[Path, bool]]:
    """Dotted module name -> (its file, whether it is a package's ``__init__``)."""
    modules = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            is_package = parts[-1] == "__init__"
            if is_package:
                parts.pop()
            modules[".".join(parts)] = (path, is_package)
    return modules


def _imports(name: str, path: Path, is_package: bool) -> list[tuple[str, str | None, int]]:
    """(absolute module, name imported from it or None, line) for every import in the file."""
    package = name if is_package else name.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(alias.name, None, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1])
                module = f"{base}.{module}" if module else base
            found += [(module, alias.name, node.lineno) for alias in node.names]
    return found


def import_graph() -> nx.DiGraph:
    """The library's modules and their imports of each other (module docstring); each edge
    has `lines`: where the importer imports the imported."""
    modules = _modules()
    graph = nx.DiGraph()
    graph.add_nodes_from(modules)
    for name, (path, is_package) in modules.items():
        for module, imported, line in _imports(name, path, is_package):
            target = f"{module}.{imported}" if imported else None
            if target not in modules:
                target = module if module in modules else None
            if target is not None and target != name:
                graph.add_edge(name, target)
                graph.edges[name, target].setdefault("lines", []).append(line)
    return graph


def _cycles(graph: nx.DiGraph) -> list[str]:
    """Each circle as text, the importing line of each step named; a few per tangle."""
    lines = []
    for component in nx.strongly_connected_components(graph):
        if len(component) < 2:
            continue
        for k, cycle in enumerate(nx.simple_cycles(graph.subgraph(component))):
            if k == 5:
                lines.append(f"  ... and more among {sorted(component)}")
                break
            steps = zip(cycle, cycle[1:] + cycle[:1], strict=True)
            lines.append(
                "  "
                + " -> ".join(f"{u} (line {graph.edges[u, v]['lines'][0]})" for u, v in steps)
                + f" -> {cycle[0]}"
            )
    return lines


def test_the_graph_sees_the_library():
    """The walk finds every package and the imports of each kind (guards a vacuous pass)."""
    graph = import_graph()
    assert {"solver", "executor.sac", "graph_capture.trace", "cli.main"} <= set(graph)
    assert graph.number_of_nodes() > 150
    assert graph.has_edge("solver.exact.pipeline", "solver.exact.state")  # from a import b
    assert graph.has_edge("cli.main", "cli.solve")  # from package import module


def test_no_import_circles():
    cycles = _cycles(import_graph())
    assert not cycles, "import circles (break each: move the shared definition):\n" + "\n".join(
        cycles
    )


def test_imports_run_in_one_direction():
    wrong = []
    for name, (path, is_package) in _modules().items():
        forbidden = FORBIDDEN[name.partition(".")[0]]
        for module, _, line in _imports(name, path, is_package):
            if module.partition(".")[0] in forbidden:
                wrong.append(f"  {path.relative_to(ROOT)}:{line} imports {module}")
    assert not wrong, "imports against the direction:\n" + "\n".join(wrong)
