"""Transient bytes of a DAG node: what computing it holds beyond its inputs and its output.

A DAG node runs its fx members in order (`executor`: a member nothing outside the node reads is
dropped right after its last reader in the node). While member m runs, the node holds

    held(m) = bytes of the storages earlier members created that are still referenced
    moment(m) = held(m) + new bytes of m + scratch of m        (``NodeMeasure``, measured)

and the node's transient is ``max(0, max_m moment(m) - mem)``: the most bytes it holds at any
moment above its inputs, less its output (``mem``, which the solver counts as live from the
compute on). So computing v needs at most ``live + mem(v) + transient(v)`` bytes, where live
is what was live before and stays live (its inputs included).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from graph_capture.measurement.measure import NodeMeasure, StorageKey

__all__ = ["group_transient"]


def _drop_points(nodes: Sequence[torch.fx.Node]) -> dict[str, str]:
    """Member name -> the member after which the executor drops it (absent: kept to the end
    of the node, because something outside the node or the graph output reads it)."""
    inside = {n.name for n in nodes}
    position = {n.name: k for k, n in enumerate(nodes)}
    drops: dict[str, str] = {}
    for node in nodes:
        users = list(node.users)
        if any(u.op == "output" or u.name not in inside for u in users):
            continue
        drops[node.name] = max((u.name for u in users), key=position.get, default=node.name)
    return drops


def group_transient(
    nodes: Sequence[torch.fx.Node], measures: dict[str, NodeMeasure], mem: int
) -> int:
    """Transient bytes of the DAG node whose fx members are `nodes` (in execution order) and
    whose output is `mem` bytes (see the module docstring). O(members x storages)."""
    drops = _drop_points(nodes)
    dropped_after: dict[str, list[str]] = {}
    for name, last in drops.items():
        dropped_after.setdefault(last, []).append(name)
    created: set[StorageKey] = set()
    refs: dict[StorageKey, int] = {}  # created storage -> members holding it
    size: dict[StorageKey, int] = {}
    held = most = 0
    for node in nodes:
        measure = measures[node.name]
        new = measure.new_storages
        new_bytes = sum(measure.storages[k] for k in new)
        most = max(most, held + new_bytes + measure.scratch_bytes)
        created |= new
        for key in measure.storages:
            if key in created:
                size[key] = measure.storages[key]
                held += size[key] if refs.get(key, 0) == 0 else 0
                refs[key] = refs.get(key, 0) + 1
        for name in dropped_after.get(node.name, ()):
            for key in measures[name].storages:
                if key in created:
                    refs[key] -= 1
                    held -= size[key] if refs[key] == 0 else 0
    return max(0, most - mem)
