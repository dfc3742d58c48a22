r"""The exact solver: a CP-SAT model of Checkmate's stage formulation.

Variables (stage t = 0..n-1, node i <= t, nodes in solver order):

    R[t,i] in {0,1}   node i is computed in stage t            (R[t,t] = 1)
    S[t,i] in {0,1}   value i is live when stage t begins      (i < t; S[0,.] = S[n,.] = 0)
    F[t,i,k] in {0,1} value i is freed right after computing k in stage t  (i in preds(k) + {k})
    U[t,k] >= 0       bytes live right after computing k in stage t

Constraints:

    (1) S[t+1,i] <= S[t,i] + R[t,i]                  a kept value was live in stage t
    (2) R[t,j]   <= R[t,i] + S[t,i]   for i -> j     inputs are live when a node is computed
    (3) R[t,i] + S[t,i] <= 1                         never compute a live value
    (4) F[t,i,k] <= R[t,k];  F[t,i,k] <= 1 - S[t+1,i];  F[t,i,k] <= 1 - R[t,j] for users j of i,
        k < j <= t                                   free only after the last use in the stage
    (5) U[t,k] = sum_i mem_i S[t,i] + sum_{j<=k} mem_j R[t,j]
                 - sum_{j<k} sum_{i in preds(j)+{j}} mem_i F[t,i,j]    <= budget (or <= peak)
    (6) S[t,i] <= S[t+1,i] + sum_{users j <= t} R[t,j]   carried values are used (dominance)
    (7) R[t,i] <= S[t+1,i] + sum_{users i < j <= t} R[t,j]  recomputed values are used (dominance)

Objective "cost": min sum_{t,i<t} cost_i R[t,i] (plus the fixed first computes).
Objective "memory": min peak subject to sum_{t,i} cost_i R[t,i] <= compute budget.

(6) and (7) only remove dominated solutions (dropping the useless value lowers cost and memory), so
the optimum is unchanged. The model is warm-started from the best baseline schedule, so it always
has an incumbent. Costs must be integers for CP-SAT: non-integer costs are scaled by a power of
ten (at most 1e6) and rounded, and the resolution is recorded in the schedule's `extra`.
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

import networkx as nx
from ortools.sat.python import cp_model

from solver.baselines import BASELINES, Member, cheapest_within, smallest_within
from solver.budget import parse_budget, parse_compute_budget
from solver.errors import ComputeBudgetError, InfeasibleBudgetError, SolverTimeoutError
from solver.graph import Problem, prepare
from solver.schedule import Schedule, make_schedule
from solver.stages import StagePlan, checkpoint_all, plan_to_ops

ProgressFn = Callable[[float, float, float], None]
"""Called on each improving solution with (seconds, objective, bound) in graph units."""


def integer_costs(problem: Problem) -> tuple[list[int], float]:
    """Integer costs for CP-SAT and the unit they are in (cost = int_cost * unit).

    Whole-number costs are used as they are (unit 1, exact). Otherwise costs are scaled by the
    smallest power of ten that makes them whole (to 1e-9), at most 1e6; failing that, rounded at
    a resolution of max(cost) / 1e6.
    """
    costs = problem.cost
    for digits in range(7):
        scale = 10**digits
        if all(abs(c * scale - round(c * scale)) <= 1e-9 * max(1.0, c * scale) for c in costs):
            return [round(c * scale) for c in costs], 1.0 / scale
    unit = max(costs) / 1e6
    return [round(c / unit) for c in costs], unit


@dataclass
class _Model:
    """Variables of one CP-SAT model, kept together so hints and solutions map back to a plan."""

    model: cp_model.CpModel
    compute: list[dict[int, cp_model.IntVar]]
    keep: list[dict[int, cp_model.IntVar]]
    free: list[dict[tuple[int, int], cp_model.IntVar]]
    recompute_cost: cp_model.LinearExpr
    peak: cp_model.IntVar | None


def _variables(m: cp_model.CpModel, problem: Problem) -> tuple[list, list, list]:
    n = problem.n
    compute = [{i: m.new_bool_var(f"R[{t},{i}]") for i in range(t)} for t in range(n)]
    keep = [{i: m.new_bool_var(f"S[{t},{i}]") for i in range(t)} for t in range(n)]
    free = [
        {
            (i, k): m.new_bool_var(f"F[{t},{i},{k}]")
            for k in range(t + 1)
            for i in (*problem.preds[k], k)
        }
        for t in range(n)
    ]
    return compute, keep, free


def _build(
    problem: Problem, budget: int | None, int_cost: list[int], compute_budget_int: int | None
) -> _Model:
    """Write constraints (1)-(7) and the objective for one budget (see the module docstring)."""
    n = problem.n
    m = cp_model.CpModel()
    compute, keep, free = _variables(m, problem)
    true = m.new_constant(1)
    false = m.new_constant(0)

    def r(t: int, i: int):
        return true if i == t else compute[t][i]

    def s(t: int, i: int):
        return keep[t][i] if t < n and i < t else false

    mem_cap = sum(problem.mem)
    peak = None
    if budget is None:
        peak = m.new_int_var(problem.memory_lower_bound, mem_cap, "peak")
    for t in range(n):
        for i in range(t):
            m.add(s(t + 1, i) <= s(t, i) + r(t, i))  # (1)
            m.add(r(t, i) + s(t, i) <= 1)  # (3)
            users = [r(t, j) for j in problem.succs[i] if j <= t]
            m.add(s(t, i) <= s(t + 1, i) + sum(users))  # (6)
            m.add(r(t, i) <= s(t + 1, i) + sum(r(t, j) for j in problem.succs[i] if i < j <= t))
        for j in range(t + 1):
            for i in problem.preds[j]:
                m.add(r(t, j) <= r(t, i) + s(t, i))  # (2)
        for (i, k), f in free[t].items():  # (4)
            if k < t:
                m.add_implication(f, compute[t][k])
            m.add(f + s(t + 1, i) <= 1)
            for j in problem.succs[i]:
                if k < j <= t:
                    m.add(f + r(t, j) <= 1)
        live = sum(problem.mem[i] * s(t, i) for i in range(t))  # (5)
        for k in range(t + 1):
            live = live + problem.mem[k] * r(t, k)
            level = m.new_int_var(0, mem_cap, f"U[{t},{k}]")
            m.add(level == live)
            m.add(level <= (budget if budget is not None else peak))
            live = level - sum(problem.mem[i] * free[t][(i, k)] for i in (*problem.preds[k], k))
    recompute_cost = sum(int_cost[i] * compute[t][i] for t in range(n) for i in range(t))
    if compute_budget_int is not None:
        m.add(recompute_cost <= compute_budget_int)
    if budget is None:
        m.minimize(peak)
    else:
        m.minimize(recompute_cost)
    return _Model(m, compute, keep, free, recompute_cost, peak)


def _hint(built: _Model, problem: Problem, plan: StagePlan) -> None:
    """Hint every R, S and F variable from a plan (F from its eager frees)."""
    m = built.model
    for t, stage in enumerate(plan.computed):
        members = set(stage)
        for i, var in built.compute[t].items():
            m.add_hint(var, i in members)
        for i, var in built.keep[t].items():
            m.add_hint(var, i in plan.kept[t])
        last_use: dict[int, int] = {}
        for k in stage:
            last_use[k] = k
            for p in problem.preds[k]:
                last_use[p] = k
        for (i, k), var in built.free[t].items():
            m.add_hint(var, last_use.get(i) == k and k in members and i not in plan.kept[t + 1])


def _plan_from_solution(solver: cp_model.CpSolver, built: _Model, n: int) -> StagePlan:
    computed = tuple(
        tuple(sorted([i for i, v in built.compute[t].items() if solver.boolean_value(v)] + [t]))
        for t in range(n)
    )
    kept = tuple(
        frozenset(i for i, v in built.keep[t].items() if solver.boolean_value(v)) for t in range(n)
    )
    return StagePlan(computed, (*kept, frozenset()))


class _Progress(cp_model.CpSolverSolutionCallback):
    def __init__(self, report: ProgressFn, scale: float, offset: float) -> None:
        super().__init__()
        self._report, self._scale, self._offset = report, scale, offset

    def on_solution_callback(self) -> None:
        self._report(
            self.wall_time,
            self.objective_value * self._scale + self._offset,
            self.best_objective_bound * self._scale + self._offset,
        )


def print_progress(seconds: float, objective: float, bound: float) -> None:
    """A ProgressFn that writes one line per improving solution to stderr."""
    print(f"  [{seconds:7.2f}s] incumbent {objective:.6g}  bound {bound:.6g}", file=sys.stderr)


def _run(
    built: _Model,
    time_limit: float,
    workers: int,
    progress: ProgressFn | None,
    scale: float,
    offset: float,
) -> tuple[cp_model.CpSolver, int]:
    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = max(0.01, time_limit)
    solver.parameters.num_workers = workers
    # Linearising the memory constraints for the LP workers tightened the bound: VGG19 80%
    # proved in 16 s instead of 28 s, FCN8 80% in 17 s instead of 21 s (both on a loaded machine).
    solver.parameters.linearization_level = 2
    callback = _Progress(progress, scale, offset) if progress else None
    status = solver.solve(built.model, callback)
    return solver, status


def _family_members(problem: Problem) -> list[Member]:
    return [m for family in BASELINES.values() for m in family(problem)]


def human_bytes(n: float) -> str:
    """Bytes as text with a binary unit, e.g. 1536 -> '1.50 KiB'."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    raise AssertionError


def minimum_peak(
    graph: nx.DiGraph,
    *,
    time_limit: float = 60.0,
    workers: int = 8,
    progress: ProgressFn | bool | None = None,
) -> Schedule:
    """The schedule of least peak memory with unlimited recomputation (objective="memory")."""
    return solve(
        graph, objective="memory", time_limit=time_limit, workers=workers, progress=progress
    )


@dataclass
class _Run:
    """Everything one `solve` call shares between its steps."""

    graph: nx.DiGraph
    problem: Problem
    objective: str
    time_limit: float
    workers: int
    report: ProgressFn | None
    int_cost: list[int]
    unit: float
    started: float

    @property
    def offset(self) -> float:
        """Cost of the first computes, in graph units (the objective counts recomputes only)."""
        return sum(self.int_cost) * self.unit

    def remaining(self) -> float:
        return self.time_limit - (time.perf_counter() - self.started)

    def finish(
        self,
        ops,
        status: str,
        bound: float | None,
        *,
        budget: int | None = None,
        compute_budget: float | None = None,
        method: str = "exact",
    ) -> Schedule:
        return make_schedule(
            self.graph,
            self.problem,
            ops,
            method=method,
            objective=self.objective,
            status=status,
            bound=bound,
            budget=budget,
            compute_budget=compute_budget,
            solve_seconds=time.perf_counter() - self.started,
            extra={"cost_unit": self.unit},
        )


def solve(
    graph: nx.DiGraph,
    budget: int | str | None = None,
    *,
    objective: str = "cost",
    compute_budget: float | str | None = None,
    time_limit: float = 60.0,
    workers: int = 8,
    progress: ProgressFn | bool | None = None,
) -> Schedule:
    """Solve for the optimal schedule in the Checkmate stage space.

    Args:
        graph: DAG with `mem` (bytes) and `cost` on every node (see `solver.graph`).
        budget: peak-memory budget for objective="cost": bytes, or text like "512MiB" / "80%"
            (of the checkpoint-all peak). None means unconstrained.
        objective: "cost" (least total cost with peak <= budget) or "memory" (least peak with
            total cost <= compute_budget).
        compute_budget: for objective="memory": cost units, or text like "1.2x" (of the
            checkpoint-all cost). None means unlimited.
        time_limit: seconds for CP-SAT; at the limit the best schedule found so far comes back
            with status "FEASIBLE" and its proven bound.
        workers: CP-SAT search workers (more than the cores still helps: the portfolio differs).
        progress: True to print each improving solution to stderr, or a ProgressFn.

    Raises:
        InfeasibleBudgetError: no schedule fits the budget (names the minimum when it is found).
        ComputeBudgetError: objective="memory" and the compute budget is below the total cost.
        SolverTimeoutError: no schedule within the budget was found within the time limit.
    """
    started = time.perf_counter()
    if objective not in ("cost", "memory"):
        raise ValueError(f"objective must be 'cost' or 'memory', not {objective!r}")
    problem = prepare(graph)
    report = print_progress if progress is True else (progress or None)
    int_cost, unit = integer_costs(problem)
    run = _Run(graph, problem, objective, time_limit, workers, report, int_cost, unit, started)
    if objective == "cost":
        return _solve_cost(run, None if budget is None else parse_budget(budget, problem))
    limit = None if compute_budget is None else parse_compute_budget(compute_budget, problem)
    return _solve_memory(run, limit)


def _solve_cost(run: _Run, budget: int | None) -> Schedule:
    problem = run.problem
    everything = checkpoint_all(problem)
    if budget is None or everything.peak <= budget:
        # No recomputation at all fits: the cost cannot go below computing every node once.
        return run.finish(everything, "OPTIMAL", problem.total_cost, budget=budget)
    if budget < problem.memory_lower_bound:
        _raise_infeasible(run, budget)
    warm = cheapest_within(_family_members(problem), budget)
    built = _build(problem, budget, run.int_cost, None)
    if warm is not None:
        _hint(built, problem, warm.plan)
    solver, status = _run(built, run.remaining(), run.workers, run.report, run.unit, run.offset)
    bound = solver.best_objective_bound * run.unit + run.offset
    if status in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        found = plan_to_ops(problem, _plan_from_solution(solver, built, problem.n))
        if warm is not None and warm.schedule.cost < found.cost and status != cp_model.OPTIMAL:
            found = warm.schedule  # never return worse than the heuristic it started from
        verdict = "OPTIMAL" if status == cp_model.OPTIMAL else "FEASIBLE"
        return run.finish(found, verdict, bound, budget=budget)
    if status == cp_model.INFEASIBLE:
        _raise_infeasible(run, budget)
    if warm is not None:
        return run.finish(
            warm.schedule, "FEASIBLE", max(bound, problem.total_cost), budget=budget, method="exact"
        )
    raise SolverTimeoutError(
        f"no schedule within {human_bytes(budget)} was found in {run.time_limit:g} s and no "
        "baseline fits that budget; raise the time limit (--time-limit) or the budget"
    )


def _solve_memory(run: _Run, compute_budget: float | None) -> Schedule:
    problem = run.problem
    if compute_budget is not None and compute_budget < problem.total_cost * (1 - 1e-12):
        raise ComputeBudgetError(
            f"compute budget {compute_budget:g} is below {problem.total_cost:g}, the cost of "
            "computing every node once; no schedule can fit (use a budget >= 1.0x)"
        )
    warm = smallest_within(_family_members(problem), compute_budget)
    recompute_limit = None
    if compute_budget is not None:
        recompute_limit = math.floor(compute_budget / run.unit + 1e-9) - sum(run.int_cost)
    built = _build(problem, None, run.int_cost, recompute_limit)
    if warm is not None:
        _hint(built, problem, warm.plan)
    solver, status = _run(built, run.remaining(), run.workers, run.report, 1.0, 0.0)
    if status in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        plan = _plan_from_solution(solver, built, problem.n)
        verdict = "OPTIMAL" if status == cp_model.OPTIMAL else "FEASIBLE"
        bound = max(float(solver.best_objective_bound), float(problem.memory_lower_bound))
        return run.finish(plan_to_ops(problem, plan), verdict, bound, compute_budget=compute_budget)
    if warm is None:  # checkpoint-all always fits a compute budget >= the total cost
        raise AssertionError("no baseline fits a compute budget above the total cost")
    return run.finish(
        warm.schedule, "FEASIBLE", float(problem.memory_lower_bound), compute_budget=compute_budget
    )


def _raise_infeasible(run: _Run, budget: int) -> None:
    """Find the least feasible peak (within the remaining time) and raise with it named."""
    problem = run.problem
    lower = problem.memory_lower_bound
    memory_run = _Run(
        run.graph,
        problem,
        "memory",
        max(1.0, run.remaining()),
        run.workers,
        None,
        run.int_cost,
        run.unit,
        time.perf_counter(),
    )
    least = _solve_memory(memory_run, None)
    if least.status == "OPTIMAL":
        minimum, what = least.peak, f"the minimum feasible budget is {least.peak} bytes"
    else:
        minimum = None
        what = (
            f"the minimum feasible budget is between {int(least.bound or lower)} and "
            f"{least.peak} bytes (not proven within the time limit)"
        )
    raise InfeasibleBudgetError(
        f"no schedule fits a budget of {budget} bytes ({human_bytes(budget)}): {what} "
        f"({human_bytes(least.peak)}); raise the budget to at least that",
        minimum_bytes=minimum,
        lower_bound_bytes=max(lower, int(least.bound or lower)),
    )
