"""remat's offload against whole-activation offload (docs/offload.md, "Against torch's pass,
torchtune's hooks and HF's save_on_cpu").

    python -m benchmarks.running.offload_compare [--models gpt stack] [--budget 0.5]
                                                 [--time-limit 20] [--reps 15]

Per model, one row per method, each a real training step here (one thread), its parameters'
gradients compared to eager's with `torch.equal`:

- ``eager``: nothing offloaded.
- ``save_on_cpu``: `torch.autograd.graph.save_on_cpu`'s semantics (its source, torch 2.13):
  every tensor autograd saves is copied to a new contiguous host tensor of its size when saved
  (parameters' views too) and copied back to a new device tensor when the backward reads it;
  both copies on the compute stream, so on a GPU each copy's link time adds to the step.
- ``HF offload``: HF transformers' ``activation_checkpointing_enable(offload=True)``
  (transformers 5.x ``modeling_utils``): each block under non-reentrant
  `torch.utils.checkpoint`, the call inside ``save_on_cpu``, so what reaches the hooks is what
  checkpoint saves (the block's inputs); the blocks' forwards rerun in the backward.
- ``torchtune``: torchtune's ``OffloadActivations`` semantics as its documentation and source
  state them (torchtune is not installed; written here): a saved tensor of at least 1 KiB
  (``min_offload_size``, its elements' bytes) that is not an ``nn.Parameter`` or
  ``nn.Buffer`` is copied to a host tensor of its layout (``empty_like``) when saved, the device
  source held until five later saves (``max_fwd_stash_size``: on a GPU the copy runs on a side
  stream, and the compute stream waits for it there); the backward reads a tensor still so held
  from the device, else copies it back when its node reads it, the copy held until the next
  node has run; smaller tensors and parameters stay on the device. Left out: its views trick
  (a reloaded tensor's storage kept past its node where views of it outlive the unpack).
- ``remat keep/recompute``, ``remat offload``: the own executor (`executor.Rematerialized`)
  under `solver.solve` at the budget, without and with the H100's host link
  (``offload=host_link("h100")``, PCIe Gen5, 64 GB/s each way).

Every host copy, the baselines' included, lives in `executor.traced.offload.HostPool` (numpy
memory, outside torch's CPU allocator), so `measure_peak`'s profiler events count the device
side alone and the pool the host side, for every row alike. torch's own ``save_on_cpu`` cannot
be measured apart on this machine: its host tensors come from the same c10 CPU allocator as the
"device" tensors (and a CPU tensor's ``.cpu()`` is itself, no copy), so host and device are one
memory; hence the hooks above, which copy as torch's do into the pool.

Columns: ``device peak`` (measured: bytes above the step's start, `.grad` allocated before),
``host peak`` (measured: `HostPool.peak_bytes`), ``d2h``/``h2d`` (measured bytes copied each way
in the step), ``grads`` (``equal``: every gradient `torch.equal` to eager's, asserted),
``cpu step`` (measured: median seconds over ``--reps`` interleaved rounds, one thread; a copy
here is a memcpy), ``h100 step`` (*predicted*: the captured DAG with each node's seconds from
the H100 roofline of estimate mode, `graph_capture.capture(..., target="h100")`, and copies over
its PCIe Gen5 link, 64 GB/s each way: eager is the keep-all schedule's compute; ``save_on_cpu``
and HF add every measured copy's link time in full (serial with compute; HF also reruns its
blocks' forward nodes once); torchtune is the keep-all schedule with an offload op after each
saved value of >= 1 KiB, its free five offloads later (or after its last forward read) and a
reload right before its first backward read, simulated by `solver.simulate` (copies overlap
compute on one engine per direction, the clock waits where a value is read before its reload
has arrived); remat's rows are their schedules' cost, solved on those H100 seconds and
simulated the same way). The budget is ``--budget`` times eager's measured device peak.
"""

from __future__ import annotations

import argparse
import copy
import weakref
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field

import networkx as nx
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

import solver
from benchmarks.models import MODELS
from benchmarks.running.offload import interleaved_median_seconds
from executor.memory import measure_peak
from executor.traced.module import Rematerialized
from executor.traced.offload import HostPool
from graph_capture import capture
from graph_capture.captured import CapturedGraph
from graph_capture.measurement.device import fork_rng
from solver import Link
from solver.errors import InfeasibleBudgetError, SolverTimeoutError
from solver.target.devices import host_link

Step = Callable[[], None]


def _host_tensor(pool: HostPool, like: torch.Tensor, stride: Sequence[int]) -> torch.Tensor:
    """A host tensor of `like`'s dtype and size with `stride`, on `pool`'s memory (the bytes of
    its elements; released when the tensor is collected)."""
    nbytes = like.numel() * like.element_size()
    buffer = pool.allocate(nbytes)
    host = torch.empty(0, dtype=like.dtype).set_(buffer.untyped_storage(), 0, like.size(), stride)
    weakref.finalize(host, pool.release, nbytes)
    return host


def _to_device(host: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A new device tensor with `host`'s values and layout (as ``.to(device)`` makes one)."""
    out = torch.empty_strided(host.size(), host.stride(), dtype=host.dtype, device=device)
    return out.copy_(host)


@dataclass
class SaveOnCpu:
    """`torch.autograd.graph.save_on_cpu(pin_memory=True)`'s pack and unpack, the host tensors
    in `pool`: every saved tensor to a new contiguous host tensor, back to a new device tensor
    at each read. `d2h_bytes`, `h2d_bytes`: bytes copied each way since made."""

    pool: HostPool
    d2h_bytes: int = 0
    h2d_bytes: int = 0

    def hooks(self) -> torch.autograd.graph.saved_tensors_hooks:
        return torch.autograd.graph.saved_tensors_hooks(self.pack, self.unpack)

    def pack(self, tensor: torch.Tensor) -> tuple[torch.device, torch.Tensor]:
        host = _host_tensor(self.pool, tensor, torch.empty(tensor.size(), device="meta").stride())
        host.copy_(tensor)
        self.d2h_bytes += tensor.numel() * tensor.element_size()
        return tensor.device, host

    def unpack(self, packed: tuple[torch.device, torch.Tensor]) -> torch.Tensor:
        device, host = packed
        self.h2d_bytes += host.numel() * host.element_size()
        return _to_device(host, device)


@dataclass
class TorchtuneOffload:
    """torchtune's ``OffloadActivations`` (``use_streams=True``) pack and unpack for one step,
    the host tensors in `pool` (the module docstring states what it does). `d2h_bytes`,
    `h2d_bytes`: bytes copied each way since made."""

    pool: HostPool
    min_offload_bytes: int = 1024
    max_fwd_stash: int = 5
    d2h_bytes: int = 0
    h2d_bytes: int = 0
    tracker: dict[int, tuple[torch.Tensor, bool]] = field(default_factory=dict)
    fwd_stash: dict[int, torch.Tensor] = field(default_factory=dict)
    bwd_stash: dict[int, torch.Tensor] = field(default_factory=dict)
    node: object = None
    next_id: int = 0

    def hooks(self) -> torch.autograd.graph.saved_tensors_hooks:
        return torch.autograd.graph.saved_tensors_hooks(self.pack, self.unpack)

    def pack(self, activation: torch.Tensor) -> int:
        tensor_id, self.next_id = self.next_id, self.next_id + 1
        nbytes = activation.numel() * activation.element_size()
        if nbytes < self.min_offload_bytes or isinstance(activation, nn.Parameter | nn.Buffer):
            self.tracker[tensor_id] = (activation, False)
            return tensor_id
        for old in [k for k in self.fwd_stash if k <= tensor_id - self.max_fwd_stash]:
            del self.fwd_stash[old]  # on a GPU: the compute stream waits for its copy here
        stride = torch.empty_like(activation, device="meta").stride()
        host = _host_tensor(self.pool, activation, stride)
        host.copy_(activation)
        self.d2h_bytes += nbytes
        self.tracker[tensor_id] = (host, True)
        self.fwd_stash[tensor_id] = activation
        return tensor_id

    def unpack(self, tensor_id: int) -> torch.Tensor:
        tensor, offloaded = self.tracker.pop(tensor_id)
        if not offloaded:
            return tensor
        node = torch._C._current_autograd_node()
        previous = [] if node is self.node else list(self.bwd_stash)
        self.node = node
        if tensor_id in self.fwd_stash:
            tensor = self.fwd_stash[tensor_id]
        else:
            tensor = _to_device(tensor, tensor.device)
            self.h2d_bytes += tensor.numel() * tensor.element_size()
            self.bwd_stash[tensor_id] = tensor

        def after_node(outputs: object, inputs: object) -> None:
            self.fwd_stash.clear()
            for k in previous:
                self.bwd_stash.pop(k, None)

        node.register_hook(after_node)
        return tensor

    def finish(self) -> None:
        """The step's end: nothing held (torchtune's next forward starts from empty stashes)."""
        self.fwd_stash.clear()
        self.bwd_stash.clear()
        self.node = None


def _loss_step(model: Callable[..., torch.Tensor], inputs: Sequence[torch.Tensor]) -> Step:
    def run() -> None:
        model(*inputs).backward()

    return run


def _hooked_step(
    model: nn.Module, inputs: Sequence[torch.Tensor], make: Callable[[], object]
) -> tuple[Step, list]:
    """A step under fresh hooks from `make()` each time; the last step's hooks in the list."""
    last: list = [None]

    def run() -> None:
        hooks = make()
        last[0] = hooks
        with hooks.hooks():
            loss = model(*inputs)
        loss.backward()
        if isinstance(hooks, TorchtuneOffload):
            hooks.finish()

    return run, last


def _hf_step(
    model: nn.Module, inputs: Sequence[torch.Tensor], blocks: Sequence[nn.Module], pool: HostPool
) -> tuple[Step, list]:
    """HF's offload: each block checkpointed (non-reentrant) inside ``save_on_cpu``."""
    last: list = [None]

    def wrap(block: nn.Module) -> None:
        forward = block.forward

        def offloaded(*args: object, **kwargs: object) -> object:
            with last[0].hooks():
                return checkpoint(forward, *args, use_reentrant=False, **kwargs)

        block.forward = offloaded

    for block in blocks:
        wrap(block)

    def run() -> None:
        last[0] = SaveOnCpu(pool)
        model(*inputs).backward()

    return run, last


@dataclass
class Row:
    """One method's measured and predicted figures (bytes, seconds)."""

    model: str
    method: str
    budget: int | None
    device_peak: int | None = None
    host_peak: int = 0
    d2h: int = 0
    h2d: int = 0
    grads: str = ""
    cpu_step: float = 0.0
    h100_step: float | None = None
    note: str = ""


def _grads(model: nn.Module, step: Step, seed: int) -> list[torch.Tensor]:
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    with fork_rng(torch.device("cpu")):
        torch.manual_seed(seed)
        step()
    return [p.grad.clone() for p in model.parameters()]


def _h100_costs(
    captured_dag: nx.DiGraph, model: nn.Module, inputs: Sequence, granularity: str
) -> None:
    """Set every node's ``cost`` of `captured_dag` to estimate mode's H100 seconds."""
    estimated = capture(model, inputs, granularity=granularity, target="h100").dag
    for name, data in captured_dag.nodes(data=True):
        data["cost"] = data["time"] = estimated.nodes[name]["cost"]


def torchtune_ops(
    graph: nx.DiGraph,
    keep_all: Sequence[tuple[str, Hashable]],
    min_offload_bytes: int = 1024,
    max_fwd_stash: int = 5,
) -> list[tuple[str, Hashable]]:
    """torchtune's copies as ops on the keep-all schedule `keep_all`: each forward value that a
    backward node reads with at least `min_offload_bytes` bytes is offloaded right after its
    compute, freed after its last forward read or `max_fwd_stash` offloads later (whichever
    comes later) and reloaded right before its first backward read."""
    backward = {v for v, d in graph.nodes(data=True) if d.get("backward")}
    saved = [
        v
        for kind, v in keep_all
        if kind == "compute"
        and v not in backward
        and graph.nodes[v]["mem"] >= min_offload_bytes
        and any(s in backward for s in graph.successors(v))
    ]
    position = {v: i for i, (kind, v) in enumerate(keep_all) if kind == "compute"}
    free_after: dict[int, list[Hashable]] = {}
    for k, v in enumerate(saved):
        forward_reads = [position[s] for s in graph.successors(v) if s not in backward]
        later = position[saved[k + max_fwd_stash]] if k + max_fwd_stash < len(saved) else None
        first_backward = min(position[s] for s in graph.successors(v) if s in backward)
        at = max([position[v], *forward_reads, *([later] if later is not None else [])])
        if at < first_backward:
            free_after.setdefault(at, []).append(v)
    reload_before: dict[int, list[Hashable]] = {}
    for at_list in free_after.values():
        for v in at_list:
            first = min(position[s] for s in graph.successors(v) if s in backward)
            reload_before.setdefault(first, []).append(v)
    freed = {v for vs in free_after.values() for v in vs}
    offloaded = set(saved)
    ops: list[tuple[str, Hashable]] = []
    for i, (kind, v) in enumerate(keep_all):
        if kind == "free" and v in freed:
            continue  # freed at its own place below, or already
        ops.extend(("reload", u) for u in reload_before.get(i, []))
        ops.append((kind, v))
        if kind == "compute" and v in offloaded:
            ops.append(("offload", v))
        ops.extend(("free", u) for u in free_after.get(i, []))
    return _free_reloaded(graph, ops, freed, backward, position)


def _free_reloaded(
    graph: nx.DiGraph,
    ops: list[tuple[str, Hashable]],
    reloaded: set[Hashable],
    backward: set[Hashable],
    position: dict[Hashable, int],
) -> list[tuple[str, Hashable]]:
    """Free each reloaded value after its last backward read (its keep-all free was dropped)."""
    last = {v: max(position[s] for s in graph.successors(v) if s in backward) for v in reloaded}
    by_reader: dict[Hashable, list[Hashable]] = {}
    order = {position[v]: v for v in position}
    for v, at in last.items():
        by_reader.setdefault(order[at], []).append(v)
    out = []
    for kind, v in ops:
        out.append((kind, v))
        if kind == "compute":
            out.extend(("free", u) for u in by_reader.get(v, []))
    return out


def compare(
    name: str,
    budget_fraction: float = 0.5,
    time_limit: float = 20.0,
    reps: int = 15,
    granularity: str = "module",
) -> list[Row]:
    """The rows of the module docstring for benchmark model `name` (`benchmarks.models.MODELS`):
    the baselines, then remat's two rows at `budget_fraction` of eager's device peak and at
    torchtune's measured device peak (solves of `time_limit` seconds on the DAG of
    `granularity`)."""
    bench = MODELS[name]()
    model, inputs = bench.model, tuple(bench.inputs)
    link = host_link("h100")
    seed = 0

    eager = copy.deepcopy(model)
    eager_step = _loss_step(eager, inputs)
    reference = _grads(eager, eager_step, seed)
    eager_peak = measure_peak(eager_step).peak_bytes

    captured = capture(model, inputs, granularity=granularity)
    _h100_costs(captured.dag, model, inputs, granularity)
    keep_all = solver.solve(captured.dag, 1 << 62, time_limit=time_limit)
    compute = keep_all.cost

    rows = [Row(name, "eager", None, eager_peak, h100_step=compute)]
    steps: dict[str, Step] = {"eager": eager_step}

    def run_hooked(method: str, step: Step, last: list, pool: HostPool, replica: nn.Module) -> Row:
        grads = _grads(replica, step, seed)
        assert all(torch.equal(a, b) for a, b in zip(grads, reference, strict=True)), method
        pool.reset_peak()
        peak = measure_peak(step).peak_bytes
        hooks = last[0]
        steps[method] = step
        return Row(
            name, method, None, peak, pool.peak_bytes, hooks.d2h_bytes, hooks.h2d_bytes, "equal"
        )

    pool = HostPool()
    replica = copy.deepcopy(model)
    step, last = _hooked_step(replica, inputs, lambda: SaveOnCpu(pool))
    row = run_hooked("save_on_cpu", step, last, pool, replica)
    row.h100_step = compute + row.d2h / link.d2h + row.h2d / link.h2d
    rows.append(row)

    if bench.blocks:
        pool = HostPool()
        replica = copy.deepcopy(model)
        names = {id(m): n for n, m in model.named_modules()}
        prefixes = [names[id(b)] for b in bench.blocks]
        blocks = [replica.get_submodule(p) for p in prefixes]
        step, last = _hf_step(replica, inputs, blocks, pool)
        row = run_hooked("HF offload", step, last, pool, replica)
        rerun = sum(
            d["cost"]
            for _, d in captured.dag.nodes(data=True)
            if not d.get("backward")
            and any(d["module"] == p or d["module"].startswith(p + ".") for p in prefixes)
        )
        row.h100_step = compute + rerun + row.d2h / link.d2h + row.h2d / link.h2d
        rows.append(row)

    pool = HostPool()
    replica = copy.deepcopy(model)
    step, last = _hooked_step(replica, inputs, lambda: TorchtuneOffload(pool))
    row = run_hooked("torchtune", step, last, pool, replica)
    ops = torchtune_ops(captured.dag, keep_all.ops)
    row.h100_step = solver.simulate(captured.dag, ops, link).cost
    rows.append(row)
    assert row.device_peak is not None

    for budget in (int(budget_fraction * eager_peak), row.device_peak):
        for method, offload in (("remat keep/recompute", None), ("remat offload", link)):
            try:
                row, step, grads = _remat_row(
                    name, method, captured, model, inputs, budget, offload, time_limit
                )
            except (InfeasibleBudgetError, SolverTimeoutError) as error:
                reason = "none fits" if isinstance(error, InfeasibleBudgetError) else "none found"
                rows.append(Row(name, f"{method} @ {budget:,} B", budget, note=reason))
                continue
            assert all(torch.equal(a, b) for a, b in zip(grads, reference, strict=True)), method
            steps[row.method] = step
            rows.append(row)

    seconds = interleaved_median_seconds(steps, reps)
    for row in rows:
        row.cpu_step = seconds.get(row.method, 0.0)
    return rows


def _remat_row(
    name: str,
    method: str,
    captured: CapturedGraph,
    model: nn.Module,
    inputs: Sequence[torch.Tensor],
    budget: int,
    offload: Link | None,
    time_limit: float,
) -> tuple[Row, Step, list[torch.Tensor]]:
    """remat's own executor at `budget`: its row (``method`` and the budget in its label), a
    step of it and its gradients. `solver.solve`'s errors where no schedule fits
    (`InfeasibleBudgetError`) or none is found in `time_limit` (`SolverTimeoutError`)."""
    schedule = solver.solve(captured.dag, budget, offload=offload, time_limit=time_limit, workers=2)
    rm = Rematerialized(copy.deepcopy(model), captured, schedule)
    step = _loss_step(rm, inputs)
    grads = _grads(rm, step, 0)
    if rm.host_pool is not None:
        rm.host_pool.reset_peak()
    peak = measure_peak(step).peak_bytes
    copied = {"offload": 0, "reload": 0}
    for kind, v in schedule.ops:
        if kind in copied:
            copied[kind] += captured.dag.nodes[v]["mem"]
    row = Row(
        name,
        f"{method} @ {budget:,} B",
        budget,
        peak,
        0 if rm.host_pool is None else rm.host_pool.peak_bytes,
        copied["offload"],
        copied["reload"],
        "equal",
        h100_step=schedule.cost,
        note=f"{schedule.status}, {schedule.recomputes} recomputes",
    )
    return row, step, grads


def _cell(value: object) -> str:
    if value is None:
        return "-"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def table(rows: Sequence[Row]) -> str:
    """The rows as a Markdown table (bytes; CPU milliseconds measured, H100 microseconds
    predicted)."""
    head = (
        "| model | method | budget B | device peak B (measured) | host peak B (measured) "
        "| d2h / h2d B (measured) | grads | CPU step ms (measured) | H100 step us (predicted) "
        "| note |"
    )
    lines = [head, "|" + "---|" * 10]
    for r in rows:
        h100 = "-" if r.h100_step is None else f"{r.h100_step * 1e6:.1f}"
        cpu = f"{r.cpu_step * 1e3:.2f}" if r.cpu_step else "-"
        lines.append(
            f"| {r.model} | {r.method} | {_cell(r.budget)} | {_cell(r.device_peak)} "
            f"| {r.host_peak:,} | {r.d2h:,} / {r.h2d:,} | {r.grads or '-'} | {cpu} | {h100} "
            f"| {r.note} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=["gpt", "stack16"], choices=list(MODELS))
    parser.add_argument("--budget", type=float, default=0.5, help="of eager's device peak")
    parser.add_argument("--time-limit", type=float, default=20.0, help="seconds per solve")
    parser.add_argument("--reps", type=int, default=15)
    parser.add_argument("--granularity", choices=["op", "module"], default="module")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    rows = [
        row
        for name in args.models
        for row in compare(name, args.budget, args.time_limit, args.reps, args.granularity)
    ]
    print(table(rows))


if __name__ == "__main__":
    main()
