r"""The read-gap cover: a lower bound on the recompute cost that needs no stage model, and the
plan its solution suggests.

Stage t computes node t (`solver.milp.formulation`). When it does, node t, its inputs and every
value kept into stage t + 1 are live, and the op holds its transient bytes. Take a value i < t that
a later node reads and that is not an input of t: r_{k-1} < t < r_k, where r_0 = i < r_1 < r_2 < ...
are the stages that compute i and its users for the first time (stage j computes node j). If i is
not kept into stage t + 1, it must be live again in stage r_k, so some stage in (r_{k-1}, r_k]
recomputes it. Let x[i,k] = 1 say that i is away somewhere in its read gap (r_{k-1}, r_k). The stage
ranges of different gaps are disjoint, so every schedule recomputes i at least sum_k x[i,k] times,
and

    minimise  sum_{i,k} cost_i x[i,k]
    s.t.      sum_{i crossing t} mem_i x[i,k(i,t)]                              (each stage t)
                  >= mem_t + transient_t + sum_{p in preds(t)} mem_p + sum_{i crossing t} mem_i
                     - budget

is a relaxation of the stage model (a schedule gives a solution of no higher cost): its optimum,
and every bound CP-SAT proves on it, bounds the recompute cost of every schedule within the
budget. It leaves out the inputs a recompute needs and the memory in the middle of a stage, so it
is weak where recomputes cascade (random_layered n=250 at 80%: 1828 against a best schedule of
7189), but it has one variable per read gap (random_layered n=1000: 3.6k variables and 142 rows,
where the stage model has 4.1M variables), and on the published training graphs
it is the optimum: MobileNet and ResNet50 at 90% and 80%, FCN8 at 90% and 80%, VGG16 and VGG19
at 90% (VGG19 at 80%: 256515 against 261625).

Its solution suggests a plan (`_plan_away`): a value leaves after the read that opens a gap it is
away in and is recomputed where it is next needed; a value recomputed in the middle of such a gap
(as the input of another recompute) stays until the gap's read instead of being recomputed
again. Where that plan fits the budget and costs the bound, it is optimal with no stage model
at all (MobileNet and ResNet50 at 90% and 80%).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from solver.core.graph import Problem
from solver.core.stages import Member, StagePlan, plan_to_ops, stage_computes
from solver.deadline import Deadline
from solver.milp.cpsat import CpSatModel
from solver.milp.model import LinearModel

PRESOLVE_MAX_TERMS = 200_000
"""Above this many row terms the cover is solved without CP-SAT's presolve, which does not stop
at the deadline (NOTE [presolve time] in `solver.milp.cpsat`). Without it the cover is solved
as fast or faster on the zoo's graphs at 50% and 25% (Llama-24 at 50%: 534k terms, OPTIMAL in
1.5 s, against no solution in 6 s with it); below it presolve pays on the published random
graphs (random_layered n=1000 at 90%: OPTIMAL in 0.8 s, against 6 s FEASIBLE without)."""


@dataclass(frozen=True)
class ReadGapCover:
    """bound: proven lower bound on the recompute cost (`int_cost` units) of every stage
    schedule within the budget; member: the plan the cover's best solution suggests (it may
    exceed the budget), None when CP-SAT found no solution in time."""

    bound: int
    member: Member | None


@dataclass(frozen=True)
class _Model:
    """The covering model and, per variable, the value and its gap's stages (first, last)."""

    lm: LinearModel
    gaps: list[tuple[int, int, int]]


def _build(problem: Problem, budget: int, int_cost: Sequence[int]) -> _Model:
    lm = LinearModel()
    gaps: list[tuple[int, int, int]] = []
    crossing: list[list[tuple[int, int]]] = [[] for _ in range(problem.n)]  # (value, its x)
    for i in range(problem.n):
        previous = i
        for read in problem.succs[i]:
            if read > previous + 1 and problem.mem[i] > 0:
                x = lm.var(f"away[{i},{previous + 1}..{read - 1}]", 0, 1)
                lm.objective[x] = int_cost[i]
                gaps.append((i, previous + 1, read - 1))
                for t in range(previous + 1, read):
                    crossing[t].append((i, x))
            previous = read
    for t in range(problem.n):
        # A value crossing t is not an input of t: t would be one of its reads.
        live = problem.compute_floor(t)
        excess = live + sum(problem.mem[i] for i, _ in crossing[t]) - budget
        if excess > 0:
            lm.row([(problem.mem[i], x) for i, x in crossing[t]], excess, None)
    return _Model(lm, gaps)


def read_gap_cover(
    problem: Problem, budget: int, int_cost: Sequence[int], *, deadline: Deadline, workers: int
) -> ReadGapCover:
    """Solve the covering model with CP-SAT by `deadline`: its optimum (or the bound proven in
    time; 0 when nothing is) and the plan of its best solution. Requires
    budget >= the peak floor (`Problem.memory_lower_bound`), which makes every row
    coverable."""
    model = _build(problem, budget, int_cost)
    if not model.lm.rows:
        return ReadGapCover(0, None)
    presolve = sum(len(row[0]) for row in model.lm.rows) <= PRESOLVE_MAX_TERMS
    result = CpSatModel(model.lm).solve(deadline=deadline, workers=workers, presolve=presolve)
    assert result.status != "INFEASIBLE", "the budget is below the one-line bound"
    bound = result.proven(None)
    if result.values is None:
        return ReadGapCover(bound, None)
    away = {
        (i, t)
        for (i, first, last), chosen in zip(model.gaps, result.values, strict=True)
        if chosen
        for t in range(first, last + 1)
    }
    plan = _plan_away(problem, away)
    return ReadGapCover(bound, Member("read-gap cover", plan, plan_to_ops(problem, plan)))


def _plan_away(problem: Problem, away: set[tuple[int, int]]) -> StagePlan:
    """Stage t computes t and, recursively, every missing input; it keeps into stage t + 1 each
    value a later stage reads unless the value is away at t (a pair in `away`) and was not
    recomputed in the middle of its gap (for another recompute, not for a read)."""
    n = problem.n
    last_read = [max(users, default=-1) for users in problem.succs]
    kept: list[frozenset[int]] = [frozenset()]
    computed: list[tuple[int, ...]] = []
    retained: set[int] = set()  # recomputed in the middle of their current gap
    for t in range(n):
        live = kept[t]
        stage = stage_computes(problem, [t], live)
        computed.append(stage)
        retained.difference_update(problem.preds[t])  # their gap ends with this read
        retained.update(i for i in stage if i < t and t not in problem.succs[i])
        following = (
            i
            for i in live.union(stage)
            if last_read[i] > t and ((i, t) not in away or i in retained)
        )
        kept.append(frozenset(following) if t + 1 < n else frozenset())
    return StagePlan(tuple(computed), tuple(kept))
