"""The scope of "OPTIMAL": how often a schedule outside the stage space is cheaper.

    python -m benchmarks.solving.stage_scope [--graphs 40] [--nodes 4 5 6 7] [--seed 0] [--out
        results]
    python -m benchmarks.solving.stage_scope --training --nodes 2 3

"OPTIMAL" is proven over Checkmate's stage schedules in the graph's one node order (stage t
computes node t for the first time). On random connected DAGs of a few nodes (`random_dag`;
bytes 1-4 and costs 1-3 per node, whole numbers), at every whole budget
from the one-line bound up to the checkpoint-all peak (exclusive), the exhaustive references of
`tests/solver_reference.py` give three optima: the stage space's in the node order; every op
sequence whose first computes come in that order (any number of recomputations anywhere); and
every op sequence (any order). A case is a (graph, budget) pair some op sequence fits. Each
row counts the cases where the stage optimum is the global one, where a sequence in the same
order is cheaper, where only another order is, and where the stage space has no schedule at all,
with the largest ratio of the stage optimum over the global one; the last row sums them. With
--training, each DAG (of --nodes nodes) is the forward of a training graph
(`solver.examples.training_graph`: twice the nodes, in the order forward, then the backward
from the last node to the first, as captures order them).
`solver.solve` is checked to prove the stage optimum on every case it reaches in 10 s.
"""

from __future__ import annotations

import argparse
import random
from pathlib import Path

import networkx as nx

import solver
from benchmarks.common import Row, write_table
from solver.core.budget import checkpoint_all_peak
from solver.examples import training_graph
from tests.solver_reference import general_space_min_cost, min_cost_within, stage_space_frontier

EDGE_PROBABILITY = 0.4


def random_dag(nodes: int, rng: random.Random) -> nx.DiGraph:
    """A connected DAG on 0..nodes-1 in that order: edges i -> j (i < j) with EDGE_PROBABILITY,
    one from a random earlier node into each other node that drew none; `mem` 1-4 bytes and
    `cost` 1-3 per node."""
    graph = nx.DiGraph()
    for v in range(nodes):
        graph.add_node(v, mem=rng.randint(1, 4), cost=rng.randint(1, 3))
    for j in range(1, nodes):
        inputs = [i for i in range(j) if rng.random() < EDGE_PROBABILITY] or [rng.randrange(j)]
        graph.add_edges_from((i, j) for i in inputs)
    graph.graph["order"] = list(range(nodes))
    return graph


def cases(graph: nx.DiGraph) -> list[tuple[int, float | None, float, float]]:
    """(budget, stage optimum or None, optimum in the node order, global optimum) for every
    whole budget from the one-line bound to the checkpoint-all peak that some op sequence
    fits."""
    problem = solver.prepare(graph)
    frontier = stage_space_frontier(graph)
    out = []
    for budget in range(problem.memory_lower_bound, checkpoint_all_peak(problem)):
        best = general_space_min_cost(graph, budget)
        if best is None:
            continue
        in_order = general_space_min_cost(graph, budget, graph.graph["order"])
        assert in_order is not None  # checkpoint-all's order reaches every fitting sequence's
        out.append((budget, min_cost_within(frontier, budget), in_order, best))
    return out


def check_solver(graph: nx.DiGraph, budget: int, stage: float | None) -> None:
    """`solver.solve` proves the stage optimum (or refuses a budget no stage plan fits)."""
    try:
        schedule = solver.solve(graph, budget, time_limit=10)
    except solver.InfeasibleBudgetError:
        assert stage is None, f"solve refused a budget of {budget} B the stage space fits"
        return
    assert stage is not None and schedule.cost <= stage + 1e-9, (budget, schedule.cost, stage)
    assert schedule.status != "OPTIMAL" or abs(schedule.cost - stage) < 1e-9


def run(graphs: int, sizes: list[int], seed: int, training: bool = False) -> list[Row]:
    """One row per size: the counts described in the module docstring."""
    rng = random.Random(seed)
    rows = []
    for nodes in sizes:
        row: Row = {"nodes": 2 * nodes if training else nodes, "graphs": graphs, "cases": 0}
        row["stage is global"] = 0
        row.update({"cheaper in the same order": 0, "cheaper only in another order": 0})
        row.update({"no stage plan fits": 0, "worst stage / global": 1.0})
        for _ in range(graphs):
            graph = training_graph(random_dag(nodes, rng)) if training else random_dag(nodes, rng)
            for budget, stage, in_order, best in cases(graph):
                check_solver(graph, budget, stage)
                row["cases"] += 1
                if stage is None:
                    row["no stage plan fits"] += 1
                elif stage == best:
                    row["stage is global"] += 1
                else:
                    key = (
                        "cheaper in the same order"
                        if in_order < stage
                        else "cheaper only in another order"
                    )
                    row[key] += 1
                    row["worst stage / global"] = max(row["worst stage / global"], stage / best)
        rows.append(row)
    total: Row = {"nodes": "all", **{k: sum(r[k] for r in rows) for k in list(rows[0])[1:-1]}}
    total["worst stage / global"] = max(r["worst stage / global"] for r in rows)
    return [*rows, total]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--graphs", type=int, default=40, help="random DAGs per size")
    parser.add_argument("--nodes", type=int, nargs="+", default=[4, 5, 6, 7])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--training", action="store_true", help="training graphs of the DAGs")
    parser.add_argument("--out", type=Path, default=Path("results"))
    args = parser.parse_args(argv)
    rows = run(args.graphs, args.nodes, args.seed, args.training)
    for row in rows:
        print(row, flush=True)
    kind = "training graphs of random DAGs" if args.training else "random DAGs"
    title = f"The stage space's optimum against every schedule's, on {kind}"
    stem = "stage_scope_training" if args.training else "stage_scope"
    print(write_table(rows, args.out, stem, title).read_text())


if __name__ == "__main__":
    main()
