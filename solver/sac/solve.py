"""The least-recompute SAC plan under a peak budget, as a 0/1 model solved by CP-SAT.

Variables: c_j (block j is a checkpoint region), s_i (op i of block j is MUST_SAVE; only for
saveable ops up to the block's `stop`, s_i <= c_j), and the peak P <= budget. With b_i the
bytes of op i's new storage and the savings of block j

    d_j = c_j * (sum_i a_i - held_extra_j) - sum_i s_i * (b_i - o_i),
    D_j = sum_{k<j} d_k,

every term of NOTE [ SAC memory model ] (solver/sac/memory.py) is linear in (c, s):

    segment:             peak - D_held                                  <= P
    backward (any j):    b_peak_j - D_j + c_j held_extra_j              <= P
    forward, c_j = 0:    f_peak_j - D_j                                 <= P
    forward, c_j = 1:    f_start_j - D_j + w_j + x_t
                         + sum_{i<=t} b_i [last_read_i >= t or s_i]     <= P  (every t)
    recompute, c_j = 1:  b_start_j - D_j - d_j + w_j + r_j + x_t (1 - s_t)
                         + sum_{i<=t} (1 - s_i) (b_i if last_read_i >= t else a_i)
                                                                        <= P  (t <= stop)

(b_i: op i's new bytes, a_i: those autograd saves, o_i: those of the block's output, which
live on whatever the plan; x_t: op t's scratch bytes; s_t = 0 where op t is not saveable.)

and the recompute seconds are sum_j sum_{i<=stop_j} seconds_i (c_j - s_i). Objective: the
seconds (in whole nanoseconds), or P for the least peak. Every returned plan is evaluated by
`solver.sac.memory` (the reference), whose peak and cost are the ones reported.
"""

from __future__ import annotations

from dataclasses import dataclass

from ortools.sat.python import cp_model

from solver.deadline import Deadline
from solver.errors import InfeasibleBudgetError, SolverTimeoutError
from solver.sac.memory import SacPlan, plan_cost, plan_peak
from solver.sac.problem import SacProblem

NS = 1e9
"""Cost units per second in the 0/1 model (whole nanoseconds)."""

WORKERS = 8
"""CP-SAT workers (FIELD-NOTES: 8 on 2 cores proves what 2 cannot; the portfolio has LP
workers)."""


@dataclass(frozen=True)
class SacSolution:
    """A solved plan: `peak` (predicted bytes) and `cost` (recompute seconds) from the reference
    model, `status` ("OPTIMAL" or "FEASIBLE"), `bound` (proven lower bound on the cost, seconds),
    `gap` ((cost - bound) / cost, 0 when cost is 0) and `budget` (bytes)."""

    plan: SacPlan
    peak: int
    cost: float
    status: str
    bound: float
    gap: float
    budget: int


class _Model:
    """The CP-SAT model of the docstring for one problem; `peak` is P."""

    def __init__(self, problem: SacProblem, budget: int) -> None:
        self.problem = problem
        m = self.m = cp_model.CpModel()
        self.peak = m.NewIntVar(-(2**50), budget, "P")
        self.c = [m.NewBoolVar(f"c{j}") for j in range(len(problem.blocks))]
        self.s: list[dict[int, cp_model.IntVar]] = []
        for j, block in enumerate(problem.blocks):
            choices = {}
            for i, op in enumerate(block.ops[: block.stop + 1]):
                if op.saveable:
                    choices[i] = m.NewBoolVar(f"s{j}_{i}")
                    m.AddImplication(choices[i], self.c[j])
            self.s.append(choices)
        self._memory_terms()

    def _savings(self, j: int) -> cp_model.LinearExpr:
        block = self.problem.blocks[j]
        plain = sum(op.saved_bytes for op in block.ops)
        kept = sum(
            (block.ops[i].new_bytes - block.ops[i].output_bytes) * v for i, v in self.s[j].items()
        )
        return (plain - block.held_extra) * self.c[j] - kept

    def _memory_terms(self) -> None:
        m, P = self.m, self.peak
        d = [self._savings(j) for j in range(len(self.problem.blocks))]
        before = [sum(d[:j]) for j in range(len(d) + 1)]
        for seg in self.problem.segments:
            m.Add(seg.peak - before[seg.held] <= P)
        for j, block in enumerate(self.problem.blocks):
            c, s = self.c[j], self.s[j]
            m.Add(block.b_peak - before[j] + block.held_extra * c <= P)
            m.Add(block.f_peak - before[j] <= P).OnlyEnforceIf(c.Not())
            base = block.f_start - before[j] + block.workspace
            for t in range(len(block.ops)):
                live = block.ops[t].scratch
                for i, op in enumerate(block.ops[: t + 1]):
                    if op.last_read >= t:
                        live += op.new_bytes
                    elif i in s:
                        live += op.new_bytes * s[i]
                m.Add(base + live <= P).OnlyEnforceIf(c)
            base = block.b_start - before[j] - d[j] + block.workspace + block.recompute_extra
            for t in range(block.stop + 1):
                scratch = block.ops[t].scratch
                live = scratch * (1 - s[t]) if t in s else scratch
                for i, op in enumerate(block.ops[: t + 1]):
                    held = op.new_bytes if op.last_read >= t else op.saved_bytes
                    live += held * (1 - s[i]) if i in s else held
                m.Add(base + live <= P).OnlyEnforceIf(c)

    def cost(self) -> cp_model.LinearExpr:
        terms = 0
        for j, block in enumerate(self.problem.blocks):
            for i, op in enumerate(block.ops[: block.stop + 1]):
                ns = round(op.seconds * NS)
                terms += ns * (self.c[j] - self.s[j][i]) if i in self.s[j] else ns * self.c[j]
        return terms

    def solve(self, deadline: Deadline) -> tuple[cp_model.CpSolver, int]:
        solver = cp_model.CpSolver()
        solver.parameters.max_time_in_seconds = max(deadline.remaining(), 0.01)
        solver.parameters.num_workers = WORKERS
        return solver, solver.Solve(self.m)

    def plan(self, solver: cp_model.CpSolver) -> SacPlan:
        return SacPlan(
            tuple(bool(solver.Value(c)) for c in self.c),
            tuple(frozenset(i for i, v in s.items() if solver.Value(v)) for s in self.s),
        )


def least_peak(problem: SacProblem, deadline: Deadline) -> tuple[SacPlan, int, bool]:
    """The plan of least predicted peak (bytes), whether that is proven, ties broken by nothing."""
    model = _Model(problem, problem.plain_peak + _upper_slack(problem))
    model.m.Minimize(model.peak)
    solver, status = model.solve(deadline)
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        raise SolverTimeoutError("no SAC plan found within the time limit: give more time")
    plan = model.plan(solver)
    return plan, plan_peak(problem, plan), status == cp_model.OPTIMAL


def _upper_slack(problem: SacProblem) -> int:
    """Bytes by which a plan's peak may exceed the plain step's (a checkpoint holding inputs the
    plain block frees): bounds P's domain for the least-peak search."""
    return sum(max(b.held_extra, 0) + b.workspace for b in problem.blocks) + sum(
        op.new_bytes for b in problem.blocks for op in b.ops
    )


def solve_sac(problem: SacProblem, budget: int | str, deadline: Deadline) -> SacSolution:
    """The plan of least recompute seconds whose predicted peak is at most `budget` bytes;
    `"min"`: at the least peak any plan reaches. InfeasibleBudgetError names that least peak
    when the budget is below it; SolverTimeoutError when no plan is found in time."""
    if budget == "min":
        plan, least, _ = least_peak(problem, deadline.share(0.5))
        budget = least
    model = _Model(problem, int(budget))
    model.m.Minimize(model.cost())
    solver, status = model.solve(deadline)
    if status == cp_model.INFEASIBLE:
        _, least, proven = least_peak(problem, Deadline.after(max(deadline.remaining(), 5.0)))
        raise InfeasibleBudgetError(
            f"no SAC plan fits {budget} bytes: the least predicted peak in SAC's space is "
            f"{least} bytes{'' if proven else ' (found, not proven least)'}; give at least that",
            least if proven else None,
            int(budget) + 1,
        )
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        raise SolverTimeoutError(f"no SAC plan within {budget} bytes found in time: give more time")
    plan = model.plan(solver)
    peak, cost = plan_peak(problem, plan), plan_cost(problem, plan)
    if peak > budget:
        raise AssertionError(f"CP-SAT's plan peaks at {peak} > {budget} bytes in the reference")
    bound = min(solver.BestObjectiveBound() / NS, cost)
    optimal = status == cp_model.OPTIMAL
    gap = 0.0 if optimal or cost <= 0 else (cost - bound) / cost
    return SacSolution(plan, peak, cost, "OPTIMAL" if optimal else "FEASIBLE", bound, gap, budget)
