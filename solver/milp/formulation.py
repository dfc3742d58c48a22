r"""Checkmate's stage formulation as a solver-neutral 0/1 linear model.

Variables (stage t = 0..n-1, node i <= t, nodes in solver order):

    R[t,i] in {0,1}   node i is computed in stage t            (R[t,t] = 1)
    S[t,i] in {0,1}   value i is live when stage t begins      (i < t; S[0,.] = S[n,.] = 0)
    F[t,i,k] in {0,1} value i is freed right after computing k in stage t  (i in preds(k); i = k
                      only for k = t: see `_freeable`)
    U[t,k] >= 0       bytes live right after computing k in stage t

Constraints:

    (1) S[t+1,i] <= S[t,i] + R[t,i]                  a kept value was live in stage t
    (2) R[t,j]   <= R[t,i] + S[t,i]   for i -> j     inputs are live when a node is computed
    (3) R[t,i] + S[t,i] <= 1                         never compute a live value
    (4) F[t,i,k] <= R[t,k];  F[t,i,k] + S[t+1,i] <= 1;  F[t,i,k] + R[t,j] <= 1 for users j of i,
        k < j <= t                                   free only after the last use in the stage
    (5) U[t,k] = sum_i mem_i S[t,i] + sum_{j<=k} mem_j R[t,j]
                 - sum_{j<k} sum_{i in preds(j)+{j}} mem_i F[t,i,j];
        U[t,k] + transient_k R[t,k] <= budget (or <= peak)
    (6) S[t,i] <= S[t+1,i] + sum_{users j <= t} R[t,j]   carried values are used (dominance)
    (7) R[t,i] <= S[t+1,i] + sum_{users i < j <= t} R[t,j]  recomputed values are used (dominance)
    (8) sum_k F[t,i,k] <= R[t,i] + S[t,i]            freed at most once, and only if present

Objective "cost": min sum_{t,i<t} cost_i R[t,i] (the first computes are a constant).
Objective "memory": min peak subject to sum_{t,i<t} cost_i R[t,i] <= recompute limit.

(6) and (7) only remove dominated solutions (dropping a useless value lowers cost and memory), so
the optimum is unchanged. (8) holds for every 0/1 solution of (2) and (4) (a free after computing
k needs i live there, and a second free would precede a user computed later), so it only cuts
fractional points (it raises the LP bound on FCN8 at 80% from 41% to 48% of the optimum).

With a recompute limit L (`build`), sum cost_i R[t,i] <= L is a row and every node with
cost_i > L has no R variables at all. Under (6) and (7) a value is live or recomputed in stage t
only if it can still be read there: by a user j in stage j, or by a recomputable user in a stage
where that user can be read, recursively (`_last_reads`); later S and R are left out (0). On
ResNet50 at 80% this removes 27k of 62k S and 17k of 51k R variables. F[t,i,k] is left out
where (4) makes it 0: i is an input of node t and k < t, or i is never recomputed and a later
stage reads it (FCN8 at 80%: 6205 -> 5745 variables). The positions k of (4) and (5) are only
the nodes stage t may compute.

The moment relaxation (`build(..., first_stage=f, moment_stages=range(f, n))`) keeps (1)-(3),
(6) and (7) for the stages from f on only, leaves the live set when stage f begins free, and
replaces (4), (5) and (8) (no F, no U) by the memory at each stage's own node, which eager frees
make linear:

    (5') mem_t + transient_t + sum_{p in preds(t)} mem_p
             + sum_{i < t, i not in preds(t)} mem_i S[t+1,i] <= budget

(a value kept into stage t + 1 is live when node t is computed, and so are t's inputs). Every
plan of the model above satisfies it, so its optimum is a lower bound on the schedules' cost;
`solver.core.stages.complete_prefix` turns its solution into a plan, optimal when that plan fits
the budget (`solver.exact.moments` checks it). The model is plain data (`LinearModel`): CP-SAT
(`solver.milp.cpsat`) and HiGHS's branch and cut (`solver.milp.highs_mip`) solve it, and its LP
relaxation (`solver.milp.lp`) gives bounds and reduced costs for variable fixing.

Costs are in the whole units of `solver.milp.units.CostUnits` (`int_cost`).
"""

from __future__ import annotations

from collections.abc import Container, Sequence

from solver.core.graph import Problem
from solver.deadline import NEVER, Deadline, Paced
from solver.errors import ArgumentError, DeadlineError
from solver.milp.model import LinearModel


def _recomputable(int_cost: Sequence[int], limit: int | None) -> list[bool]:
    """Nodes that may be recomputed at all: with a recompute limit, those costing at most it."""
    return [limit is None or c <= limit for c in int_cost]


def _last_reads(problem: Problem, recomputable: list[bool]) -> list[int]:
    """The last stage in which each value can be read: a user j reads it in stage j, and a
    recomputable user also in any stage in which j itself can be read (it is recomputed there
    for a reader). A value can be live or recomputed usefully only up to that stage; (6) and (7)
    make every later S and R 0, so `build` leaves them out."""
    last = list(range(problem.n))
    for i in reversed(range(problem.n)):
        for j in problem.succs[i]:
            last[i] = max(last[i], last[j] if recomputable[j] else j)
    return last


def _variables(
    lm: LinearModel,
    problem: Problem,
    budget: int | None,
    mem_cap: int,
    recomputable: list[bool],
    moment_stages: Container[int],
    deadline: Deadline,
) -> None:
    """R[t,i] only for recomputable nodes and S[t,i] only for values, both only while the value
    can still be read (`_last_reads`) and only from `lm.first_stage` on; an absent R or S is 0.
    A value that is never recomputed is live from its computation to its last user ((1), (2)
    and (6) force it). F only where (4) needs it, and not in moment_stages. All R first, then all
    S, then all F; DeadlineError once `deadline` passes."""
    n, first = problem.n, lm.first_stage
    one = lm.var("one", 1, 1)
    last_read = _last_reads(problem, recomputable)

    def stages(begin: int) -> range:
        return _checked(range(begin, n), deadline)

    lm.compute = [{} for _ in range(first)]
    for t in stages(first):
        readable = (i for i in range(t) if recomputable[i] and t <= last_read[i])
        lm.compute.append({i: lm.var(f"R[{t},{i}]", 0, 1) for i in readable} | {t: one})
    lm.keep = [{} for _ in range(first)]
    for t in stages(first):
        stage = {}
        for i in range(t):
            if t <= last_read[i]:
                lo = int(_stays_live(problem, recomputable, t, i))
                stage[i] = lm.var(f"S[{t},{i}]", lo, 1)
        lm.keep.append(stage)
    lm.keep.append({})
    lm.free = []
    for t in stages(0):
        pairs = [] if t in moment_stages else _free_pairs(problem, recomputable, lm.compute[t], t)
        lm.free.append({(i, k): lm.var(f"F[{t},{i},{k}]", 0, 1) for i, k in pairs})
    lm.levels = [{} for _ in range(first)]
    if budget is None:
        lm.peak = lm.var("peak", problem.memory_lower_bound, mem_cap)


def _checked(stages: range, deadline: Deadline):
    """`stages`, raising DeadlineError before a stage once `deadline` has passed."""
    for t in stages:
        if deadline.passed():
            raise DeadlineError(f"the model was not built by the deadline (stage {t})")
        yield t


def _free_pairs(problem: Problem, recomputable: list[bool], computes, t: int):
    """(i, k) for each F[t,i,k] of stage t, in order of k."""
    return [(i, k) for k in computes for i in _freeable(problem, recomputable, t, k)]


def _stays_live(problem: Problem, recomputable: list[bool], t: int, i: int) -> bool:
    """Whether S[t,i] is 1 in every schedule: i is never recomputed and stage t or a later one
    still reads it."""
    return i < t and not recomputable[i] and t <= problem.last_user[i]


def _freeable(problem: Problem, recomputable: list[bool], t: int, k: int) -> tuple[int, ...]:
    """Values that may be freed right after computing k in stage t: k's inputs, and k itself only
    when k = t (a recomputed k freed at once would be unused, which (4) and (7) exclude); not an
    input of node t before t is computed, nor a value that stays live into stage t + 1 ((4)
    makes both frees 0)."""
    values = (*problem.preds[k], k) if k == t else problem.preds[k]
    return tuple(
        i
        for i in values
        if not (k < t and t in problem.succs[i])
        and not _stays_live(problem, recomputable, t + 1, i)
    )


def _computes(lm: LinearModel, t: int, nodes) -> list[tuple[int, int]]:
    """(-1, R[t,j]) for each j of `nodes` that stage t may compute."""
    return [(-1, lm.compute[t][j]) for j in nodes if j in lm.compute[t]]


def _kept(lm: LinearModel, t: int, i: int) -> list[tuple[int, int]]:
    """[(-1, S[t,i])], or [] where S[t,i] is absent (0)."""
    return [(-1, lm.keep[t][i])] if i in lm.keep[t] else []


def _keep_needs_live(lm: LinearModel, t: int, i: int) -> None:  # (1)
    lm.row([(1, lm.keep[t + 1][i]), *_kept(lm, t, i), *_computes(lm, t, [i])], None, 0)


def _inputs_live(lm: LinearModel, t: int, i: int, j: int) -> None:  # (2)
    lm.row([(1, lm.compute[t][j]), *_kept(lm, t, i), *_computes(lm, t, [i])], None, 0)


def _no_compute_of_live(lm: LinearModel, t: int, i: int) -> None:  # (3)
    lm.row([(1, lm.compute[t][i]), (1, lm.keep[t][i])], None, 1)


def _free_after_last_use(lm: LinearModel, problem: Problem, t: int) -> None:  # (4)
    for (i, k), f in lm.free[t].items():
        lm.row([(1, f), (-1, lm.compute[t][k])], None, 0)
        if i in lm.keep[t + 1]:
            lm.row([(1, f), (1, lm.keep[t + 1][i])], None, 1)
        for j in problem.succs[i]:
            if k < j <= t and j in lm.compute[t]:
                lm.row([(1, f), (1, lm.compute[t][j])], None, 1)


def _memory(lm: LinearModel, problem: Problem, t: int, budget: int | None, mem_cap: int) -> None:
    """(5): U[t,k] as a chain of variables over the nodes stage t may compute, each bounded by
    the budget (or the peak) less k's transient bytes where k is computed; between two of them
    nothing is computed or freed."""
    previous: list[tuple[int, int]] = [(problem.mem[i], v) for i, v in lm.keep[t].items()]
    frees = frees_after(lm, t)
    lm.levels.append({})
    for k, computes in lm.compute[t].items():
        level = lm.var(f"U[{t},{k}]", 0, mem_cap if budget is None else budget, integral=True)
        lm.levels[t][k] = level
        terms = [*previous, (problem.mem[k], computes), (-1, level)]
        lm.row(terms, 0, 0)
        transient = [(problem.transient[k], computes)] if problem.transient[k] else []
        if lm.peak is not None:
            lm.row([(1, level), *transient, (-1, lm.peak)], None, 0)
        elif transient:
            lm.row([(1, level), *transient], None, budget)
        previous = [(1, level)] + [(-problem.mem[i], f) for i, f in frees.get(k, [])]


def _moment_memory(lm: LinearModel, problem: Problem, t: int, budget: int) -> None:  # (5')
    inputs = set(problem.preds[t])
    fixed = problem.compute_floor(t)
    terms = []
    for i, var in lm.keep[t + 1].items():
        if i < t and i not in inputs:
            if lm.lower[var] == 1:
                fixed += problem.mem[i]
            else:
                terms.append((problem.mem[i], var))
    lm.row(terms, None, budget - fixed)


def frees_after(lm: LinearModel, t: int) -> dict[int, list[tuple[int, int]]]:
    """Stage t's F variables by the node k they follow: k -> [(i, F[t,i,k])]."""
    out: dict[int, list[tuple[int, int]]] = {}
    for (i, k), f in lm.free[t].items():
        out.setdefault(k, []).append((i, f))
    return out


def _carried_values_are_used(lm: LinearModel, problem: Problem, t: int, i: int) -> None:  # (6)
    users = _computes(lm, t, [j for j in problem.succs[i] if j <= t])
    lm.row([(1, lm.keep[t][i]), *_kept(lm, t + 1, i), *users], None, 0)


def _recomputed_values_are_used(lm: LinearModel, problem: Problem, t: int, i: int) -> None:  # (7)
    users = _computes(lm, t, [j for j in problem.succs[i] if i < j <= t])
    lm.row([(1, lm.compute[t][i]), *_kept(lm, t + 1, i), *users], None, 0)


def _freed_at_most_once(lm: LinearModel, t: int) -> None:  # (8)
    frees: dict[int, list[tuple[int, int]]] = {}
    for (i, _), f in lm.free[t].items():
        frees.setdefault(i, []).append((1, f))
    for i, terms in frees.items():
        lm.row([*terms, *_kept(lm, t, i), *_computes(lm, t, [i])], None, 0)


def _free_count(problem: Problem, recomputable: list[bool], t: int, positions: list[int]) -> int:
    """How many F variables stage t has over `positions`: `_freeable` summed, counted from the
    pairs it leaves out (an order of magnitude faster than listing every pair)."""
    at = set(positions)
    left_out = {(i, k) for i in problem.preds[t] for k in problem.succs[i] if k < t and k in at}
    for i in range(t + 1):
        if _stays_live(problem, recomputable, t + 1, i):
            readers = problem.succs[i] if i < t else (*problem.succs[i], t)  # t frees itself
            left_out.update((i, k) for k in readers if k in at)
    return sum(len(problem.preds[k]) for k in positions) + 1 - len(left_out)


def variable_count(
    problem: Problem,
    int_cost: Sequence[int],
    recompute_limit: int | None,
    *,
    first_stage: int = 0,
    moment_stages: Container[int] = (),
    above: int | None = None,
) -> int:
    """How many variables `build` creates with the same arguments, counted without building
    (O(n^2): 24 s on a 9,863-node graph). With `above`, counting stops once the count passes
    it, and the count so far (more than `above`) is returned."""
    recomputable = _recomputable(int_cost, recompute_limit)
    last_read = _last_reads(problem, recomputable)
    total = 1
    for t in range(first_stage, problem.n):
        readable = [i for i in range(t) if t <= last_read[i]]
        positions = [k for k in readable if recomputable[k]] + [t]
        total += (len(positions) - 1) + len(readable)
        if t not in moment_stages:
            total += _free_count(problem, recomputable, t, positions) + len(positions)
        if above is not None and total > above:
            break
    return total


def build(
    problem: Problem,
    budget: int | None,
    int_cost: Sequence[int],
    recompute_limit: int | None = None,
    deadline: Deadline = NEVER,
    *,
    first_stage: int = 0,
    moment_stages: Container[int] = (),
) -> LinearModel:
    """The model for a memory budget in bytes (objective cost) or, with budget None, for the least
    peak (objective memory).

    first_stage > 0 leaves out the stages before it (the live set when it begins is free), and
    the stages in moment_stages have their memory bounded at their own node only ((5'), objective
    cost only): a relaxation (module docstring), whose solutions complete into plans
    (`solver.core.stages.complete_prefix`) that must still be checked against the budget.

    recompute_limit (model units) restricts it to schedules whose recompute cost is at most that:
    a node costing more is never recomputed, so its R variables, the frees and memory levels
    after it and the freedom of its S variables are left out. The exact solver passes its
    incumbent's cost, which keeps the incumbent and every better schedule.

    Raises DeadlineError when `deadline` passes before the model is complete.
    """
    if moment_stages and budget is None:
        raise ArgumentError("the moment relaxation bounds memory by a budget: pass one")
    if deadline.passed():
        raise DeadlineError("the deadline passed before the model was begun")
    lm = LinearModel(first_stage=first_stage)
    mem_cap = sum(problem.mem) + max(problem.transient)
    recomputable = _recomputable(int_cost, recompute_limit)
    _variables(lm, problem, budget, mem_cap, recomputable, moment_stages, deadline)
    work = [len(lm.compute[t]) + len(lm.keep[t]) + len(lm.free[t]) for t in range(problem.n)]
    progress = Paced(work, deadline)  # rows are written per stage, in proportion to these
    for t in range(first_stage, problem.n):
        progress.check(t)
        for i in lm.keep[t + 1]:
            if i < t:
                _keep_needs_live(lm, t, i)
        for i in lm.keep[t]:
            _carried_values_are_used(lm, problem, t, i)
            if i in lm.compute[t]:
                _no_compute_of_live(lm, t, i)
        for i in lm.compute[t]:
            if i < t:
                _recomputed_values_are_used(lm, problem, t, i)
        for j in lm.compute[t]:
            for i in problem.preds[j]:
                _inputs_live(lm, t, i, j)
        if t in moment_stages:
            assert budget is not None
            _moment_memory(lm, problem, t, budget)
            lm.levels.append({})
            continue
        _free_after_last_use(lm, problem, t)
        _freed_at_most_once(lm, t)
        _memory(lm, problem, t, budget, mem_cap)
    lm.recompute_cost = {
        var: int_cost[i]
        for t in range(problem.n)
        for i, var in lm.compute[t].items()
        if i < t and int_cost[i]
    }
    if recompute_limit is not None:
        terms = [(c, v) for v, c in lm.recompute_cost.items()]
        lm.row(terms, None, recompute_limit)
    lm.objective = {lm.peak: 1} if budget is None else dict(lm.recompute_cost)
    return lm
