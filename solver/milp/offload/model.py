r"""The exact model of the stage space with offload, in CP-SAT (docs/offload.md, "The exact
model", writes every row; the names below are its names).

Stage t = 0..n-1 may compute the nodes `positions[t]` (every earlier value still readable in
some stage from t on, and t); a value may be live in stage t only up to the last stage that can
read it (`Problem.last_descendant`), as in `solver.milp.formulation`. Every time is a whole
number of the units of `OffloadTimes` (the costs and both copy times).

    (1)  S[t+1,i] <= S[t,i] + R[t,i] + L[t,i]                kept values were live
    (2)  R[t,j] <= R[t,i] + S[t,i] + L[t,i]     for i -> j    inputs are live
    (3)  R[t,i] + S[t,i] + L[t,i] <= 1                       no second copy
    (4)  F[t,i,k] = R[t,k] and not S[t+1,i] and no user of i after k in stage t
                                                             frees right after the last read
    (5)  U[t,k] = sum mem (S + L)[t,.] + sum_{j<=k} mem_j R[t,j] - frees before k;
         U[t,k] + transient_k R[t,k] <= budget
    (6') S[t,i] <= S[t+1,i] + reads of i in t + Z[t,i];  Z <= P[t,i], Z <= O[i]
    (7') R[t,i] (i < t) and L[t,i] <= S[t+1,i] + reads of i in t after it;  O[i] <= sum_t L[t,i]
    (H)  L[t,i] <= O[i];  A[t,i] >= A[t+1,i], A[t,i] >= L[t+1,i];
         A[t,i] >= L[t,i] - reads of i in t;
         A[t,i] >= A[t-1,i] + S[t+1,i] - 1 - reads of i in t;
         sum_i host_i A[t,i] + host_t O[t] <= host_memory   (host_i = link.host_bytes(mem_i))
    (T)  the timeline's rows, each a lower bound of its max-plus recurrence (docs/offload.md);
         over a link that is not duplex, the offloads and reloads chain on one engine in their
         issue order (stage t's reloads, then t's offload)

Objective: minimise T, the step's end (compute cost plus stall).
"""

from __future__ import annotations

from dataclasses import dataclass

from ortools.sat.python import cp_model

from solver.core.graph import Problem
from solver.core.link import Link
from solver.core.offload import OffloadPlan
from solver.core.stages import StagePlan
from solver.deadline import Deadline, Paced
from solver.milp.cpsat import OVERRUN_PER_VARIABLE
from solver.milp.offload.times import OffloadTimes


@dataclass(frozen=True)
class _Shape:
    """Which variables the model has: `positions[t]` the nodes stage t may compute (t last),
    `readable[t]` the values that may be live when it begins, `offloadable` the values some
    later stage may read."""

    last: tuple[int, ...]
    positions: tuple[tuple[int, ...], ...]
    readable: tuple[tuple[int, ...], ...]
    offloadable: frozenset[int]

    @classmethod
    def of(cls, problem: Problem) -> _Shape:
        n, last = problem.n, problem.last_descendant
        readable = tuple(tuple(i for i in range(t) if t <= last[i]) for t in range(n + 1))
        return cls(
            tuple(last),
            tuple((*readable[t], t) for t in range(n)),
            readable,
            frozenset(i for i in range(n) if last[i] > i),
        )

    def free_pairs(self, problem: Problem, t: int) -> list[tuple[int, int]]:
        """(i, k) for each F[t,i,k]: i freed right after computing k, its last read in the
        stage (not an input of node t before t)."""
        return [
            (i, k)
            for k in self.positions[t]
            for i in ((*problem.preds[k], k) if k == t else problem.preds[k])
            if not (k < t and t in problem.succs[i])
        ]

    def stage_variables(self, problem: Problem, t: int) -> int:
        """The variables stage t adds: R and S (a value each but t), L, P, Z, K and Y (each
        value that may be reloaded), F, U, a and b (each position), tau[t+1]."""
        values = len(self.readable[t])
        copied = len(self.offloadable.intersection(self.readable[t]))
        return 2 * values + 5 * copied + len(self.free_pairs(problem, t)) + 3 * (values + 1) + 1


def variable_count(problem: Problem, link: Link, above: int | None = None) -> int:
    """How many variables `solve_offload_model` builds for `problem` over `link`, counted
    without building (O(n^2 * in-degree)); with `above`, counting stops once the count passes
    it, and the count so far (more than `above`) is returned."""
    shape = _Shape.of(problem)
    copied = len(shape.offloadable)
    total = 3 + 2 * copied  # the constants 0 and 1, T; O and G
    if link.host_memory is not None:
        total += sum(shape.last[i] - i for i in shape.offloadable)  # A
    for t in range(problem.n):
        total += shape.stage_variables(problem, t)
        if above is not None and total > above:
            break
    return total


class OffloadModel:
    """The variables and rows of the module docstring, built once, stage by stage within
    `deadline` (TimeoutError where the rate so far says it would not end by it)."""

    def __init__(
        self,
        problem: Problem,
        budget: int,
        link: Link,
        times: OffloadTimes,
        cap: int | None,
        deadline: Deadline,
    ) -> None:
        self.problem, self.times = problem, times
        self.m = m = cp_model.CpModel()
        n = problem.n
        shape = self.shape = _Shape.of(problem)
        last = list(shape.last)
        self.positions = [list(p) for p in shape.positions]
        work = [shape.stage_variables(problem, t) for t in range(n)]
        reserve = OVERRUN_PER_VARIABLE * sum(work)
        self.paced = Paced(work + work, deadline, reserve)  # the stages' rows, then their clocks
        self.paced.begin()  # before the variables: CP-SAT's overrun alone may not fit
        # every compute in every stage and every copy, or the cap: every clock is at most T
        self.horizon = (
            n * sum(times.cost) + sum(times.d2h) + n * sum(times.h2d) if cap is None else cap
        )
        one = m.new_constant(1)
        self.R = [
            {i: m.new_bool_var(f"R[{t},{i}]") for i in self.positions[t][:-1]} for t in range(n)
        ]
        for t in range(n):
            self.R[t][t] = one
        readable = shape.readable
        self.S = [{i: m.new_bool_var(f"S[{t},{i}]") for i in readable[t]} for t in range(n)]
        self.S.append({})
        self.O = {i: m.new_bool_var(f"O[{i}]") for i in sorted(shape.offloadable)}
        self.L = [
            {i: m.new_bool_var(f"L[{t},{i}]") for i in readable[t] if i in self.O} for t in range(n)
        ]
        self.budget = budget
        self.duplex = link.duplex
        self.P: dict[tuple[int, int], cp_model.IntVar] = {}
        self._stages(last)
        self._offload_rows(last, link)
        self._timeline()

    def _get(self, d: dict, i: int) -> list:
        return [d[i]] if i in d else []

    def _stages(self, last: list[int]) -> None:
        m, problem = self.m, self.problem
        R, S, L = self.R, self.S, self.L
        n = problem.n
        self.F: list[dict[tuple[int, int], cp_model.IntVar]] = []
        for t in range(n):
            self.paced.check(t)
            pos = self.positions[t]
            at = set(pos)
            for i, keep in S[t + 1].items():  # (1)
                if i < t:
                    m.add(keep <= sum(self._get(S[t], i) + self._get(R[t], i) + self._get(L[t], i)))
            for j in pos:  # (2)
                for i in problem.preds[j]:
                    live = self._get(R[t], i) + self._get(S[t], i) + self._get(L[t], i)
                    m.add(R[t][j] <= sum(live))
            for i in range(t):  # (3)
                present = self._get(R[t], i) + self._get(S[t], i) + self._get(L[t], i)
                if len(present) > 1:
                    m.add(sum(present) <= 1)
            frees: dict[tuple[int, int], cp_model.IntVar] = {}
            for i, k in self.shape.free_pairs(problem, t):  # (4)
                f = m.new_bool_var(f"F[{t},{i},{k}]")
                frees[(i, k)] = f
                later = [R[t][j] for j in problem.succs[i] if k < j <= t and j in at]
                kept = self._get(S[t + 1], i)
                m.add(f <= R[t][k])
                for other in later + kept:
                    m.add(f + other <= 1)
                m.add(f >= R[t][k] - sum(later) - sum(kept))
            self.F.append(frees)
            for i, carried in S[t].items():  # (6')
                reads = [R[t][j] for j in problem.succs[i] if j in at]
                slack = []
                if i in self.O:
                    slack = [m.new_bool_var(f"Z[{t},{i}]")]
                    self._first_copy_rows(t, i, slack[0])
                m.add(carried <= sum(self._get(S[t + 1], i) + reads + slack))
            for i in pos[:-1]:  # (7') recomputed values
                reads = [R[t][j] for j in problem.succs[i] if i < j <= t and j in at]
                m.add(R[t][i] <= sum(self._get(S[t + 1], i) + reads))
            for i, reload in L[t].items():  # (7') reloaded values
                reads = [R[t][j] for j in problem.succs[i] if j in at]
                m.add(reload <= sum(self._get(S[t + 1], i) + reads))
            self._memory(t)

    def _first_copy_rows(self, t: int, i: int, z: cp_model.IntVar) -> None:
        """Z[t,i] <= P[t,i] (i's live copy is its first) and Z[t,i] <= O[i]."""
        m = self.m
        p = m.new_bool_var(f"P[{t},{i}]")
        self.P[(t, i)] = p
        m.add(p <= self.S[t][i])
        if (t - 1, i) in self.P:  # absent for t = i + 1
            m.add(p <= self.P[(t - 1, i)])
        m.add(z <= p)
        m.add(z <= self.O[i])

    def _memory(self, t: int) -> None:  # (5)
        m, problem = self.m, self.problem
        R, S, L, frees = self.R, self.S, self.L, self.F[t]
        previous = [problem.mem[i] * v for i, v in S[t].items()]
        previous += [problem.mem[i] * v for i, v in L[t].items()]
        after: dict[int, list] = {}
        for (i, k), f in frees.items():
            after.setdefault(k, []).append(problem.mem[i] * f)
        for k in self.positions[t]:
            level = m.new_int_var(0, self.budget, f"U[{t},{k}]")
            m.add(level == sum(previous) + problem.mem[k] * R[t][k])
            if problem.transient[k]:
                m.add(level + problem.transient[k] * R[t][k] <= self.budget)
            previous = [level, *(-term for term in after.get(k, []))]

    def _offload_rows(self, last: list[int], link: Link) -> None:
        m, problem, n = self.m, self.problem, self.problem.n
        for i, offloaded in self.O.items():
            reloads = [self.L[t][i] for t in range(n) if i in self.L[t]]
            m.add(offloaded <= sum(reloads))
            for reload in reloads:
                m.add(reload <= offloaded)
        if link.host_memory is None:
            return
        # A[t,i]: i's host copy is held at t's offload: a later stage reloads it, or the
        # last reload so far is unread (the compute stream has not waited for its end)
        A = {}
        for i in self.O:
            for t in reversed(range(i, last[i])):
                a = m.new_bool_var(f"A[{t},{i}]")
                A[(t, i)] = a
                if i in self.L[t + 1]:
                    m.add(a >= self.L[t + 1][i])
                if (t + 1, i) in A:
                    m.add(a >= A[(t + 1, i)])
            for t in range(i + 1, last[i]):
                reads = [self.R[t][j] for j in problem.succs[i] if j in self.R[t]]
                if i in self.L[t]:
                    m.add(A[(t, i)] >= self.L[t][i] - sum(reads))
                m.add(A[(t, i)] >= A[(t - 1, i)] + self.S[t + 1][i] - 1 - sum(reads))
        host = [link.host_bytes(b) for b in problem.mem]
        for t in range(n):
            held = [host[i] * a for (s, i), a in A.items() if s == t and i < t]
            mine = [host[t] * self.O[t]] if t in self.O else []
            if held or mine:
                m.add(sum(held + mine) <= link.host_memory)

    def _timeline(self) -> None:  # (T)
        m, problem, times, n = self.m, self.problem, self.times, self.problem.n
        R, S, L, off = self.R, self.S, self.L, self.O
        h = self.horizon
        # stage t's clocks lie between the first computes before it and T less those from it on
        before = [sum(times.cost[:t]) for t in range(n + 1)]

        def clock(name: str, lo: int = 0, later: int = 0) -> cp_model.IntVar:
            return m.new_int_var(lo, max(lo, h - later), name)

        def window(name: str, t: int, until: int) -> cp_model.IntVar:
            return clock(name, before[t], before[n] - before[until])

        tau = [m.new_constant(0)] + [window(f"tau[{t}]", t, t) for t in range(1, n + 1)]
        G: dict[int, cp_model.IntVar] = {}
        engine = m.new_constant(0)  # the d2h engine's end so far (both directions' if shared)
        self.tau, self.G = tau, G
        for i in off:
            G[i] = clock(f"G[{i}]")
        Y: dict[tuple[int, int], cp_model.IntVar] = {}
        h2d = m.new_constant(0)  # the h2d engine's end so far (both directions' if shared)
        for t in range(n):
            self.paced.check(n + t)
            for i, reload in L[t].items():  # the reloads at t's start, ascending
                k = clock(f"K[{t},{i}]")
                m.add(k >= h2d + times.h2d[i] * reload)
                m.add(k >= tau[t] + times.h2d[i]).only_enforce_if(reload)
                m.add(k >= G[i] + times.h2d[i]).only_enforce_if(reload)
                h2d = k
                if not self.duplex:
                    engine = k
                y = clock(f"Y[{t},{i}]")
                m.add(y >= k).only_enforce_if(reload)
                if (t - 1, i) in Y:
                    m.add(y >= Y[(t - 1, i)])
                Y[(t, i)] = y
            previous = tau[t]
            for k in self.positions[t]:
                a, b = window(f"a[{t},{k}]", t, t), window(f"b[{t},{k}]", t, t + 1)
                m.add(a >= previous)
                for u in problem.preds[k]:
                    if (t, u) in Y:
                        m.add(a >= Y[(t, u)]).only_enforce_if(R[t][k])
                m.add(b >= a + times.cost[k] * R[t][k])
                if k == t and t in off:  # the offload of t, issued right after its compute
                    m.add(G[t] >= engine + times.d2h[t] * off[t])
                    m.add(G[t] >= a + times.cost[t] + times.d2h[t]).only_enforce_if(off[t])
                    engine = G[t]
                    if not self.duplex:
                        h2d = engine
                for (i, after), f in self.F[t].items():
                    if after == k and i in off:
                        m.add(b >= G[i]).only_enforce_if([f, off[i]])
                previous = b
            m.add(tau[t + 1] >= previous)
            for i, carried in S[t].items():  # first copies held to the stage's end
                if i in off:
                    dropped = [carried, off[i]] + ([S[t + 1][i].Not()] if i in S[t + 1] else [])
                    m.add(tau[t + 1] >= G[i]).only_enforce_if(dropped)
        self.T = clock("T")
        m.add(tau[n] <= self.T)
        m.add(engine <= self.T)
        m.add(h2d <= self.T)
        # valid: the computes run one after another (the timeline's rows imply it, the LP
        # relaxation of their enforced forms does not)
        work = [times.cost[i] * var for t in range(n) for i, var in R[t].items()]
        m.add(sum(work) <= self.T)
        m.minimize(self.T)

    def plan(self, solver: cp_model.CpSolver) -> OffloadPlan:
        """The plan of a solution."""
        n = self.problem.n
        computed = tuple(
            tuple(i for i in self.positions[t] if solver.value(self.R[t][i])) for t in range(n)
        )
        kept = tuple(
            frozenset(i for i, v in self.S[t].items() if solver.value(v)) for t in range(n + 1)
        )
        reloaded = tuple(
            frozenset(i for i, v in self.L[t].items() if solver.value(v)) for t in range(n)
        )
        offloaded = frozenset(i for i, v in self.O.items() if solver.value(v))
        return OffloadPlan(StagePlan(computed, kept), reloaded, offloaded)

    def hint(self, plan: OffloadPlan) -> None:
        """Hint a plan: its computes, keeps, reloads and offloads."""
        m, stages = self.m, plan.stages
        for t, stage in enumerate(stages.computed):
            for i, var in self.R[t].items():
                if i != t:
                    m.add_hint(var, i in stage)
        for t, kept in enumerate(stages.kept[: self.problem.n]):
            for i, var in self.S[t].items():
                m.add_hint(var, i in kept)
        for i, var in self.O.items():
            m.add_hint(var, i in plan.offloaded)
        for t, stage in enumerate(self.L):
            for i, var in stage.items():
                m.add_hint(var, i in plan.reloaded[t])
