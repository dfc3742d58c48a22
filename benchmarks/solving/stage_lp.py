"""How long the stage model's LP relaxation takes by model size: what
`SolveOptions.model_variables_per_second` is set from.

    python -m benchmarks.solving.stage_lp [--out results] [--time-limit 120] [--zoo-dir
        results/graphs]

For each published graph (`../shared/graphs`, skipped when absent) at a budget whose stage model
it builds without a recompute limit, and each zoo graph file in `--zoo-dir` at 50% of its
checkpoint-all peak: the model's variables, the seconds `build` and `solve_relaxation` take
(HiGHS dual simplex, the solver's settings; "-" where it did not end within the limit), and the
variables per LP second. One run each, on whatever the machine is doing.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import solver
from benchmarks.common import GRAPHS_DIR, Row, write_table
from solver.core.stages import checkpoint_all
from solver.deadline import Deadline
from solver.io import load_graph
from solver.milp.formulation import build
from solver.milp.lp import solve_relaxation
from solver.milp.units import CostUnits

PUBLISHED = (
    ("fcn_8_vgg_32_416x608x3_train_nx", 0.8),
    ("segnet_32_416x608x3_train_nx", 0.8),
    ("MobileNet_512_224x224x3_train_nx", 0.8),
    ("random_layered_n250_w0.43_nlv0.75_ed0.2_scd0.14", 0.9),
    ("ResNet50_256_224x224x3_train_nx", 0.8),
)
"""Graph file stem and budget share of checkpoint-all's peak."""

ZOO = ("gpt2_4", "bert_4", "llama_4")


def lp_row(label: str, path: Path, share: float, time_limit: float) -> Row:
    """One row: the stage model of the graph at `share` of its checkpoint-all peak."""
    problem = solver.prepare(load_graph(path))
    budget = int(checkpoint_all(problem).peak * share)
    int_cost = CostUnits.of(problem).int_cost
    started = time.perf_counter()
    model = build(problem, budget, int_cost)
    built = time.perf_counter() - started
    started = time.perf_counter()
    lp = solve_relaxation(model, Deadline.after(time_limit))
    seconds = time.perf_counter() - started
    return {
        "graph": label,
        "share": share,
        "variables": len(model.names),
        "build s": round(built, 2),
        "LP s": round(seconds, 2) if lp is not None else None,
        "variables per LP s": round(len(model.names) / seconds) if lp is not None else None,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("results"))
    parser.add_argument("--time-limit", type=float, default=120.0)
    parser.add_argument("--zoo-dir", type=Path, default=Path("results/graphs"))
    args = parser.parse_args(argv)
    rows = []
    for stem, share in PUBLISHED:
        path = GRAPHS_DIR / f"{stem}.json"
        if path.exists():
            rows.append(lp_row(stem.split("_")[0], path, share, args.time_limit))
            print(rows[-1], flush=True)
    for name in ZOO:
        path = args.zoo_dir / f"{name}.json"
        if path.exists():
            rows.append(lp_row(name, path, 0.5, args.time_limit))
            print(rows[-1], flush=True)
    print(write_table(rows, args.out, "stage_lp", "Stage model LP time by size"))


if __name__ == "__main__":
    main()
