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
lexicographic topological order of `solver.graph`.
"""

from __future__ import annotations

import json
from pathlib import Path

import networkx as nx

from solver.errors import GraphError

_ATTRIBUTE_MAPS = (("mem", "cost"), ("cost_ram", "cost_cpu"), ("out_cost", "duration"))


def graph_from_node_link(data: dict) -> nx.DiGraph:
    """Build a solver graph from node-link data (see the module docstring for the mappings)."""
    if not isinstance(data, dict) or "nodes" not in data:
        raise GraphError("not a node-link graph: expected a JSON object with 'nodes' and 'links'")
    graph = nx.DiGraph()
    for node in data["nodes"]:
        key = "id" if "id" in node else "name"
        if key not in node:
            raise GraphError(f"node {node!r} has neither an 'id' nor a 'name'")
        attrs = {k: v for k, v in node.items() if k != key}
        graph.add_node(node[key], **attrs)
    for link in data.get("links", data.get("edges", [])):
        src = link["source"] if "source" in link else link.get("0")
        dst = link["target"] if "target" in link else link.get("1")
        if src is None or dst is None:
            raise GraphError(f"link {link!r} has neither source/target nor '0'/'1' keys")
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
    for key in ("order", "name"):
        if key in data.get("graph", {}):
            graph.graph[key] = data["graph"][key]
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
    except (OSError, json.JSONDecodeError) as exc:
        raise GraphError(f"cannot read graph file {path}: {exc}") from exc
    try:
        graph = graph_from_node_link(data)
    except GraphError as exc:
        raise GraphError(f"{path}: {exc}") from exc
    graph.graph.setdefault("name", path.stem)
    return graph


def save_graph(graph: nx.DiGraph, path: str | Path) -> None:
    """Write a solver graph as node-link JSON with its `order`, readable by `load_graph`."""
    data = nx.node_link_data(graph, edges="links")
    data["graph"] = {k: v for k, v in graph.graph.items() if k in ("order", "name")}
    Path(path).write_text(json.dumps(data))
