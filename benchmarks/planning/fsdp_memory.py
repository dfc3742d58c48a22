"""FSDP2's per-rank peak on 2 gloo ranks (CPU), measured against `solver.target.fsdp`'s
prediction: ``python -m benchmarks.planning.fsdp_memory [--layers 4 --hidden 256 --batch 4 --seq
64]``.

The model is the zoo's HF GPT-2 (tied head, dropout 0.1), float32 (master = param = reduce
dtype; see docs/fsdp.md on mixed precision), AdamW. Three runs: no checkpointing, per-block
checkpoint (`torch.utils.checkpoint` around each block's forward) and a remat SAC plan
(`executor.checkpoint_plan` on the single-process model at a budget halfway between its least
peak and 100%, `plan.apply(model)` before `fully_shard`). Each rank applies `fully_shard` per
block and at the root, trains one step, then measures step 2 (forward and backward, `.grad`
None at its start) under the profiler's allocation events: the most bytes live above the
step's start (`executor.measure_peak`'s method), plus the bytes resident before it, counted as
the distinct storages of the parameters (sharded, padded), the optimizer state, the buffers
and the inputs.

The prediction: `executor.fsdp.model_memory` (`fsdp_memory` of the blocks' and the root's
parameter shapes) under `executor.fsdp_policy` for this CPU (gloo, step counters on it), and the
single-process step's windows measured on the unsharded model with the same checkpointing
(`executor.sac.recording.windows.measure_windows`, one rank's batch, with `transformer.drop` as a
leading block so that block 0's backward is cut from the root's) and the bytes live when its
forward returns (`measure_each`: the backward's start), combined by `predict_peak`. The
inputs and buffers (resident on both sides, not FSDP's) are added to both resident columns.
"""

from __future__ import annotations

import argparse
import gc
import os
import tempfile
from functools import partial
from pathlib import Path

import torch

from benchmarks.gloo_ranks import WORLD, on_gloo_ranks

MODES = ("none", "per-block", "remat plan")
STEPS = 3  # measured, after one


def build(args: argparse.Namespace, seed: int = 0):
    from benchmarks.zoo.hf import gpt2

    bench = gpt2(layers=args.layers, hidden=args.hidden, batch=args.batch, seq=args.seq)
    model, inputs = bench
    if seed:  # another rank's batch: same shapes, other tokens
        g = torch.Generator().manual_seed(seed)
        ids = torch.randint(0, model.model.config.vocab_size, inputs[0].shape, generator=g)
        inputs = (ids, ids.clone())
    return model, inputs, bench.blocks


def checkpointed(args: argparse.Namespace, mode: str, plan_path: str, seed: int = 0):
    """The model with `mode`'s checkpointing applied, its inputs and blocks."""
    from benchmarks.running.sac_price import per_block

    model, inputs, blocks = build(args, seed)
    if mode == "per-block":
        per_block(model, blocks, None)
    elif mode == "remat plan":
        import executor

        executor.CheckpointPlan.load(plan_path, model).apply(model)
    return model, inputs, blocks


def storages_bytes(tensors) -> int:
    """Bytes of the distinct storages behind `tensors` (DTensors by their local tensors)."""
    seen: dict[int, int] = {}
    for t in tensors:
        t = getattr(t, "_local_tensor", t)
        s = t.untyped_storage()
        seen[s.data_ptr()] = s.nbytes()
    return sum(seen.values())


def rank_run(args: argparse.Namespace, mode: str, plan_path: str, rank: int) -> dict:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from graph_capture.measurement.peak import memory_profile

    torch.manual_seed(0)
    model, inputs, blocks = checkpointed(args, mode, plan_path, seed=rank)
    mesh = init_device_mesh("cpu", (WORLD,))
    for block in blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    peaks = []
    for step in range(1 + STEPS):
        optimizer.zero_grad(set_to_none=True)
        torch.manual_seed(step)
        gc.collect()
        params = storages_bytes(model.parameters())
        state = storages_bytes(
            v for s in optimizer.state.values() for v in s.values() if torch.is_tensor(v)
        )
        other = storages_bytes([*model.buffers(), *inputs])
        with memory_profile() as prof:
            loss = model(*inputs)
            loss.backward()
            del loss
        peaks.append(live_peak(prof))
        optimizer.step()
    return {
        "steps": peaks[1:],  # (peak, missed frees) of each measured step
        "params": params,
        "state": state,
        "other": other,
    }


def live_peak(prof) -> tuple[int, int]:
    """The most bytes live above the start of the profile, and how many frees the profiler
    missed. Under gloo it misses some frees of the reduce-scatter's scratch (allocated on the
    main thread, freed by gloo's worker thread; recorded, it is freed inside FSDP's
    post-backward reduce): a running sum of allocation events would keep it live to the end.
    So a block a `c10d::` collective allocates inside an `FSDP::post_backward_reduce` whose
    pointer is next allocated again, or never freed, ends with that reduce. A free of a block
    from before the profile counts as `graph_capture.measurement.peak` counts it."""
    from graph_capture.measurement.peak import event_tree, is_allocation

    events = []  # (ns, pointer, bytes, end of the enclosing reduce or None)
    for node, _ in event_tree(prof):
        if is_allocation(node):
            f, up, collective = node.extra_fields, node.parent, False
            while up is not None and not up.name.startswith("FSDP::post_backward_reduce"):
                collective |= up.name.startswith("c10d::")
                up = up.parent
            end = up.end_time_ns if up is not None and collective else None
            events.append((node.start_time_ns, f.ptr, f.alloc_size, end))
    events.sort(key=lambda e: e[0])
    freed: set[int] = set()  # indices of allocations whose free is recorded
    last: dict[int, int] = {}
    for i, (_, ptr, size, _) in enumerate(events):
        if size < 0 and ptr in last:
            freed.add(last.pop(ptr))
        elif size > 0:
            last[ptr] = i
    missed = [e for i, e in enumerate(events) if e[2] > 0 and i not in freed and e[3]]
    events += [(end, None, -size, None) for _, _, size, end in missed]
    live = peak = 0
    for _, _, size, _ in sorted(events, key=lambda e: e[0]):
        live += size
        peak = max(peak, live)
    return peak, len(missed)


def measured(args: argparse.Namespace, mode: str, plan_path: str) -> list[dict]:
    with tempfile.TemporaryDirectory() as tmp:
        return on_gloo_ranks(partial(rank_run, args, mode, plan_path), Path(tmp), timeout=120)


def predicted(args: argparse.Namespace, mode: str, plan_path: str, rank: int):
    """The model's prediction for `rank` and its resident bytes beside FSDP's (inputs and
    buffers)."""
    from executor.fsdp import fsdp_policy, model_memory
    from executor.sac.recording.windows import measure_windows
    from graph_capture.measurement.peak import measure_each
    from solver.target import predict_peak

    torch.manual_seed(0)
    model, inputs, blocks = checkpointed(args, mode, plan_path, seed=rank)
    model(*inputs).backward()  # warm-up
    model.zero_grad(set_to_none=True)
    stem = model.model.transformer.drop  # its output is block 0's input
    w = measure_windows(model, [stem, *blocks], lambda: model(*inputs))
    with torch.random.fork_rng():
        forward = measure_each([lambda: model(*inputs)])[0]  # its end: the loss held
    windows = stem_windows(w, forward.end_bytes)
    policy = fsdp_policy(WORLD, rank=rank)  # this CPU: gloo, step counters on the device
    memory = model_memory(model, blocks, policy)
    other = storages_bytes([*model.buffers(), *inputs])
    loose = memory.resident + other + w.peak + memory.max_fsdp_bytes()  # `activation_budget`'s
    return predict_peak(memory, windows), memory, other, loose


def stem_windows(w, backward_start: int):
    """The blocks' windows from `measure_windows` run with the stem as a leading block: the
    stem's backward window is the root's own backward, after block 0's."""
    from solver.target import StepWindows

    peaks = {s.held: s.peak for s in w.segments}
    n = len(w.f_start) - 1
    return StepWindows(
        f_start=tuple(w.f_start[1:]),
        f_peak=tuple(w.f_peak[1:]),
        b_start=tuple(w.b_start[1:]),
        b_peak=tuple(w.b_peak[1:]),
        before=max(peaks[0], w.f_peak[0], peaks[1]),
        between=tuple(peaks[k + 2] for k in range(n - 1)),
        head=peaks[n + 1],
        backward_start=backward_start,
        root_b_start=w.b_start[0],
        root_b_peak=w.b_peak[0],
    )


def plan(args: argparse.Namespace, path: str):
    """The SAC plan at a budget halfway between its least peak and 100%, saved to `path`."""
    import executor

    torch.manual_seed(0)
    model, inputs, _ = build(args)
    least = executor.checkpoint_plan(model, inputs, "min", time_limit=args.time_limit)
    full = least.plain_peak
    budget = (least.peak + full) // 2
    found = executor.checkpoint_plan(model, inputs, budget, time_limit=args.time_limit)
    found.save(path)
    return found


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--seq", type=int, default=64)
    parser.add_argument("--time-limit", type=float, default=60)
    parser.add_argument("--modes", nargs="*", default=list(MODES))
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        plan_path = os.path.join(tmp, "plan.json")
        if "remat plan" in args.modes:
            found = plan(args, plan_path)
            print(f"remat plan: {found!r}", flush=True)
        rows = []
        for mode in args.modes:
            runs = measured(args, mode, plan_path)
            for rank, m in enumerate(runs):
                pred, memory, other, loose = predicted(args, mode, plan_path, rank)
                rows.append((mode, rank, m, pred, memory, other, loose))
                print(mode, rank, m, pred.step_peak, pred.window, pred.level, flush=True)
    print_table(rows)


def print_table(rows) -> None:
    """Per rank: resident bytes, the step's peak above them (each measured step, with the
    frees the profiler missed in it), the per-rank peak and the prediction's error against the
    least and the most measured step; and the one-number bound `activation_budget` stands on
    (resident + the single-process step's peak + the most FSDP bytes)."""
    mib = 1 << 20
    print(
        "| run | rank | resident B, measured / predicted | step peak B, predicted | measured, "
        "steps 2-4 (frees missed) | per-rank peak MiB, predicted | error vs least; most "
        "measured | at | one-number bound MiB |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for mode, rank, m, pred, memory, other, loose in rows:
        res_m = m["params"] + m["state"] + m["other"]
        res_p = memory.resident + other
        peaks = [p for p, _ in m["steps"]]
        total_p = res_p + pred.step_peak
        errors = "; ".join(
            f"{100 * (total_p / (res_m + p) - 1):+.2f}%" for p in (min(peaks), max(peaks))
        )
        steps = ", ".join(f"{p:,} ({k})" for p, k in m["steps"])
        print(
            f"| {mode} | {rank} | {res_m:,} / {res_p:,} | {pred.step_peak:,} | {steps} "
            f"| {total_p / mib:.2f} | {errors} | {pred.window}, {pred.level} | {loose / mib:.2f} |"
        )


if __name__ == "__main__":
    main()
