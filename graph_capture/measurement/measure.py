"""Run the joint graph node by node on real tensors: storages, seconds, FLOPs and scratch bytes
per fx node. Each op runs as the executor runs it:
`graph_capture.measurement.fast_ops.implementation`.

Every value stays alive until the end of the run, so storage data pointers are unique and a
storage is identified by its pointer (zero-byte storages get a private key).
"""

from __future__ import annotations

import math
import operator
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial

import torch
from torch.utils._pytree import tree_flatten
from torch.utils.flop_counter import FlopCounterMode

from graph_capture.errors import CaptureError
from graph_capture.measurement.device import fork_rng, generator, synchronize
from graph_capture.measurement.fast_ops import implementation
from graph_capture.measurement.peak import measure_each
from graph_capture.trace.fx_nodes import describe_op, device_of
from graph_capture.trace.lifted import LiftedConstant, lifted_constants
from solver.deadline import NEVER, Deadline

StorageKey = tuple[int, int]
SECONDS_KEY = "remat_seconds"
"""fx node meta key of an op's seconds in a capture (measured, or predicted in estimate mode),
which ``remat calibrate`` reads."""
SCRATCH_KEY = "remat_scratch"
"""fx node meta key of an op's measured scratch bytes in a measured capture, which ``remat
calibrate`` reads."""
OpCall = Callable[[], object]
"""One op run on its inputs, bound (`_calls`)."""


@dataclass
class NodeMeasure:
    """One fx node's measurements.

    ``storages``: storage key -> bytes of every storage its tensor outputs reference;
    ``new_storages``: the subset this node allocated (not seen on any earlier value);
    ``seconds``: least wall time over the timed passes of `measure_joint` (the op run in step
    order, values dropped after their last use; other processes only ever add time);
    ``flops_counted``: what ``FlopCounterMode`` counts (matmul, conv, attention); ``flops``:
    that, or a numel-based estimate (one FLOP per element of the largest input or of all
    outputs, whichever is larger) for ops it counts as 0 that allocate memory;
    ``scratch_bytes``: measured on the device from real allocations, the most bytes the op
    held at any moment while it ran beyond what it left allocated when it returned (its
    output): workspaces and temporaries.
    """

    storages: dict[StorageKey, int]
    new_storages: set[StorageKey]
    seconds: float
    flops_counted: int
    flops: int
    shapes: list[tuple[int, ...]] = field(default_factory=list)
    dtypes: list[str] = field(default_factory=list)
    scratch_bytes: int = 0


def _tensors(value: object) -> list[torch.Tensor]:
    leaves, _ = tree_flatten(value)
    return [x for x in leaves if isinstance(x, torch.Tensor)]


def storages_of(value: object, rounding: int = 1) -> dict[StorageKey, int]:
    """Storage key -> bytes of every storage the tensors in ``value`` (a pytree) reference,
    each rounded up to a multiple of ``rounding`` (an allocator's block size). A real storage
    is keyed by its data pointer, a fake or meta one (no data) by its storage object."""
    found: dict[StorageKey, int] = {}
    for tensor in _tensors(value):
        storage = tensor.untyped_storage()
        nbytes = storage.nbytes()
        if storage.device.type == "meta":
            key = (0, storage._cdata)
        else:
            key = (storage.data_ptr(), 0) if nbytes else (0, id(storage))
        found[key] = -(-nbytes // rounding) * rounding
    return found


def is_random(node: torch.fx.Node) -> bool:
    """True when the node's op draws from the RNG (dropout, rand*, bernoulli, ...); an op with
    a ``dropout_p`` argument (the attention kernels) draws only where it is not 0."""
    tags = getattr(node.target, "tags", ())
    return torch.Tag.nondeterministic_seeded in tags and _dropout_p(node) != 0


def _dropout_p(node: torch.fx.Node) -> object:
    """The node's ``dropout_p`` argument (given or its schema's default), None where its op
    has none."""
    schema = getattr(node.target, "_schema", None)
    for i, argument in enumerate(schema.arguments if schema is not None else ()):
        if argument.name == "dropout_p":
            if i < len(node.args):
                return node.args[i]
            return node.kwargs.get("dropout_p", argument.default_value)
    return None


def estimate_flops(args: Sequence[object], out: object) -> int:
    largest_input = max((x.numel() for x in _tensors(args)), default=0)
    outputs = sum(x.numel() for x in _tensors(out))
    return max(largest_input, outputs)


@dataclass
class JointMeasure:
    """What `measure_joint` measured.

    ``nodes``: fx node name -> `NodeMeasure`; ``outputs``: the graph's flat outputs (a plain
    run's); ``pass_seconds``: the least wall time of one timed pass over the whole graph in step
    order (every op and what runs between ops: at least the sum of the ops' least seconds), or
    None when no pass was timed (``repeats`` 1).
    """

    nodes: dict[str, NodeMeasure]
    outputs: list[object]
    pass_seconds: float | None


RunNode = Callable[[torch.fx.Node, tuple, dict], tuple[object, NodeMeasure]]
"""Runs one fx call on its argument values: its value and its `NodeMeasure` (``new_storages``
left for `interpret` to fill)."""


def interpret(
    gm: torch.fx.GraphModule,
    args: Sequence[object],
    run_node: RunNode,
    storages: Callable[[object], dict[StorageKey, int]],
    *,
    static: object = (),
    on: str,
    deadline: Deadline = NEVER,
) -> tuple[dict[str, object], dict[str, NodeMeasure], list[object]]:
    """Run ``gm``'s calls in graph order with ``run_node``, every value kept: returns the values
    (fx node name -> value), the measures with ``new_storages`` set (the storages no placeholder,
    ``static`` value or earlier node holds, keyed by ``storages``) and the graph's flat outputs.
    Raises `CaptureError` for a node that is not a call, or naming the op that failed on ``on``
    (what the values are: "the example tensors", "fake tensors"), and `DeadlineError` before an
    op once ``deadline`` has passed."""
    env: dict[str, object] = {}
    measures: dict[str, NodeMeasure] = {}
    seen: set[StorageKey] = set()
    for node, value in zip(gm.graph.find_nodes(op="placeholder"), args, strict=True):
        env[node.name] = value
        seen.update(storages(value))
    seen.update(storages(static))
    outputs: list[object] = []
    for node in gm.graph.nodes:
        if node.op == "placeholder":
            continue
        if node.op == "output":
            outputs = list(torch.fx.node.map_arg(node.args[0], lambda n: env[n.name]))
            break
        if node.op != "call_function":
            raise CaptureError(
                f"unexpected fx node {node.op} '{node.name}' ({node.target}) in the joint "
                "graph; only calls can be measured and replayed"
            )
        deadline.check(f"running {node.name} on {on}")
        fn_args, fn_kwargs = torch.fx.node.map_arg(
            (node.args, node.kwargs), lambda n, env=env: env[n.name]
        )
        try:
            value, measure = run_node(node, fn_args, fn_kwargs)
        except CaptureError:
            raise
        except Exception as error:
            raise CaptureError(
                f"{describe_op(node)} failed on {on}: "
                f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
            ) from error
        measure.new_storages = {k for k in measure.storages if k not in seen}
        seen.update(measure.storages)
        env[node.name] = value
        measures[node.name] = measure
    return env, measures, outputs


def measure_joint(
    gm: torch.fx.GraphModule,
    args: Sequence[torch.Tensor],
    *,
    repeats: int = 5,
    deadline: Deadline = NEVER,
) -> JointMeasure:
    """Run ``gm`` once node by node (every value kept: storages, FLOPs), each op once more
    under the allocation profiler for its scratch bytes, then, with those values released,
    ``repeats - 1`` timed passes over the graph in order, each value dropped after its last use
    as a training step drops it (the RNG state restored after them): an op's seconds are its
    least over those passes (other processes only ever add time; a burst of load hits one pass,
    not every sample of an op), or its one run when ``repeats`` is 1; the least wall time of a
    whole pass is kept too (`JointMeasure.pass_seconds`).

    The outputs are those of a plain run: each node's value is from a run that started from
    the RNG state the plain run would have had. Ops run where their inputs are (the model's
    device); a lifted constant is static memory, like a placeholder. Raises `CaptureError`
    naming the op and its module when an op fails on the real tensors, and `DeadlineError` once
    ``deadline`` has passed: before each op of the first run, before the scratch bytes' runs and
    before each timed pass.
    """
    with torch.no_grad():
        env, measures, outputs = interpret(
            gm,
            args,
            _run_node,
            storages_of,
            static=lifted_constants(gm),
            on="the example tensors",
            deadline=deadline,
        )
        calls = _calls(gm, env)
        device = device_of(calls[0][0]) if calls else torch.device("cpu")
        with fork_rng(device):
            deadline.check("measuring the ops' scratch bytes")
            _measure_scratch(calls, measures, device)
            del calls
            env.clear()  # timed without them, as a step does not hold every value
            pass_seconds = _time_in_step_order(gm, args, measures, device, repeats - 1, deadline)
    return JointMeasure(measures, outputs, pass_seconds)


def step_drops(gm: torch.fx.GraphModule) -> list[tuple[torch.fx.Node, list[str]]]:
    """Every call of `gm` in graph order with the names of the values to drop right after it:
    those it reads last (or itself, when nothing reads it), as a training step frees them.
    Placeholders and what the graph output reads are never dropped. O(nodes + edges)."""
    last: dict[str, torch.fx.Node] = {}
    calls = [n for n in gm.graph.nodes if n.op == "call_function"]
    for node in calls:
        for source in node.all_input_nodes:
            if source.op == "call_function":
                last[source.name] = node
    (output,) = gm.graph.find_nodes(op="output")
    for source in output.all_input_nodes:
        last.pop(source.name, None)
    drops: dict[str, list[str]] = {n.name: [] for n in calls}
    for node in calls:
        if not node.users:
            drops[node.name].append(node.name)
    for name, reader in last.items():
        drops[reader.name].append(name)
    return [(node, drops[node.name]) for node in calls]


def _time_in_step_order(
    gm: torch.fx.GraphModule,
    args: Sequence[torch.Tensor],
    measures: dict[str, NodeMeasure],
    device: torch.device,
    passes: int,
    deadline: Deadline,
) -> float | None:
    """Set every op's ``seconds`` to its least over `passes` runs of the whole graph in order,
    each value dropped after its last use (`step_drops`): the op timed where a step runs it,
    after the ops before it, with the allocator and caches in the state a step leaves them (an
    op timed alone on values that all stay alive reads other caches and allocates elsewhere).
    Returns the least wall time of a whole pass (seconds), measured in the same passes as the
    ops, so both see the same machine; nothing changes and None comes back when `passes` < 1.
    Raises `DeadlineError` before a pass once `deadline` has passed."""
    if passes < 1:
        return None
    plan = [(node, drops, implementation(node)) for node, drops in step_drops(gm)]
    placeholders = [n.name for n in gm.graph.find_nodes(op="placeholder")]
    least: dict[str, float] = {}
    whole = math.inf
    for k in range(passes):
        deadline.check(f"timed pass {k + 1} of {passes}")
        synchronize(device)
        started = time.perf_counter()
        env: dict[str, object] = dict(zip(placeholders, args, strict=True))
        for node, drops, run in plan:
            fn_args, fn_kwargs = torch.fx.node.map_arg(
                (node.args, node.kwargs), lambda n, env=env: env[n.name]
            )
            synchronize(device)
            start = time.perf_counter()
            env[node.name] = run(*fn_args, **fn_kwargs)
            synchronize(device)
            seconds = time.perf_counter() - start
            if _computes(node):
                least[node.name] = min(least.get(node.name, seconds), seconds)
            fn_args = fn_kwargs = None
            for name in drops:
                del env[name]
        env.clear()
        synchronize(device)
        whole = min(whole, time.perf_counter() - started)
    for name, seconds in least.items():
        measures[name].seconds = seconds
    return whole


def _computes(node: torch.fx.Node) -> bool:
    """False for a getitem or a lifted constant: it picks or returns a value, computes none."""
    return node.target is not operator.getitem and not isinstance(node.target, LiftedConstant)


def _calls(gm: torch.fx.GraphModule, env: dict[str, object]) -> list[tuple[torch.fx.Node, OpCall]]:
    """Every op of `gm` (getitems and lifted constants aside, they compute nothing) with a
    zero-argument call running it on the values in `env`, in graph order."""
    calls = []
    for node in gm.graph.nodes:
        if node.op != "call_function" or not _computes(node):
            continue
        fn_args, fn_kwargs = torch.fx.node.map_arg((node.args, node.kwargs), lambda n: env[n.name])
        calls.append((node, partial(implementation(node), *fn_args, **fn_kwargs)))
    return calls


def _measure_scratch(
    calls: list[tuple[torch.fx.Node, OpCall]],
    measures: dict[str, NodeMeasure],
    device: torch.device,
) -> None:
    """Set every op's ``scratch_bytes``: one more run of each (`calls`), measured by
    `measure_each` on the device of the ops (the model's): the peak above the op's start less
    what it left allocated."""
    peaks = measure_each([call for _, call in calls], device)
    for (node, _), peak in zip(calls, peaks, strict=True):
        measures[node.name].scratch_bytes = max(0, peak.peak_bytes - peak.end_bytes)


def _run_node(node: torch.fx.Node, args: tuple, kwargs: dict) -> tuple[object, NodeMeasure]:
    """Run the op once for its FLOPs (RNG state restored after) and once timed for its value."""
    target = node.target
    if target is operator.getitem or isinstance(target, LiftedConstant):
        value = target(*args, **kwargs)
        return value, NodeMeasure(storages_of(value), set(), 0.0, 0, 0, *shapes_of(value))
    device = device_of(node)
    run = implementation(node)
    rng = generator(device) if is_random(node) else None
    state = rng.get_state() if rng is not None else None
    with FlopCounterMode(display=False) as counter:
        run(*args, **kwargs)
    if rng is not None:
        rng.set_state(state)
    synchronize(device)
    start = time.perf_counter()
    value = run(*args, **kwargs)
    synchronize(device)
    seconds = time.perf_counter() - start
    counted = int(counter.get_total_flops())
    storages = storages_of(value)
    allocates = any(k not in storages_of((args, kwargs)) for k in storages)
    flops = counted or (estimate_flops((args, kwargs), value) if allocates else 0)
    return value, NodeMeasure(storages, set(), seconds, counted, flops, *shapes_of(value))


def shapes_of(value: object) -> tuple[list[tuple[int, ...]], list[str]]:
    tensors = _tensors(value)
    return [tuple(t.shape) for t in tensors], [str(t.dtype).removeprefix("torch.") for t in tensors]
