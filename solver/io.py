"""Reading graph files: networkx node-link JSON, including the published Checkmate graphs.

Attribute mapping onto the solver contract (`mem` bytes, `cost`):

- remat's own files: `mem` and `cost` as they are.
- Checkmate graphs (`*_train_nx.json`, `*_test_nx.json`): `mem` = `cost_ram` (bytes of the
  output), `cost` = `cost_cpu` (profiled cost units), `backward` kept.
- random layered graphs (`random_layered_n*.json`): nodes named by `name`, links as
  `{"0": src, "1": dst}`, `mem` = `out_cost`, `cost` = `duration`, the order from the file's
  graph attribute `order`.

Node ids are kept as they are in the file. The order is the nodes' order in the file when that
is topological (Checkmate files list nodes in their topological order), else the deterministic
lexicographic topological order of `solver.core.graph`.
"""

from __future__ import annotations

import json
from collections.abc import Hashable
from pathlib import Path

import networkx as nx

from solver.errors import GraphError

_ATTRIBUTE_MAPS = (("mem", "cost"), ("cost_ram", "cost_cpu"), ("out_cost", "duration"))


def _node_id(value: object, where: str) -> Hashable:
    """A node id as the file gives it: a string or a number (JSON scalars), else GraphError."""
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise GraphError(f"{where}: node id {value!r} is not a string or a number")
    return value


def graph_from_node_link(data: object) -> nx.DiGraph:
    """Build a solver graph from node-link data (see the module docstring for the mappings).

    Raises GraphError, saying what is wrong, for anything that is not such data."""
    if not isinstance(data, dict) or not isinstance(data.get("nodes"), list):
        raise GraphError("not a node-link graph: expected a JSON object with 'nodes' and 'links'")
    graph = nx.DiGraph()
    for position, node in enumerate(data["nodes"]):
        if not isinstance(node, dict):
            raise GraphError(f"nodes[{position}] is {node!r}, not an object")
        key = "id" if "id" in node else "name"
        if key not in node:
            raise GraphError(f"nodes[{position}] has neither an 'id' nor a 'name'")
        v = _node_id(node[key], f"nodes[{position}]")
        if v in graph:
            raise GraphError(f"nodes[{position}]: node id {v!r} appears twice")
        graph.add_node(v, **{str(k): a for k, a in node.items() if k != key})
    links = data.get("links", data.get("edges", []))
    if not isinstance(links, list):
        raise GraphError(f"'links' is {type(links).__name__}, not a list of objects")
    for position, link in enumerate(links):
        if not isinstance(link, dict):
            raise GraphError(f"links[{position}] is {link!r}, not an object")
        src = link["source"] if "source" in link else link.get("0")
        dst = link["target"] if "target" in link else link.get("1")
        if src is None or dst is None:
            raise GraphError(f"links[{position}] has neither source/target nor '0'/'1' keys")
        src, dst = _node_id(src, f"links[{position}]"), _node_id(dst, f"links[{position}]")
        if src not in graph or dst not in graph:
            raise GraphError(f"link {src!r} -> {dst!r} names a node that is not in 'nodes'")
        graph.add_edge(src, dst)
    for mem_key, cost_key in _ATTRIBUTE_MAPS:
        if all(mem_key in a and cost_key in a for _, a in graph.nodes(data=True)):
            for _, attrs in graph.nodes(data=True):
                attrs["mem"], attrs["cost"] = attrs[mem_key], attrs[cost_key]
            break
    else:
        raise GraphError(
            "nodes need `mem` and `cost` (or Checkmate's cost_ram/cost_cpu, or out_cost/duration)"
        )
    attributes = data.get("graph", {})
    if not isinstance(attributes, dict):
        raise GraphError(f"'graph' is {type(attributes).__name__}, not an object")
    if "order" in attributes:
        order = attributes["order"]
        if not isinstance(order, list):
            raise GraphError(f"graph attribute 'order' is {type(order).__name__}, not a list")
        graph.graph["order"] = [_node_id(v, "graph attribute 'order'") for v in order]
    if isinstance(attributes.get("name"), str):
        graph.graph["name"] = attributes["name"]
    for key in ("step_cost", "plain_peak"):  # checked by prepare, as for a graph built in Python
        if key in attributes:
            graph.graph[key] = attributes[key]
    # the device whose seconds the costs are (estimate mode's target, a measured capture's
    # device), what the costs are, and the ops' structure (graph_capture.capture)
    for key in ("target", "device", "cost_model", "structure"):
        if isinstance(attributes.get(key), str):
            graph.graph[key] = attributes[key]
    if "threads" in attributes:
        threads = attributes["threads"]
        if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
            raise GraphError(f"graph attribute 'threads' is {threads!r}, not a positive integer")
        graph.graph["threads"] = threads
    if "order" not in graph.graph:
        file_order = list(graph.nodes)
        position = {v: i for i, v in enumerate(file_order)}
        if all(position[u] < position[v] for u, v in graph.edges):
            graph.graph["order"] = file_order
    return graph


def load_graph(path: str | Path) -> nx.DiGraph:
    """Read a node-link JSON graph file; raise GraphError naming the file when it is not one."""
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError, RecursionError) as exc:  # unreadable, not UTF-8, not JSON
        raise GraphError(f"cannot read graph file {path}: {exc}") from exc
    try:
        graph = graph_from_node_link(data)
    except GraphError as exc:
        raise GraphError(f"{path}: {exc}") from exc
    graph.graph.setdefault("name", path.stem)
    return graph


def save_graph(graph: nx.DiGraph, path: str | Path) -> None:
    """Write a solver graph as node-link JSON with its `order`, `name`, `step_cost`,
    `plain_peak`, `threads`, `target`, `device`, `cost_model` and `structure`, readable by
    `load_graph`."""
    data = nx.node_link_data(graph, edges="links")
    kept = (
        "order",
        "name",
        "step_cost",
        "plain_peak",
        "plain_peak_basis",
        "threads",
        "target",
        "device",
        "cost_model",
        "structure",
    )
    data["graph"] = {k: v for k, v in graph.graph.items() if k in kept}
    Path(path).write_text(json.dumps(data))
