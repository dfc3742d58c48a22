"""Llama-3-8B under FSDP2 over 8 H100s, with offload to host memory over the H100's PCIe Gen5
link (64 GB/s each way, `solver.target.devices.HOST_LINKS["pcie5"]`) against keep/recompute and
the SAC policies: per-rank peak, host bytes, step time and the largest sizes, all PREDICTED
(estimate mode: bytes from the shapes, seconds from the roofline of the target's published
peaks; no GPU ran).

    python -m benchmarks.planning.offload_llama [--out results] [--layers 4] [--time-limit 120]
        [--parts point sizes] [--dims batch seq]

The model, its FSDP2 policy (bfloat16 gathered from float32 master weights, reduce-scatter in
float32, AdamW, `fully_shard` per decoder layer and at the root, NCCL) and the SAC recording are
`benchmarks.planning.scale_llama`'s; `--layers k` keeps k of the 32 decoder layers (embedding,
head and the float32 cross-entropy unchanged), a stack whose graph the offload model can hold
(`--layers 32`: the full model). Per rank, in what `h100` lets PyTorch allocate (77.97 GiB:
`Device.usable`, docs/estimate.md), at batch 1 and sequence 8192 (`point`):

- none / full per-block / torchtitan's selective op: `scale_llama.part_plan`'s rows (one SAC
  recording, its own child process): per-rank peak (`rank_peak`), recompute seconds;
- remat keep/recompute and remat with offload: `solver.solve` on the module-level capture
  (`graph_capture.capture(..., granularity="module", backward_from=["loss"])`: the step
  backpropagates from the loss alone, as `fit`'s does), without and with `offload=` the link,
  each within `--time-limit` seconds, at the step budget `fit` counts (usable less what exists
  before the step, the most FSDP bytes of any moment and every unsharded gradient,
  `solver.fitting.fsdp.FsdpBytes.step_budget`; its per-rank peak is those plus the schedule's
  peak, an upper bound) and, where it is below that, at `--tight` of checkpoint-all's peak (a
  budget where the schedule must drop or copy something, to see what offload is chosen for);
- the one-line floor (the largest `compute_floor`: a node's output, inputs and transient bytes)
  and its node: no schedule, with offload or without, peaks below it;
- at the lower budget, what a copy costs where a recompute was: per stage of the keep/recompute
  schedule that recomputes, the same schedule with that stage's recomputes replaced by reloads
  (of copies offloaded after the first computation) at the stage's start, replayed by the
  simulator over the link: recompute saved and stall added (`reloads_instead`).

Predicted step seconds: the capture's `step_cost` (the roofline seconds of every forward and
backward op) plus the recompute (SAC: `union_cost`, its host-side overhead included; remat: the
schedule's cost less computing every node once, the stall waiting for copies included); FSDP's
communication is not counted. The largest local batch at sequence 8192 and the largest sequence
at batch 1 (multiples of 1024) (`sizes`): `scale_fit.sac_fits` for the SAC policies (one
recording per size), `scale_fit.remat_fit` (`executor.fit`, module level) without and with
`offload=` the link, each within 4 x `--time-limit`.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from benchmarks.planning import scale_fit, scale_llama

NAME = scale_fit.NAME
LINK = "h100"
"""The link offloads go over: the target's own (`named_link("h100")`, PCIe Gen5 x16)."""
SAC_ROWS = ("none", "full", "selective (torchtitan)")


def point(name: str, layers: int | None, time_limit: float, tight: float) -> dict:
    """Remat's rows at RUNS' batch and sequence of `name`, with `layers` decoder layers (None:
    the model's): the module-level capture, the fixed per-rank bytes, the one-line floor, and
    keep/recompute and offload solves at the step budget and at `tight` of checkpoint-all's peak
    (each within `time_limit` seconds)."""
    import graph_capture
    from executor.fitting.fsdp import fsdp_bytes
    from executor.fitting.memory import predicted_static
    from solver.core.budget import checkpoint_all_peak
    from solver.core.graph import prepare
    from solver.target.devices import host_link

    model, ids, kw = scale_llama.build(name, layers=layers)
    device, fsdp = scale_llama.policy(name)
    start = time.perf_counter()
    dag = graph_capture.capture(
        model,
        (ids,),
        example_kwargs=kw,
        target=device,
        granularity="module",
        backward_from=["loss"],
    ).dag
    captured = time.perf_counter() - start
    sharded = fsdp_bytes(model, (ids,), kw, fsdp)
    static, _ = predicted_static(model, (ids,), kw, "adamw", device.rounding)
    before = sharded.static(static.buffers, static.inputs).total
    usable = device.usable(fsdp.nccl_communicators)
    problem = prepare(dag)
    floor = max(range(problem.n), key=problem.compute_floor)
    node = dag.nodes[problem.ids[floor]]
    budgets = {"step budget": sharded.step_budget(usable - before)}
    if tight * checkpoint_all_peak(problem) < budgets["step budget"]:
        budgets[f"{tight:.0%} of checkpoint-all"] = int(tight * checkpoint_all_peak(problem))
    link = host_link(LINK)
    solved = {
        label: {
            "budget": budget,
            "keep/recompute": _solve(dag, budget, time_limit, None),
            "offload": _solve(dag, budget, time_limit, link),
        }
        for label, budget in budgets.items()
    }
    instead = reloads_instead(dag, min(solved.values(), key=lambda got: got["budget"]), link)
    for rows in solved.values():
        for label in ("keep/recompute", "offload"):
            rows[label].pop("ops", None)  # for `reloads_instead` only: not written out
    return {
        "nodes": problem.n,
        "capture s": captured,
        "step s": dag.graph["step_cost"],
        "once s": problem.total_cost,
        "usable": usable,
        "fixed": before + sharded.moment.fsdp_bytes + sharded.unsharded_grads,
        "checkpoint-all peak": checkpoint_all_peak(problem),
        "floor": {
            "bytes": problem.compute_floor(floor),
            "node": f"{node['op']} in {node['module'] or 'the loss'} ({node['phase']})",
            "shapes": node["shapes"],
        },
        "budgets": solved,
        "reloads instead": instead,
    }


def reloads_instead(dag, solved: dict, link) -> list[dict]:
    """Per stage of the keep/recompute schedule at `solved`'s budget that recomputes (its ops in
    `solved["keep/recompute"]["ops"]`), that schedule with the stage's recomputes replaced by
    reloads at the stage's start of the values its node reads or the next stage keeps: the
    simulator's cost and stall over `link`, and whether it stays within the budget (seconds,
    bytes)."""
    from solver.core.graph import prepare
    from solver.core.offload import OffloadPlan, offload_ops
    from solver.core.simulate import simulate
    from solver.core.stages import StagePlan, plan_from_ops

    got = solved["keep/recompute"]
    if "ops" not in got:
        return []
    problem = prepare(dag)
    plan = plan_from_ops(problem, [(kind, v) for kind, v in got["ops"]])
    rows = []
    for t, stage in enumerate(plan.computed):
        recomputed = set(stage) - {t}
        if not recomputed:
            continue
        wanted = set(problem.preds[t]) | (recomputed & plan.kept[t + 1])
        reloaded = frozenset(wanted - plan.kept[t])
        computed = (*plan.computed[:t], (t,), *plan.computed[t + 1 :])
        stages = [frozenset()] * problem.n
        stages[t] = reloaded
        changed = OffloadPlan(StagePlan(computed, plan.kept), tuple(stages), reloaded)
        ops = [(kind, problem.ids[i]) for kind, i in offload_ops(problem, changed)]
        run = simulate(dag, ops, link)
        rows.append(
            {
                "stage": problem.ids[t],
                "recompute saved s": sum(problem.cost[i] for i in recomputed),
                "reloaded bytes": sum(problem.mem[i] for i in reloaded),
                "stall s": run.stall,
                "cost s": run.cost,
                "within": run.valid and run.peak <= solved["budget"],
            }
        )
    return rows


def _solve(dag, budget: int, time_limit: float, link) -> dict:
    """One solve's row: status and gap, peak, host bytes, cost, stall (seconds), wall time, and
    why the offload model was not built where it was not."""
    import solver
    from solver.errors import InfeasibleBudgetError, SolverTimeoutError

    start = time.perf_counter()
    try:
        schedule = solver.solve(dag, budget, time_limit=time_limit, offload=link)
    except (InfeasibleBudgetError, SolverTimeoutError) as e:
        return {"error": str(e).splitlines()[0], "s": time.perf_counter() - start}
    extra = schedule.extra
    return {
        "status": schedule.status,
        "gap": schedule.gap,
        "peak": schedule.peak,
        "cost": schedule.cost,
        "stall": extra.get("stall", 0.0),
        "host_peak": extra.get("host_peak", 0),
        "copies": (extra.get("offloads", 0), extra.get("reloads", 0)),
        "not built": extra.get("offload_model", ""),
        "s": time.perf_counter() - start,
        "ops": schedule.ops,
    }


def sizes(dim: str, layers: int | None, time_limit: float, most: int) -> dict:
    """The largest size along `dim` per policy: the SAC policies' (`sac_fits`), remat's with and
    without offload (`remat_fit`, module level, 4 x `time_limit` each)."""
    sac = scale_fit.sac_fits(dim, time_limit, most, layers=layers)
    unit = 1 if dim == "batch" else scale_fit.SEQ_UNIT
    out = {
        label: {"largest": v["largest"] * unit, "proven": v["closed"]}
        for label, v in sac["policies"].items()
        if label in SAC_ROWS
    }
    for label, offload in (("keep/recompute", None), ("offload", LINK)):
        try:
            out[label] = scale_fit.remat_fit(dim, 4 * time_limit, "module", layers, offload)
        except Exception as e:  # the benchmark records what failed
            out[label] = {"error": f"{type(e).__name__}: {e}"}
    return out


def table(row: dict) -> str:
    """The markdown table of a run's `point` (and `sizes`, where run), GiB = 2^30 B."""
    gib, ms = 1 << 30, 1e3
    point, plan = row["point"], row.get("plan", {})
    step = point["step s"]
    found = row.get("sizes", {})

    def largest(label: str, dim: str) -> str:
        got = found.get(dim, {}).get(label)
        if got is None:
            return "-"
        if "error" in got:
            return "error"
        if got["largest"] is None:
            return "none"
        if got["proven"]:
            return f"{got['largest']:,}"
        upper = got.get("upper")
        return f"{got['largest']:,} ({'open above' if upper is None else f'< {upper:,}'})"

    lines = [
        "| policy | budget | status | per-rank peak GiB | host GiB | predicted step ms "
        "| largest batch (seq 8192) | largest seq (batch 1) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for label in SAC_ROWS:
        got = plan.get("rows", {}).get(label)
        if got is None:
            continue
        lines.append(
            f"| {label} | - | - | {got['peak'] / gib:.2f} | 0 | "
            f"{(step + got['recompute']) * ms:.1f} | {largest(label, 'batch')} | "
            f"{largest(label, 'seq')} |"
        )
    for budget_label, solved in point["budgets"].items():
        for label in ("keep/recompute", "offload"):
            got = solved[label]
            name = f"remat {label}" if label == "keep/recompute" else "remat + offload (pcie5)"
            at = f"{budget_label} ({solved['budget'] / gib:.2f} GiB)"
            if "error" in got:
                lines.append(f"| {name} | {at} | {got['error']} | - | - | - | - | - |")
                continue
            status = f"{got['status']} gap {got['gap']:.2%}"
            if got["not built"]:
                status += " (offload model not built)"
            sizes_ = (largest(label, "batch"), largest(label, "seq"))
            if budget_label != "step budget":
                sizes_ = ("-", "-")
            lines.append(
                f"| {name} | {at} | {status} | {(point['fixed'] + got['peak']) / gib:.2f} | "
                f"{got['host_peak'] / gib:.2f} | "
                f"{(step + got['cost'] - point['once s']) * ms:.1f} | "
                f"{sizes_[0]} | {sizes_[1]} |"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", default="results")
    parser.add_argument("--layers", type=int, default=4, help="decoder layers (32: the model)")
    parser.add_argument("--time-limit", type=float, default=120, help="seconds per solve")
    parser.add_argument("--tight", type=float, default=0.9, help="of checkpoint-all's peak")
    parser.add_argument("--parts", nargs="+", default=["point", "sizes"])
    parser.add_argument("--dims", nargs="+", default=["batch", "seq"])
    parser.add_argument("--most", type=int, default=64, help="the largest SAC size tried")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    saved = out / "offload_llama.json"
    results = json.loads(saved.read_text()) if saved.exists() else {}
    row = results.setdefault(f"{args.layers} layers", {})
    if "point" in args.parts:
        plan = ["--part", "plan", "--name", NAME, "--time-limit", str(args.time_limit)]
        row["plan"] = scale_llama._child([*plan, "--layers", str(args.layers)], 600)
        row["point"] = point(NAME, args.layers, args.time_limit, args.tight)
    if "sizes" in args.parts:
        found = row.setdefault("sizes", {})
        for dim in args.dims:
            found[dim] = sizes(dim, args.layers, args.time_limit, args.most)
            saved.write_text(json.dumps(results, indent=1, default=str))
    saved.write_text(json.dumps(results, indent=1, default=str))
    if "point" in row:
        print(table(row))
        for got in row["point"]["reloads instead"]:
            print(
                f"{got['stage']}: its recomputes as reloads save "
                f"{got['recompute saved s'] * 1e3:.2f} ms of recompute, "
                f"{got['reloaded bytes'] / 2**20:.0f} MiB reloaded, stall "
                f"{got['stall s'] * 1e3:.2f} ms, step {got['cost s'] * 1e3:.1f} ms"
                f"{'' if got['within'] else ', over the budget'}"
            )


if __name__ == "__main__":
    main()
