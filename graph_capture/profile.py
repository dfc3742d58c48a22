"""Activation profile of a captured graph: where the activation bytes and FLOPs are.

For each module (path truncated to ``depth`` components; ``None`` = innermost module) over
the op-granularity DAG: ``activation_bytes`` (bytes of the forward nodes' outputs),
``saved_bytes`` (the part a backward node reads: what checkpoint-all keeps until the
backward), ``forward_flops`` / ``backward_flops`` and ``forward_seconds``, and
``saved_bytes_per_flop`` = saved bytes / forward FLOPs: a high value marks activations that
are cheap to recompute for the memory they hold.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from graph_capture.captured import CapturedGraph
from solver.core.budget import human_bytes


@dataclass
class ModuleProfile:
    """Totals of one module (units in the field names; see the module docstring)."""

    module: str
    forward_nodes: int = 0
    activation_bytes: int = 0
    saved_bytes: int = 0
    forward_flops: int = 0
    backward_flops: int = 0
    forward_seconds: float = 0.0

    @property
    def saved_bytes_per_flop(self) -> float:
        return self.saved_bytes / self.forward_flops if self.forward_flops else float("inf")


def _truncate(path: str, depth: int | None) -> str:
    if depth is None or not path:
        return path or "(root)"
    return ".".join(path.split(".")[:depth])


def module_profile(graph: CapturedGraph, depth: int | None = None) -> list[ModuleProfile]:
    """Per-module totals, in first-appearance order of the forward pass."""
    dag = graph.dag
    rows: dict[str, ModuleProfile] = {}
    for v in graph.order:
        attrs = dag.nodes[v]
        key = _truncate(attrs["module"], depth)
        row = rows.setdefault(key, ModuleProfile(key))
        if attrs["backward"]:
            row.backward_flops += attrs["flops"]
            continue
        row.forward_nodes += 1
        row.activation_bytes += attrs["mem"]
        row.forward_flops += attrs["flops"]
        row.forward_seconds += attrs["time"]
        if any(dag.nodes[s]["backward"] for s in dag.successors(v)):
            row.saved_bytes += attrs["mem"]
    return list(rows.values())


def format_table(rows: Iterable[ModuleProfile], title: str) -> str:
    """A fixed-width text table of module profiles."""
    header = (
        f"{'module':32s} {'fw nodes':>8s} {'activations':>12s} {'saved':>12s} "
        f"{'fw FLOPs':>10s} {'bw FLOPs':>10s} {'fw ms':>8s} {'saved B/FLOP':>12s}"
    )
    lines = [title, header, "-" * len(header)]
    for r in rows:
        lines.append(
            f"{r.module[:32]:32s} {r.forward_nodes:8d} {human_bytes(r.activation_bytes):>12s} "
            f"{human_bytes(r.saved_bytes):>12s} {r.forward_flops:10.3g} {r.backward_flops:10.3g} "
            f"{r.forward_seconds * 1e3:8.3f} {r.saved_bytes_per_flop:12.4g}"
        )
    return "\n".join(lines)


def plot_saved_bytes(rows: list[ModuleProfile], path: str, title: str) -> None:
    """Save a horizontal bar chart of saved activation bytes per module to ``path``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, max(2.5, 0.3 * len(rows) + 1)))
    names = [r.module for r in rows][::-1]
    values = [r.saved_bytes / 2**20 for r in rows][::-1]
    ax.barh(names, values, color="tab:blue", label="saved for backward")
    ax.barh(
        names,
        [(r.activation_bytes - r.saved_bytes) / 2**20 for r in rows][::-1],
        left=values,
        color="tab:gray",
        label="freed in forward",
    )
    ax.set_xlabel("activation MiB")
    ax.set_title(title)
    ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
