"""Compile a slice of a schedule into one straight-line Python function (the fast path).

`ScheduleInterpreter` walks ops one by one and is the reference: readable, easy to override.
Its per-op dispatch costs ~10 us per fx node, which on a small model is as much as the kernels
themselves. `compile_ops` emits the same semantics as Python source, the way `torch.fx`
generates `GraphModule.forward`: values become local variables, a free becomes ``vN = None``,
a group temporary is dropped after its last reader, and everything that the interpreter decides
at run time is decided once at compile time:

- which compute is the first of a graph result in the whole schedule (only that one is reported);
- whether every read value is live (a missing DAG edge fails at compile time, not mid-step);
- which values are live at the slice's end (stored back into ``step.env``; the rest is released;
  live-in values are moved out of ``step.env`` into locals so a free really releases them);
- which slots an offload copies and a reload restores, and where the compute stream must wait
  for a copy (`Transfers.ready` before the first read of a reloaded value, `Transfers.settle`
  before the free of a value in a copy).

Random nodes still go through ``step.rng.draw``, so replay is the interpreter's. An op with a
faster CPU implementation (`graph_capture.measurement.fast_ops`) calls it, where the interpreter
calls the aten op itself: the tests that hold the two to the same bits check one against the other.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass, field

import torch
import torch.fx

from executor.errors import ExecutorError
from executor.traced.bindings import bindings
from executor.traced.interpreter import ScheduleInterpreter, StepState, has_node
from graph_capture.measurement.fast_ops import implementation
from solver.core.schedule import Op

__all__ = ["SliceState", "compile_ops"]


@dataclass
class SliceState:
    """What the compile of one slice leaves the next (updated in place by `compile_ops`).

    `reported`: graph output positions already reported, so each result is reported to
    ``step.on_result`` exactly once per step, at its first compute. `offloaded`: the slots
    each offloaded DAG node's host copy holds. `arriving`: reloaded DAG nodes whose reload
    the compute stream has not yet waited for; `copying`: offloaded DAG nodes whose first
    device copy is not yet freed.
    """

    reported: set[int] = field(default_factory=set)
    offloaded: dict[Hashable, tuple[int, ...]] = field(default_factory=dict)
    arriving: set[Hashable] = field(default_factory=set)
    copying: set[Hashable] = field(default_factory=set)


class _Source:
    def __init__(self) -> None:
        self.lines: list[str] = []
        self.constants: dict[str, object] = {}
        self.called: set[int] = set()

    def constant(self, value: object) -> str:
        name = f"k{len(self.constants)}"
        self.constants[name] = value
        return name

    def expression(self, structure: object, live: set[int], interp: ScheduleInterpreter) -> str:
        if isinstance(structure, torch.fx.Node):
            slot = interp.slot[structure.name]
            if slot not in live:
                raise ExecutorError(
                    f"the schedule reads fx node {structure.name} while it is not live: the "
                    "capture's DAG lacks that edge (a graph_capture bug; please report it)"
                )
            return f"v{slot}"
        if isinstance(structure, list | tuple) and has_node(structure):
            inner = ", ".join(self.expression(s, live, interp) for s in structure)
            return f"[{inner}]" if isinstance(structure, list) else f"({inner},)"
        if isinstance(structure, dict) and has_node(structure):
            items = ", ".join(
                f"{k!r}: {self.expression(s, live, interp)}" for k, s in structure.items()
            )
            return f"{{{items}}}"
        if isinstance(structure, bool | int | str | type(None)) or (
            isinstance(structure, float) and math.isfinite(structure)
        ):
            return repr(structure)
        return self.constant(structure)


def compile_ops(
    interp: ScheduleInterpreter,
    ops: Sequence[Op],
    live_in: Iterable[int],
    state: SliceState,
) -> tuple[Callable[[StepState], None], set[int]]:
    """Compile `ops` into ``run(step)``; returns it and the slots live after it.

    `live_in`: slots holding values in ``step.env`` when the slice starts. `state`: what the
    slices compiled before this one of the same schedule left (`SliceState`), updated in place.
    Offload and reload ops call ``interp.copier()``, the interpreter's `Transfers`.
    """
    src = _Source()
    live = set(live_in)
    start = sorted(live)
    body: list[str] = []
    reported = state.reported

    for kind, v in ops:
        if kind == "free":
            if v in state.arriving or v in state.copying:
                state.arriving.discard(v)
                state.copying.discard(v)
                body.append(f"transfers.settle(copies, {src.constant(v)})")
            for slot in interp.members[v]:
                if slot in live:
                    live.discard(slot)
                    body.append(f"v{slot} = None")
            continue
        if kind == "offload":
            slots = tuple(s for s in interp.members[v] if s in live)
            state.offloaded[v] = slots
            state.copying.add(v)
            values = ", ".join(f"{s}: v{s}" for s in slots)
            body.append(f"transfers.offload(copies, {src.constant(v)}, {{{values}}}, step.static)")
            continue
        if kind == "reload":
            state.arriving.add(v)
            body.append(f"reloaded = transfers.reload(copies, {src.constant(v)})")
            for s in state.offloaded[v]:
                live.add(s)
                body.append(f"v{s} = reloaded[{s}]")
            body.append("reloaded = None")  # a free must release the values: no other reference
            continue
        if kind != "compute":
            raise ExecutorError(
                f"unknown op kind {kind!r} (expected 'compute', 'free', 'offload' or 'reload')"
            )
        for u in interp.reads[v] & state.arriving:
            state.arriving.discard(u)
            body.append(f"transfers.ready(copies, {src.constant(u)})")
        for slot in interp.members[v]:
            body.append(_node_line(src, interp, slot, live))
            live.add(slot)
            for position in interp.result_positions.get(slot, ()):
                if position not in reported:
                    reported.add(position)
                    body.append(f"on_result(step, {position}, v{slot})")
            for internal in interp.drop_after[slot]:
                live.discard(internal)
                body.append(f"v{internal} = None")
    lines = ["def run(step):", "    env = step.env", "    draw = step.rng.draw"]
    lines.append("    on_result = step.on_result")
    if state.offloaded:
        lines.append("    copies = step.copies")
    # move live-in values into locals (env must not keep them alive past their free)
    lines += [f"    v{s} = env[{s}]; env[{s}] = None" for s in start]
    lines += [f"    {line}" for line in body]
    lines += [f"    env[{s}] = v{s}" for s in sorted(live)]
    lines.append("    return None")
    namespace: dict[str, object] = dict(src.constants)
    if state.offloaded:
        namespace["transfers"] = interp.copier()
    namespace.update(_callables(interp, src))
    code = compile("\n".join(lines), "<remat schedule>", "exec")
    exec(code, namespace)
    return namespace["run"], live  # type: ignore[return-value]


def _callables(interp: ScheduleInterpreter, src: _Source) -> dict[str, object]:
    """``f<slot>``, the callable each node the source calls runs: the op's faster CPU
    implementation where it has one (`graph_capture.measurement.fast_ops`), else torch's own
    binding where it makes the node's exact call (`executor.traced.bindings`), else the
    OpOverload's `_op`, the C++ callable its Python __call__ forwards to."""
    called = {slot: interp.nodes[slot] for slot in sorted(src.called)}
    runs = {slot: implementation(n) for slot, n in called.items()}
    bound = bindings(n for slot, n in called.items() if runs[slot] is n.target)
    for slot, n in called.items():
        if runs[slot] is n.target:
            runs[slot] = bound.get(n) or getattr(n.target, "_op", n.target)
    return {f"f{slot}": run for slot, run in runs.items()}


def _node_line(src: _Source, interp: ScheduleInterpreter, slot: int, live: set[int]) -> str:
    node = interp.nodes[slot]
    if node.op != "call_function":
        raise ExecutorError(f"fx node {node.name} is a {node.op}; only call_function runs")
    args = [src.expression(a, live, interp) for a in node.args]
    if node.target is operator.getitem:
        return f"v{slot} = {args[0]}[{args[1]}]"
    args += [f"{k}={src.expression(a, live, interp)}" for k, a in node.kwargs.items()]
    src.called.add(slot)
    call = f"f{slot}({', '.join(args)})"
    if slot in interp.random_set:
        return f"v{slot} = draw({slot}, lambda: {call})"
    return f"v{slot} = {call}"
