"""Llama-3-8B and -70B under FSDP2, planned here for GPUs not at hand (estimate mode), and
torchtitan's published configurations predicted.

    python -m benchmarks.planning.scale_llama [--out results] [--only llama3_8b ...]

Each model is built on the meta device in bfloat16 (`torch.set_default_dtype` before building)
with float32 master weights, AdamW, `fully_shard` per decoder layer and at the root, gathered in
bfloat16, reduce-scatter in float32 (torchtitan's default), NCCL, batch and sequence as listed.
Each part runs in its own child process, nice'd, one thread, so that its peak RSS
(`resource.getrusage`) is its own:

- `plan`: `executor.checkpoint_plan(..., target, world_size, fsdp=...)` at what the target
  lets PyTorch allocate per rank (`Device.usable`: capacity less the memory outside PyTorch,
  NCCL's included; the SAC optimum), then the per-rank peak (`solver.sac.sharded.rank_peak`)
  and recompute seconds (`solver.sac.union.union_cost`: recompute, checkpoint price, SAC
  runtime overhead) of no checkpointing, full per-block checkpointing and torchtitan's
  selective-op policy on the same recording;
- `capture`: `graph_capture.capture(..., target, granularity)`, the traced joint graph at op
  level (one node per allocating op) and at module level (`--granularity`: consecutive ops of
  one innermost module and phase merged, a coarser problem the solver closes sooner);
- `solve`: `solver.solve` on it at the step budget FSDP leaves
  (`solver.target.activation_budget`: usable bytes less resident bytes and the most FSDP
  bytes), the per-rank peak bounded by resident + most FSDP bytes + the schedule's peak.

Predicted step seconds: the capture's `step_cost` (sum of the roofline seconds of every forward
and backward op on the target) plus the plan's recompute; FSDP's communication is not counted.
torchtitan's rows (`published`) record blocks only (no children) and evaluate the policies.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import torch

GIB = 1 << 30
LLAMA3 = {"vocab_size": 128256, "rope_theta": 500000.0, "num_key_value_heads": 8}
L8B = {**LLAMA3, "hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32}
L8B["intermediate_size"] = 14336
L70B = {**LLAMA3, "hidden_size": 8192, "num_hidden_layers": 80, "num_attention_heads": 64}
L70B["intermediate_size"] = 28672
LLAMA2_70B = {**L70B, "vocab_size": 32000, "rope_theta": 10000.0}

# name: (config, batch, sequence, target, world size, published: (what, GiB or None))
RUNS = {
    "llama3_8b": (L8B, 1, 8192, "h100", 8, None),
    "llama3_70b": (L70B, 1, 8192, "a100-80gb", 64, None),
    "llama31_8b_b2": (L8B, 2, 8192, "h100-96gb", 8, ("selective", 82.4)),
    "llama31_8b_b2_w128": (L8B, 2, 8192, "h100-96gb", 128, ("selective", 67.0)),
    "llama2_70b_b2": (LLAMA2_70B, 2, 4096, "a100-80gb", 64, ("selective OOM, full fits", None)),
    "llama2_70b_b1": (LLAMA2_70B, 1, 4096, "a100-80gb", 64, ("selective fits", None)),
}
MAIN = ("llama3_8b", "llama3_70b")
POLICY_ROWS = {"none": "none", "full": "full", "selective (torchtitan)": "selective"}
"""The fixed SAC policies' rows (`solver.sac.policies.POLICIES`), by their label here."""
PUBLISHED = ("llama31_8b_b2", "llama31_8b_b2_w128", "llama2_70b_b2", "llama2_70b_b1")


def build(name: str, batch: int | None = None, seq: int | None = None, layers: int | None = None):
    """The meta model in bfloat16, its input ids and the step's kwargs (batch, sequence and
    decoder layers RUNS', or as given: `layers` makes a stack of that many of the model's
    layers, its embedding and head unchanged)."""
    import transformers

    config, run_batch, run_seq, *_ = RUNS[name]
    batch, seq = batch or run_batch, seq or run_seq
    if layers is not None:
        config = {**config, "num_hidden_layers": layers}
    cfg = transformers.LlamaConfig(**config, max_position_embeddings=seq)
    before = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        with torch.device("meta"):
            model = transformers.LlamaForCausalLM(cfg).train()
    finally:
        torch.set_default_dtype(before)
    model.config.use_cache = False
    ids = torch.zeros(batch, seq, dtype=torch.long, device="meta")
    return model, ids, {"labels": ids}


def policy(name: str):
    """The target of run `name` and its FSDP policy: bf16 gathered from float32 master weights,
    reduced in float32 (`executor.fsdp_policy`'s defaults otherwise)."""
    from executor import fsdp_policy
    from solver.target import builtin_device

    device = builtin_device(RUNS[name][3])
    fsdp = fsdp_policy(RUNS[name][4], device, param_dtype="bfloat16", reduce_dtype="float32")
    return device, fsdp


def _rss() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / (1 << 20)


def part_plan(
    name: str,
    time_limit: float,
    size: tuple = (None, None),
    budget=None,
    layers: int | None = None,
) -> dict:
    """The SAC rows of `name` at (batch, sequence) `size` (RUNS' where None) with `layers`
    decoder layers (None: RUNS'), the SAC plan's at `budget` (None: the target's usable bytes;
    "min": the least per-rank peak)."""
    import executor
    from executor.fsdp import model_memory
    from solver.sac.policies import policy_plan, sac_overhead
    from solver.sac.sharded import rank_peak
    from solver.sac.union import union_cost

    model, ids, kw = build(name, *size, layers=layers)
    device, fsdp = policy(name)
    regions = "choose" if name in MAIN else "blocks"
    start = time.perf_counter()
    plan = executor.checkpoint_plan(
        model, (ids,), budget, example_kwargs=kw, target=device, fsdp=fsdp,
        regions=regions, time_limit=time_limit,
    )  # fmt: skip
    seconds = time.perf_counter() - start
    union = plan.problem
    modules = dict(model.named_modules())
    memory = model_memory(model, [modules[b.name] for b in union.blocks.blocks], fsdp)
    plans = {label: policy_plan(union, name) for label, name in POLICY_ROWS.items()}
    rows = {}
    for label, p in plans.items():
        peak = rank_peak(union, p, memory)
        rows[label] = {"peak": peak.peak, "at": f"{peak.window}, {peak.level}"}
        rows[label]["recompute"] = union_cost(union, p)
        rows[label]["overhead"] = sac_overhead(union, p)
    chosen = plan.union_plan()
    peak = rank_peak(union, chosen, memory)
    rows["SAC plan (remat)"] = {"peak": plan.peak, "at": f"{peak.window}, {peak.level}"}
    rows["SAC plan (remat)"]["recompute"] = union_cost(union, chosen)
    rows["SAC plan (remat)"]["overhead"] = sac_overhead(union, chosen)
    ckpt = plan.checkpointed_regions()
    return {
        "plan s": seconds,
        "plan RSS GiB": _rss(),
        "status": f"{plan.status} gap {plan.gap:.2%}",
        "regions": f"{len(ckpt)} of {len(plan.regions)} ({sum(map(len, plan.saved))} ops saved)",
        "resident": memory.resident,
        "device": device.memory,
        "usable": device.usable(fsdp.nccl_communicators),
        "rows": rows,
    }


def part_capture(name: str, path: str, granularity: str = "op") -> dict:
    import graph_capture
    from solver.io import save_graph

    model, ids, kw = build(name)
    device, _ = policy(name)
    start = time.perf_counter()
    captured = graph_capture.capture(
        model, (ids,), example_kwargs=kw, target=device, granularity=granularity
    )
    seconds = time.perf_counter() - start
    save_graph(captured.dag, path)
    dag = captured.dag
    return {
        "capture s": seconds,
        "capture RSS GiB": _rss(),
        "nodes": dag.number_of_nodes(),
        "step s": dag.graph["step_cost"],
    }


def part_solve(name: str, path: str, time_limit: float) -> dict:
    import solver
    from executor.fsdp import model_memory
    from solver.errors import InfeasibleBudgetError
    from solver.io import load_graph
    from solver.target import activation_budget

    model, _, _ = build(name)
    device, fsdp = policy(name)
    memory = model_memory(model, list(model.model.layers), fsdp)
    budget = activation_budget(memory, device.usable(fsdp.nccl_communicators))
    start = time.perf_counter()
    dag = load_graph(path)
    out = {"step budget": budget, "most fsdp": memory.max_fsdp_bytes()}
    try:
        schedule = solver.solve(dag, budget, time_limit=time_limit)
    except InfeasibleBudgetError as e:
        out["infeasible"] = str(e).splitlines()[0]
        out["least"] = e.minimum_bytes
    else:
        once = sum(dag.nodes[v]["cost"] for v in dag.nodes)
        out["peak"] = memory.resident + memory.max_fsdp_bytes() + schedule.peak
        out["recompute"] = schedule.cost - once
        out["status"] = f"{schedule.status} gap {schedule.gap:.2%}"
    out["solve s"] = time.perf_counter() - start
    out["solve RSS GiB"] = _rss()
    return out


def _child(args: list[str], timeout: float) -> dict:
    command = ["nice", sys.executable, "-m", "benchmarks.planning.scale_llama", *args]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    start = time.perf_counter()
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:.0f} s"}
    if done.returncode:
        tail = done.stderr.strip().splitlines()[-1:] or ["no output"]
        return {"error": tail[0], "wall s": time.perf_counter() - start}
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", default="results")
    parser.add_argument("--only", nargs="+", default=list(RUNS))
    parser.add_argument("--time-limit", type=float, default=110)
    parser.add_argument("--parts", nargs="+", default=["plan", "capture", "solve"])
    parser.add_argument("--part", choices=("plan", "capture", "solve"))
    parser.add_argument("--name")
    parser.add_argument("--graph")
    parser.add_argument("--size", nargs=2, type=int, default=(None, None), help="batch, seq")
    parser.add_argument("--layers", type=int, help="decoder layers (a part; default: the model's)")
    parser.add_argument("--budget", help="the SAC plan's budget per rank (default: device)")
    parser.add_argument(
        "--granularity", nargs="+", choices=("op", "module"), default=["op", "module"],
        help="the captures remat's own schedule is solved on (a part: the first)",
    )  # fmt: skip
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    if args.part == "plan":
        print(
            json.dumps(part_plan(args.name, args.time_limit, args.size, args.budget, args.layers))
        )
        return
    if args.part == "capture":
        print(json.dumps(part_capture(args.name, args.graph, args.granularity[0])))
        return
    if args.part == "solve":
        print(json.dumps(part_solve(args.name, args.graph, args.time_limit)))
        return
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    saved = out / "scale_llama.json"
    results = json.loads(saved.read_text()) if saved.exists() else {}
    for name in args.only:
        limit = str(args.time_limit if name in MAIN else 60)
        row = results.setdefault(name, {})
        if "plan" in args.parts:
            plan = ["--part", "plan", "--name", name, "--time-limit", limit]
            row["plan"] = _child(plan, 600)
        for level in args.granularity if name in MAIN and "capture" in args.parts else ():
            graph = str(out / f"scale_{name}_{level}_dag.json")
            capture = ["--part", "capture", "--name", name, "--graph", graph]
            row[f"capture {level}"] = _child([*capture, "--granularity", level], 600)
            if "error" not in row[f"capture {level}"] and "solve" in args.parts:
                solve = ["--part", "solve", "--name", name, "--graph", graph, "--time-limit", limit]
                row[f"solve {level}"] = _child(solve, 600)
        print(json.dumps({name: row}), flush=True)
        saved.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
