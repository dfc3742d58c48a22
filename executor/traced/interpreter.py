"""Run a schedule's ops on the captured joint graph: a small loop, one method per op kind.

Call map (override a method to change one thing)::

    ScheduleInterpreter.run(ops, step)        one slice of a schedule (forward part or the rest)
      -> run_op(op, step)                     dispatch on the op kind
           -> compute(node, step)             run the fx nodes the DAG node stands for, in order
                -> run_node(slot, step)       one fx node; random ones go through step.rng
                -> record_results(slot, step) report outputs, gradients, new buffer values
           -> free(node, step)                drop the values of the DAG node's fx nodes
           -> offload(node, step)             copy them to the host (`executor.traced.offload`)
           -> reload(node, step)              copy them back into new device memory

Values live in `step.env`, a list indexed by fx-node slot: placeholders (parameters, buffers,
inputs, tangents) are set by the caller and never freed; every other slot holds a value exactly
while the schedule keeps its DAG node live, so the real memory follows the schedule. Graph
results (forward outputs, gradients, new buffer values) are reported to `step.on_result` at
their first compute (the schedule may free their DAG node before the step ends); the caller
keeps what it needs. `executor.traced.codegen` compiles the same semantics into straight-line code.

Offload and reload ops need `transfers` (the schedule's link says they run): an offload copies
the DAG node's live values to the host pool, a reload puts copies of them back in their slots.
Before a reloaded value is read, the compute stream waits for its reload (`Transfers.ready`),
and before a value is freed, for the copies it takes part in (`Transfers.settle`): on CUDA, where
the copies run on side streams; on CPU a copy has ended when its op returns.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import torch
import torch.fx

from executor.errors import ExecutorError
from executor.traced.offload import StepCopies, Transfers, static_storages
from executor.traced.rng import RngReplay
from graph_capture.measurement.measure import is_random
from graph_capture.trace.fx_nodes import device_of

__all__ = ["ScheduleInterpreter", "StepState", "has_node"]


@dataclass
class StepState:
    """The state of one training step as the interpreter runs it.

    `env`: live values by fx slot. `rng`: the step's random-state record. `static`: data
    pointers of the placeholders' storages (never copied to the host). `copies`: the step's host
    copies (offload and reload ops). `seen`: graph output
    positions already reported to `on_result`. `results`: what the caller chose to keep (by
    output position); the interpreter itself keeps no reference to a result.
    """

    env: list[object]
    rng: RngReplay
    static: set[int] = field(default_factory=set)
    copies: StepCopies = field(default_factory=StepCopies)
    seen: set[int] = field(default_factory=set)
    results: dict[int, object] = field(default_factory=dict)
    on_result: Callable[[StepState, int, object], None] | None = None


class ScheduleInterpreter:
    """Executes schedule ops on a joint fx graph; one instance serves every step.

    `members[v]`: the fx node names DAG node v computes, in order; every fx node other than
    placeholders and the output must belong to exactly one DAG node. `random_names`: fx nodes
    that draw random numbers (those `is_random` finds are added). `transfers`: what runs
    offload and reload ops (None: a schedule without them).
    """

    def __init__(
        self,
        graph_module: torch.fx.GraphModule,
        members: Mapping[Hashable, Sequence[str]],
        random_names: Iterable[str] = (),
        transfers: Transfers | None = None,
    ) -> None:
        graph = graph_module.graph
        self.nodes: list[torch.fx.Node] = [n for n in graph.nodes if n.op != "output"]
        self.slot = {n.name: i for i, n in enumerate(self.nodes)}
        self._calls: list[Callable[[list[object]], object] | None] = [
            self._compile(n) for n in self.nodes
        ]
        self.members: dict[Hashable, tuple[int, ...]] = {
            v: tuple(self.slot[name] for name in names) for v, names in members.items()
        }
        self._check_ownership()
        self.transfers = transfers
        owner = {s: v for v, slots in self.members.items() for s in slots}
        # DAG node -> the other DAG nodes whose values its fx nodes read
        self.reads: dict[Hashable, set[Hashable]] = {
            v: {
                owner[self.slot[a.name]]
                for s in slots
                for a in self.nodes[s].all_input_nodes
                if self.slot[a.name] in owner and owner[self.slot[a.name]] != v
            }
            for v, slots in self.members.items()
        }
        self.drop_after = self._group_temporaries(graph)
        named = {self.slot[name] for name in random_names}
        self.random_slots = [i for i, n in enumerate(self.nodes) if i in named or is_random(n)]
        self.random_set = set(self.random_slots)
        self._rng_devices = [device_of(self.nodes[s]) for s in self.random_slots]
        self._rng_dry_runs = [self._dry_run(s) for s in self.random_slots]
        output_node = next(n for n in graph.nodes if n.op == "output")
        outputs = output_node.args[0]
        # slot -> output positions it provides (one fx node may be several outputs)
        self.result_positions: dict[int, list[int]] = {}
        for position, value in enumerate(outputs):
            if isinstance(value, torch.fx.Node):
                self.result_positions.setdefault(self.slot[value.name], []).append(position)

    # ---- the loop -------------------------------------------------------------------------
    def run(self, ops: Iterable[tuple[str, Hashable]], step: StepState) -> None:
        """Run `ops` in order on `step`."""
        for op in ops:
            self.run_op(op, step)

    def run_op(self, op: tuple[str, Hashable], step: StepState) -> None:
        """Dispatch one op to the method named after its kind."""
        kind, node = op
        if kind == "compute":
            self.compute(node, step)
        elif kind == "free":
            self.free(node, step)
        elif kind == "offload":
            self.offload(node, step)
        elif kind == "reload":
            self.reload(node, step)
        else:
            raise ExecutorError(
                f"unknown op kind {kind!r} (expected 'compute', 'free', 'offload' or 'reload')"
            )

    def compute(self, node: Hashable, step: StepState) -> None:
        """Compute DAG node `node`: run its fx nodes in order, report graph results, and drop
        each value only the group itself reads after its last use (the group's temporaries)."""
        env = step.env
        if step.copies.arriving:
            for u in self.reads[node]:
                self.copier().ready(step.copies, u)
        for slot in self.members[node]:
            env[slot] = self.run_node(slot, step)
            if slot in self.result_positions:
                self.record_results(slot, step)
            for internal in self.drop_after[slot]:
                env[internal] = None

    def free(self, node: Hashable, step: StepState) -> None:
        """Free DAG node `node`: drop the values of its fx nodes."""
        if step.copies.arriving or step.copies.offloading:
            self.copier().settle(step.copies, node)
        env = step.env
        for slot in self.members[node]:
            env[slot] = None

    def offload(self, node: Hashable, step: StepState) -> None:
        """Copy DAG node `node`'s live values to the host pool (they stay live until freed)."""
        env = step.env
        values = {s: env[s] for s in self.members[node] if env[s] is not None}
        self.copier().offload(step.copies, node, values, step.static)

    def reload(self, node: Hashable, step: StepState) -> None:
        """Copy DAG node `node`'s values back from the host pool into their slots."""
        env = step.env
        for slot, value in self.copier().reload(step.copies, node).items():
            env[slot] = value

    def copier(self) -> Transfers:
        """The `Transfers` that run offload and reload ops; ExecutorError where there is none."""
        if self.transfers is None:
            raise ExecutorError(
                "the schedule offloads or reloads, but this interpreter has no transfers to run "
                "the copies: give ScheduleInterpreter(..., transfers=Transfers(device, reloads))"
            )
        return self.transfers

    def run_node(self, slot: int, step: StepState) -> object:
        """Run one fx node on the live values; random nodes replay eager's generator state."""
        call = self._calls[slot]
        if call is None:
            raise ExecutorError(f"fx node {self.nodes[slot].name} is a placeholder; it is not run")
        env = step.env
        try:
            if slot in self.random_set:
                return step.rng.draw(slot, lambda: call(env))
            return call(env)
        except _MissingValue as missing:
            raise ExecutorError(
                f"fx node {self.nodes[slot].name} reads {missing.args[0]}, which is not live: "
                "the capture's DAG lacks that edge (a graph_capture bug; please report it)"
            ) from None

    def record_results(self, slot: int, step: StepState) -> None:
        """Report the first value of each graph output `slot` provides to `step.on_result`
        (recomputes give bit-identical values, so later ones are not reported again)."""
        value = step.env[slot]
        for position in self.result_positions[slot]:
            if position in step.seen:
                continue
            step.seen.add(position)
            if step.on_result is not None:
                step.on_result(step, position, value)

    # ---- setup helpers --------------------------------------------------------------------
    def new_step(self) -> StepState:
        """A fresh step: empty values and a fresh RNG record (states are drawn per step)."""
        env: list[object] = [None] * len(self.nodes)
        return StepState(env, RngReplay(self.random_slots, self._rng_devices, self._rng_dry_runs))

    def set_placeholders(
        self, step: StepState, names: Sequence[str], values: Sequence[object]
    ) -> None:
        """Bind placeholder values (by fx name); with transfers, their storages are the step's
        static ones (never copied)."""
        for name, value in zip(names, values, strict=True):
            step.env[self.slot[name]] = value
        if self.transfers is not None:
            step.static |= static_storages(values)

    def _check_ownership(self) -> None:
        owner: dict[int, Hashable] = {}
        for v, slots in self.members.items():
            for s in slots:
                if s in owner:
                    raise ExecutorError(
                        f"fx node {self.nodes[s].name} belongs to DAG nodes {owner[s]!r} and "
                        f"{v!r}; each fx node must belong to one DAG node"
                    )
                owner[s] = v
        for i, n in enumerate(self.nodes):
            if n.op != "placeholder" and i not in owner:
                raise ExecutorError(
                    f"fx node {n.name} belongs to no DAG node, so no schedule computes it; the "
                    "capture's `members` must cover every non-placeholder node"
                )

    def _group_temporaries(self, graph: torch.fx.Graph) -> list[tuple[int, ...]]:
        """For each slot, the group-internal slots whose last reader it is (or itself, when
        nothing reads it): values no other group and no graph output reads."""
        drop_after: list[list[int]] = [[] for _ in self.nodes]
        for slots in self.members.values():
            inside = set(slots)
            position = {s: k for k, s in enumerate(slots)}
            for s in slots:
                readers = [u for u in self.nodes[s].users if u.op != "output"]
                if any(u.op == "output" for u in self.nodes[s].users) or any(
                    self.slot[u.name] not in inside for u in readers
                ):
                    continue
                last = max((self.slot[u.name] for u in readers), key=position.get, default=s)
                drop_after[last].append(s)
        return [tuple(d) for d in drop_after]

    def _compile(self, node: torch.fx.Node) -> Callable[[list[object]], object] | None:
        if node.op == "placeholder":
            return None
        if node.op != "call_function":
            raise ExecutorError(
                f"fx node {node.name} is a {node.op}; the joint graph must be call_function only"
            )
        target = node.target
        if target is operator.getitem and isinstance(node.args[0], torch.fx.Node):
            source, index = self.slot[node.args[0].name], node.args[1]

            def getitem(env: list[object]) -> object:
                value = env[source]
                if value is None:
                    raise _MissingValue(self.nodes[source].name)
                return value[index]

            return getitem
        args = _fetcher(node.args, self.slot, self.nodes)
        kwargs = _fetcher(node.kwargs, self.slot, self.nodes)

        def call(env: list[object]) -> object:
            return target(*args(env), **kwargs(env))

        return call

    def _dry_run(self, slot: int) -> Callable[[], object]:
        """The node's op on zero tensors of the traced shapes: the same draws, values unused."""
        node = self.nodes[slot]

        def zeros(n: torch.fx.Node) -> object:
            val = n.meta.get("val")
            if isinstance(val, torch.Tensor):
                return torch.zeros(val.shape, dtype=val.dtype, device=val.device)
            raise ExecutorError(
                f"random fx node {node.name} is drawn out of eager order and its input {n.name} "
                "has no traced shape (meta['val']) to dry-run it with"
            )

        def run() -> object:
            args = torch.fx.node.map_arg(node.args, zeros)
            kwargs = torch.fx.node.map_arg(node.kwargs, zeros)
            return node.target(*args, **kwargs)

        return run


class _MissingValue(LookupError):
    pass


def _fetcher(
    structure: object, slot: dict[str, int], nodes: list[torch.fx.Node]
) -> Callable[[list[object]], object]:
    """A function env -> `structure` with every fx Node replaced by its live value."""
    if isinstance(structure, torch.fx.Node):
        i = slot[structure.name]

        def fetch(env: list[object]) -> object:
            value = env[i]
            if value is None:
                raise _MissingValue(nodes[i].name)
            return value

        return fetch
    if isinstance(structure, tuple | list):
        parts = [_fetcher(s, slot, nodes) for s in structure]
        if not any(has_node(s) for s in structure):
            constant = structure
            return lambda env: constant
        kind = type(structure)
        return lambda env: kind(p(env) for p in parts)
    if isinstance(structure, dict):
        keys = list(structure)
        parts_d = [_fetcher(structure[k], slot, nodes) for k in keys]
        if not any(has_node(structure[k]) for k in keys):
            constant_d = dict(structure)
            return lambda env: constant_d
        return lambda env: {k: p(env) for k, p in zip(keys, parts_d, strict=True)}
    return lambda env: structure


def has_node(structure: object) -> bool:
    """Whether `structure` (an fx argument: a node, a container of them, a constant) holds
    an fx node anywhere."""
    found = False

    def mark(n: torch.fx.Node) -> torch.fx.Node:
        nonlocal found
        found = True
        return n

    torch.fx.node.map_arg(structure, mark)
    return found
