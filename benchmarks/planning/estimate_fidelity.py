"""Estimate mode against the measured capture, on the zoo models at op level.

    python -m benchmarks.planning.estimate_fidelity [--models gpt2_4 resnet18 ...] [--rounds 30]
                                           [--time-limit 20] [--fraction 0.6]
                                           [--out results/estimate_fidelity]

For each zoo model (`benchmarks.zoo`; one thread): capture the real model (measured mode) and
the same model built on the meta device in estimate mode with target ``cpu``; then

- bytes node by node: the nodes whose ``mem`` differ, and those whose ``op_transient`` differs
  (estimate mode sees no kernel workspaces), with the ops they are;
- one byte budget, ``--fraction`` of the measured capture's checkpoint-all peak: a schedule
  solved on the measured graph and one solved on the estimated graph (same time limit), the
  latter matched to the measured capture by structure (`executor.traced.estimated`), both run
  on the real model: measured peak against the budget, and median step time over interleaved
  rounds (one step of each per round), the estimated schedule's over the measured one's.

Writes ``estimate_fidelity.{md,csv}`` under ``--out``.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections import Counter
from pathlib import Path

import torch

import solver
from benchmarks.common import Row, write_table
from benchmarks.running.measure import interleaved_times, loss_step, measure_peaks
from benchmarks.zoo import ZOO
from executor.traced.estimated import match_estimated
from executor.traced.module import Rematerialized
from graph_capture import capture

MODELS = ("gpt2_4", "llama_4", "bert_4", "vit_4", "resnet18", "mobilenet_v3_small")


def _differences(measured, estimated, key: str) -> tuple[int, int, str]:
    """(nodes that differ in `key`, largest difference in bytes, the ops that differ)."""
    nodes = [v for v in measured.dag if measured.dag.nodes[v][key] != estimated.dag.nodes[v][key]]
    largest = max(
        (abs(measured.dag.nodes[v][key] - estimated.dag.nodes[v][key]) for v in nodes), default=0
    )
    ops = Counter(measured.dag.nodes[v]["op"].removeprefix("aten.") for v in nodes)
    return len(nodes), largest, ", ".join(f"{op} x{n}" for op, n in ops.most_common())


def run_model(name: str, args: argparse.Namespace) -> Row:
    torch.set_num_threads(1)
    bench = ZOO[name]()
    for p in bench.model.parameters():
        p.grad = torch.zeros_like(p)
    measured = capture(bench.model, bench.inputs)
    with torch.device("meta"):
        meta = ZOO[name]()
    started = time.perf_counter()
    estimated = capture(meta.model, meta.inputs, target="cpu")
    estimate_seconds = time.perf_counter() - started
    same = estimated.dag.graph["structure"] == measured.dag.graph["structure"]
    mem_nodes, _, mem_ops = _differences(measured, estimated, "mem")
    transient_nodes, transient_largest, transient_ops = _differences(
        measured, estimated, "op_transient"
    )
    full = solver.checkpoint_all_peak(solver.prepare(measured.dag))
    budget = int(full * args.fraction)
    on_measured = solver.solve(measured.dag, budget=budget, time_limit=args.time_limit)
    solved = solver.solve(estimated.dag, budget=budget, time_limit=args.time_limit)
    on_estimated = match_estimated(solved, measured.dag, "estimated")
    steps = {
        key: loss_step(Rematerialized(bench.model, measured, schedule), bench.inputs)
        for key, schedule in (("measured", on_measured), ("estimated", on_estimated))
    }
    peaks = measure_peaks(steps)
    times = interleaved_times(steps, args.rounds)
    median = {key: statistics.median(t) for key, t in times.items()}
    return {
        "model": name,
        "nodes": len(measured.dag),
        "same graph": "yes" if same else "NO",
        "estimate s": round(estimate_seconds, 1),
        "mem differs": f"{mem_nodes}" + (f" ({mem_ops})" if mem_nodes else ""),
        "op_transient differs (largest B)": f"{transient_nodes} ({transient_largest})",
        "workspace ops": transient_ops,
        "budget B": budget,
        "est. predicted peak": solved.peak,
        "est. on measured graph": on_estimated.peak,
        "est. measured peak": peaks["estimated"],
        "est. within budget": "yes" if peaks["estimated"] <= budget else "NO",
        "meas. measured peak": peaks["measured"],
        "meas. within budget": "yes" if peaks["measured"] <= budget else "NO",
        "recomputes est. / meas.": f"{solved.recomputes} / {on_measured.recomputes}",
        "step ms est. / meas.": f"{median['estimated'] * 1e3:.2f} / {median['measured'] * 1e3:.2f}",
        "time est. / meas.": round(median["estimated"] / median["measured"], 4),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=sorted(ZOO))
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--time-limit", type=float, default=20.0)
    parser.add_argument("--fraction", type=float, default=0.6)
    parser.add_argument("--out", type=Path, default=Path("results/estimate_fidelity"))
    args = parser.parse_args(argv)
    rows = []
    for name in args.models:
        rows.append(run_model(name, args))
        print(rows[-1], flush=True)
    path = write_table(
        rows, args.out, "estimate_fidelity", "Estimate mode (target cpu) vs measured"
    )
    print(path.read_text())


if __name__ == "__main__":
    main()
