"""The seed claims on uniform stacks, predicted (solver model, units) and measured (torch).

Predicted: training graph of a uniform chain of n blocks (1 byte unit, forward cost 1, backward
cost 2 per block). every-k keeps every k-th block: peak in units and forward recomputes;
the exact solver and rotor at the same peak. Measured: a stack of n identical MLP blocks run
plainly and with `torch.utils.checkpoint.checkpoint_sequential` at several segment counts, peak
bytes and median step seconds side by side in one process.

Run: python -m benchmarks.solving.seeds [--quick] [--out results]
"""

from __future__ import annotations

import math

import solver
from benchmarks.common import Row, Settings, command_line, exact_row, plot_frontier, write_table
from benchmarks.running.measure import Step, measure
from solver.core.stages import cheapest_within
from solver.examples import uniform_training_chain
from solver.heuristics.baselines import BASELINES
from solver.heuristics.rotor import rotor


def every_k_rows(n: int, settings: Settings) -> list[Row]:
    """Per k: peak units and forward recomputes of every-k on a uniform n-chain, and the exact
    solver's and rotor's recomputes at that same peak."""
    graph = uniform_training_chain(n)
    problem = solver.prepare(graph)
    fwd_cost = n  # one unit per forward block
    rotor_family = rotor(problem)
    rows = []
    ks = sorted({1, 2, 3, 4, 5, 6, 7, 8, 9, round(math.sqrt(n)), n // 2, n})
    exact_ks = {4, 7, 8, round(math.sqrt(n))}
    for member in BASELINES["every_k"](problem):
        k = int(member.param.split("=")[1])
        if k not in ks:
            continue
        peak, extra = member.schedule.peak, member.schedule.cost - problem.total_cost
        row: Row = {
            "n": n,
            "k": k,
            "k+n/k": round(k + n / k, 2),
            "every_k_peak": peak,
            "every_k_recompute": extra,
            "recompute/forward": extra / fwd_cost,
            "overhead": extra / problem.total_cost,
        }
        best_rotor = cheapest_within(rotor_family, peak)
        row["rotor_recompute"] = best_rotor.schedule.cost - problem.total_cost
        if (k in exact_ks and not settings.quick) or (settings.quick and k == 4 and n <= 16):
            found, _ = exact_row(graph, peak, settings)
            row["exact_recompute"] = found["cost"] - problem.total_cost if "cost" in found else None
            row["exact_status"] = found["status"]
            row["exact_gap"] = found.get("gap")
        rows.append(row)
    return rows


def verdicts(rows: list[Row]) -> list[Row]:
    """The seed claims against the rows: each claim, what was measured, and a verdict."""
    out = []
    r48 = [r for r in rows if r["n"] == 48]
    if r48:
        best = min(r48, key=lambda r: (r["every_k_peak"], r["k"]))
        k4 = next(r for r in r48 if r["k"] == 4)
        out.append(
            {
                "claim": "n=48: retained units k + n/k, optimum near k=7, about 14 units vs 48",
                "measured": f"best k={best['k']}: {best['every_k_peak']} units; "
                f"checkpoint-all {next(r for r in r48 if r['k'] == 1)['every_k_peak']}",
                "verdict": "holds" if abs(best["every_k_peak"] - 14) <= 3 else "refuted",
            }
        )
        out.append(
            {
                "claim": "n=48: every 4th gives about 16 units",
                "measured": f"{k4['every_k_peak']} units",
                "verdict": "holds" if abs(k4["every_k_peak"] - 16) <= 2 else "refuted",
            }
        )
    r64 = [r for r in rows if r["n"] == 64]
    if r64:
        sq = next(r for r in r64 if r["k"] == 8)
        out.append(
            {
                "claim": "n=64: sqrt gives 64 -> 16 units with about one extra forward (~33%)",
                "measured": f"{sq['every_k_peak']} units, {sq['recompute/forward']:.2f} extra "
                f"forwards, overhead {sq['overhead']:.1%} of a step",
                "verdict": "holds"
                if abs(sq["every_k_peak"] - 16) <= 2 and 0.8 < sq["recompute/forward"] <= 1
                else "refuted",
            }
        )
        spread = [r["recompute/forward"] for r in r64 if 2 <= r["k"] <= 16]
        out.append(
            {
                "claim": "n=64: the recompute overhead does not depend on k",
                "measured": f"extra forwards (n - n/k) {min(spread):.2f}..{max(spread):.2f} "
                "for k=2..16",
                "verdict": "holds" if max(spread) - min(spread) < 0.1 else "refuted for small k",
            }
        )
    cells = [r for r in rows if r.get("exact_recompute") is not None]
    for method, col in (("exact (time-limited)", "exact_recompute"), ("rotor", "rotor_recompute")):
        wins = [r for r in cells if r[col] < r["every_k_recompute"]]
        out.append(
            {
                "claim": f"{method} at the same memory recomputes less than every-k/sqrt(n)",
                "measured": f"less in {len(wins)}/{len(cells)} (n, k) cells: "
                + "; ".join(
                    f"n={r['n']} k={r['k']}: {r[col]:g} vs {r['every_k_recompute']:g}"
                    for r in cells
                ),
                "verdict": "holds" if wins else "not within the time limit",
            }
        )
    return out


def measured_stack(n: int, settings: Settings) -> list[Row]:
    """Plain vs checkpoint_sequential on n identical blocks: measured peak and median step time
    (side by side), next to the solver model's compute ratio for the same segmentation
    (checkpoint_sequential recomputes every segment but the last once; backward = 2 forwards)."""
    import torch
    from torch import nn
    from torch.utils.checkpoint import checkpoint_sequential

    from benchmarks.models import mlp_block

    torch.manual_seed(0)
    width, batch = (64, 32) if settings.quick else (256, 128)
    stack = nn.Sequential(*(mlp_block(width) for _ in range(n)))
    x = torch.randn(batch, width, requires_grad=True)

    def step(segments: int | None) -> Step:
        def run() -> None:
            out = (
                stack(x)
                if segments is None
                else checkpoint_sequential(stack, segments, x, use_reentrant=False)
            )
            out.square().mean().backward()

        return run

    variants = [None, *sorted({2, 4, round(math.sqrt(n)), n // 4})]
    label = {s: "plain" if s is None else f"checkpoint_sequential({s})" for s in variants}
    results = measure({label[s]: step(s) for s in variants}, settings.repeats)
    plain = results["plain"]
    rows = []
    for segments in variants:
        measured = results[label[segments]]
        recomputed = 0 if segments is None else n - n / segments
        rows.append(
            {
                "n": n,
                "variant": label[segments],
                "peak_MiB": measured["peak_MiB"],
                "peak_ratio": measured["peak_MiB"] / plain["peak_MiB"],
                "step_ms": measured["step_ms"],
                "time_ratio": measured["step_ms"] / plain["step_ms"],
                "model_compute_ratio": 1 + recomputed / (3 * n),
            }
        )
    return rows


def run(settings: Settings) -> list[Row]:
    """All seed tables; returns the verdict rows (also written as seeds_verdicts.*)."""
    sizes = (16, 48) if settings.quick else (16, 48, 64)
    rows = [r for n in sizes for r in every_k_rows(n, settings)]
    write_table(rows, settings.out, "seeds_every_k", "Uniform stacks: every-k vs exact vs rotor")
    measured = [
        r for n in ((16,) if settings.quick else (16, 64)) for r in measured_stack(n, settings)
    ]
    write_table(measured, settings.out, "seeds_measured", "Uniform MLP stack, measured")
    verdict_rows = verdicts(rows)
    write_table(verdict_rows, settings.out, "seeds_verdicts", "Seed claims")
    frontier_rows = [
        {
            "graph": f"uniform n={r['n']}",
            "budget_frac": r["every_k_peak"] / (r["n"] + 1),  # checkpoint-all: n + 1 units
            "method": m,
            "overhead": r[col] / (3 * r["n"]) if r.get(col) is not None else None,
        }
        for r in rows
        if r["n"] == sizes[-1]
        for m, col in (("every_k", "every_k_recompute"), ("rotor", "rotor_recompute"))
    ]
    plot_frontier(frontier_rows, settings.out / "seeds_uniform.png", f"uniform n={sizes[-1]}")
    return verdict_rows


def main(argv: list[str] | None = None) -> None:
    command_line(run, __doc__.splitlines()[0], argv)


if __name__ == "__main__":
    main()
