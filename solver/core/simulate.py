"""Independent checker of the execution semantics: validity, peak memory and cost of a schedule.

Semantics (the README and docs/offload.md state the same):

- `("compute", v)` is valid only if every predecessor of v is live and v itself is not live;
  v becomes live.
- `("free", v)` is valid only if v is live; v stops being live.
- every node is computed at least once.
- peak = the maximum, over compute ops, of the sum of `mem` over live values just after that
  compute (the new value and its still-live inputs included) plus the computed node's
  `transient` bytes (0 when absent), and over reload ops of the bytes live just after it.
  Frees never raise the peak.
- cost = the sum of `cost` over compute ops, plus, with a host link, the time the compute
  stream waits for copies (the stall).

With a `Link` (docs/offload.md), `("offload", v)` copies a live v to the host (at most once per
value) and `("reload", v)` copies it back (v offloaded before and not live; v becomes live).
One clock, the compute stream's: a compute advances it by the node's cost, after waiting for
the reloads of its inputs still arriving; a free waits for the end of v's offload and of the
reload that made this copy; an offload (reload) is issued at the clock and runs on its
direction's engine (on the one engine of a link that is not `duplex`), one copy at a time in
issue order, a reload not before its value's offload has ended, each taking its direction's
latency plus its bytes over its bandwidth. The cost is the time at which the clock and the
engines are done. A host copy holds `link.host_bytes(mem)` bytes from its offload until the
compute stream has waited for the end of its value's last reload (the first compute that reads
the reloaded value, or its free), through the offload itself where never reloaded: a reload
still in flight holds its host buffer. The host peak, after each offload, must be within the
link's `host_memory`.

This module reads the graph's attributes directly and shares no code with the solvers, so that
every schedule they produce is checked by something that did not produce it.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Iterable
from dataclasses import dataclass

import networkx as nx

from solver.core.link import Link
from solver.errors import InvalidScheduleError

Op = tuple[str, Hashable]
"""A schedule op: (kind, node), kind one of "compute", "free", "offload", "reload"."""


@dataclass(frozen=True)
class Simulation:
    """What `simulate` found. `peak` and `host_peak` are in bytes, `cost` and `stall` in the
    graph's cost unit (`cost` includes `stall`: the compute cost is `cost - stall`).

    `computes` counts compute ops, `recomputes` the compute ops beyond each node's first,
    `offloads` and `reloads` the copies. `error` is None for a valid schedule, else the first
    violation (with its op index).
    """

    valid: bool
    peak: int
    cost: float
    computes: int
    recomputes: int
    error: str | None
    stall: float = 0.0
    host_peak: int = 0
    offloads: int = 0
    reloads: int = 0

    def raise_if_invalid(self) -> None:
        """Raise InvalidScheduleError with the first violation when the schedule is invalid."""
        if not self.valid:
            raise InvalidScheduleError(f"invalid schedule: {self.error}")


def simulate(graph: nx.DiGraph, ops: Iterable[Op], link: Link | None = None) -> Simulation:
    """Replay `ops` on `graph` (with `link`, its offload and reload ops too) and return validity,
    peak bytes and total cost.

    Runs in O(len(ops) * max in-degree). Never raises on a bad schedule: the result says why it
    is invalid (call `raise_if_invalid()` to turn that into an exception).
    """
    ops = list(ops)
    replay = _Replay(graph, link, {op[1]: step for step, op in _indexed(ops) if op[0] == "reload"})
    for step, op in enumerate(ops):
        if not (isinstance(op, tuple | list) and len(op) == 2):
            return replay.result(f"op {step}: {op!r} is not a (kind, node) pair")
        kind, v = op
        if v not in graph:
            return replay.result(f"op {step}: {kind} of unknown node {v!r}")
        if kind in ("offload", "reload") and link is None:
            return replay.result(
                f"op {step}: {kind} {v!r} needs a host link (simulate(..., link=))"
            )
        if kind not in _KINDS:
            return replay.result(
                f"op {step}: unknown op kind {kind!r} (expected 'compute', 'free', 'offload' or "
                "'reload')"
            )
        error = getattr(replay, kind)(v, step)
        if error is not None:
            return replay.result(f"op {step}: {error}")
    never = [v for v in graph.nodes if v not in replay.computed]
    if never:
        return replay.result(
            f"node {never[0]!r} is never computed ({len(never)} nodes never computed)"
        )
    return replay.result(None)


_KINDS = ("compute", "free", "offload", "reload")


class _Replay:
    """`simulate`'s state: what is live (and its bytes, the peak), the compute stream's clock
    and its waits, when each copy engine is next idle (equal: one shared engine), the host's
    bytes. Each op kind is a method that applies the op and returns None, or what makes it
    invalid. `last_reload`: the step of each value's last reload."""

    def __init__(
        self, graph: nx.DiGraph, link: Link | None, last_reload: dict[Hashable, int]
    ) -> None:
        self.graph, self.link, self.last_reload = graph, link, last_reload
        self.live: set[Hashable] = set()
        self.computed: set[Hashable] = set()
        self.live_bytes = self.peak = 0
        self.costs: list[float] = []
        self.computes = self.recomputes = 0
        self.clock = 0.0  # the compute stream's time
        self.waited = 0.0
        self.d2h_free = self.h2d_free = 0.0
        self.offload_end: dict[Hashable, float] = {}
        self.arrival: dict[Hashable, float] = {}  # end of the reload that made v's live copy
        self.releasing: set[Hashable] = set()  # last reload issued, not yet waited for: held
        self.host_bytes = self.host_peak = 0
        self.offloads = self.reloads = 0

    def result(self, error: str | None) -> Simulation:
        end = max(self.clock, self.d2h_free, self.h2d_free)
        stall = self.waited + (end - self.clock)
        return Simulation(
            error is None,
            self.peak,
            math.fsum(self.costs) + stall,
            self.computes,
            self.recomputes,
            error,
            stall,
            self.host_peak,
            self.offloads,
            self.reloads,
        )

    def _wait(self, until: float) -> None:
        if until > self.clock:
            self.waited += until - self.clock
            self.clock = until

    def _release(self, v: Hashable) -> None:
        """The clock has waited for v's last reload: its host copy is held no longer."""
        if v in self.releasing:
            assert self.link is not None
            self.releasing.remove(v)
            self.host_bytes -= self.link.host_bytes(self.graph.nodes[v]["mem"])

    def compute(self, v: Hashable, step: int) -> str | None:
        if v in self.live:
            return f"compute {v!r} while it is already live"
        graph = self.graph
        missing = [u for u in graph.predecessors(v) if u not in self.live]
        if missing:
            return f"compute {v!r} needs {missing[0]!r}, which is not live"
        for u in graph.predecessors(v):
            self._wait(self.arrival.get(u, 0.0))
            self._release(u)
        node = graph.nodes[v]
        self.clock += node["cost"]
        self.live.add(v)
        self.live_bytes += node["mem"]
        self.peak = max(self.peak, self.live_bytes + node.get("transient", 0))
        self.costs.append(node["cost"])
        self.computes += 1
        if v in self.computed:
            self.recomputes += 1
        self.computed.add(v)
        return None

    def free(self, v: Hashable, step: int) -> str | None:
        if v not in self.live:
            return f"free {v!r}, which is not live"
        self._wait(self.offload_end.get(v, 0.0))
        self._wait(self.arrival.pop(v, 0.0))
        self._release(v)
        self.live.remove(v)
        self.live_bytes -= self.graph.nodes[v]["mem"]
        return None

    def offload(self, v: Hashable, step: int) -> str | None:
        link = self.link
        assert link is not None
        if v not in self.live:
            return f"offload {v!r}, which is not live"
        if v in self.offload_end:
            return f"offload {v!r} a second time (once per value)"
        mem = self.graph.nodes[v]["mem"]
        self.d2h_free = max(self.clock, self.d2h_free) + link.d2h_latency + mem / link.d2h
        if not link.duplex:  # one engine: the next reload queues behind this copy
            self.h2d_free = self.d2h_free
        self.offload_end[v] = self.d2h_free
        self.offloads += 1
        self.host_bytes += link.host_bytes(mem)
        self.host_peak = max(self.host_peak, self.host_bytes)
        if link.host_memory is not None and self.host_bytes > link.host_memory:
            return (
                f"offload {v!r} puts {self.host_bytes} bytes on the host, over the link's "
                f"host_memory of {link.host_memory}"
            )
        if v not in self.last_reload or self.last_reload[v] < step:  # never reloaded
            self.host_bytes -= link.host_bytes(mem)  # held no longer
        return None

    def reload(self, v: Hashable, step: int) -> str | None:
        link = self.link
        assert link is not None
        if v not in self.offload_end:
            return f"reload {v!r}, which was never offloaded"
        if v in self.live:
            return f"reload {v!r} while it is already live"
        mem = self.graph.nodes[v]["mem"]
        ready = max(self.clock, self.h2d_free, self.offload_end[v])
        self.h2d_free = ready + link.h2d_latency + mem / link.h2d
        if not link.duplex:
            self.d2h_free = self.h2d_free
        self.arrival[v] = self.h2d_free
        self.reloads += 1
        self.live.add(v)
        self.live_bytes += mem
        self.peak = max(self.peak, self.live_bytes)
        if self.last_reload[v] == step:  # held until the compute stream waits for this copy
            self.releasing.add(v)
        return None


def _indexed(ops: list) -> Iterable[tuple[int, tuple]]:
    """(step, op) for the well-formed (kind, node) pairs of `ops` (the others are reported
    where the replay reaches them)."""
    for step, op in enumerate(ops):
        if isinstance(op, tuple | list) and len(op) == 2:
            try:
                hash(op[1])
            except TypeError:
                continue
            yield step, op
