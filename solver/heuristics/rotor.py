"""A rotor-style dynamic program for training graphs of chains (Beaumont, Eyraud-Dubois,
Herrmann, Joly, Shilova: "Optimal checkpointing for heterogeneous chains", 2019/2020).

Applies only to the training graph of a chain: forward nodes f_0 -> f_1 -> ... -> f_{n-1}, and
backward nodes in solver order, each reading at most the previous backward node and the forward
nodes {f_{i-1}, f_i} of one step i, with i non-increasing along the backward order (the graphs of
`solver.examples.training_graph(chain)` and the published Checkmate VGG graphs have this shape).
Anything else raises `NotAChainError`.

The program, written from the paper's idea in this solver's semantics (bytes live after each
compute plus the computed op's transient bytes; frees never set the peak). Opt(s, t, L, m) is the
least cost to produce the backward of steps t..s (down to the last backward node of step s)
starting with f_{s-1} live (a checkpoint owned by the caller, outside m), the incoming backward
value g_in(t) live and, if L, f_t live, such that the live bytes other than f_{s-1} (and each
op's transient bytes while it runs) never exceed m. Moves:

- leaf (s == t): compute f_t unless L, run the step's backward nodes, free f_t;
- checkpoint at k (s < k <= t): run forward f_s..f_{k-1} dropping each value once the next one
  exists, keep f_{k-1}; then Opt(k, t, L, m - mem(f_{k-1})), which leaves the backward value of
  step k live; then either Opt(s, k-1, True, m) (f_{k-1} stays, the live top of that segment)
  or free f_{k-1} and Opt(s, k-1, False, m) (recompute it later, for less memory).

Keeping every value of a forward run (the paper's "F_all") is the checkpoint move at k = s + 1
applied repeatedly, so one move kind suffices here: a value's bytes are its output, and the
backward of step i reads f_{i-1} and f_i themselves (there is no separate tape). Memory is
discretised in units (the gcd of all bytes when that is fine enough, else 1/2048 of the
checkpoint-all peak, sizes rounded up), so the program is exact on the former and conservative
on the latter. Between two backward nodes every forward node is computed at most once and in
order, so each schedule is a Checkmate stage plan: the exact solver's optimum is never above
rotor's, and they coincide when the persistent recursion is optimal in the stage space.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import reduce

import numpy as np

from solver.core.budget import checkpoint_all_peak
from solver.core.graph import Problem
from solver.core.stages import Member, StagePlan, plan_to_ops
from solver.deadline import NEVER, Deadline
from solver.errors import DeadlineError, GraphError
from solver.heuristics.baselines import SWEEP_POINTS

MAX_UNITS = 4096
"""Largest memory grid (units) the program runs on; coarser grids round sizes up."""

_INF = np.inf


class NotAChainError(GraphError):
    """The graph is not the training graph of a chain, so rotor does not apply."""


@dataclass(frozen=True)
class ChainShape:
    """A training graph read as a chain: forward[i] is f_i; steps[i] lists the backward nodes of
    step i in order (possibly empty); all entries are solver indices."""

    forward: tuple[int, ...]
    steps: tuple[tuple[int, ...], ...]


def chain_shape(problem: Problem) -> ChainShape:
    """Read `problem` as the training graph of a chain, or raise `NotAChainError` saying why."""
    forward = [i for i in range(problem.n) if not problem.backward[i]]
    backward = [i for i in range(problem.n) if problem.backward[i]]
    if not problem.has_phases or not forward:
        raise NotAChainError("rotor needs a forward+backward graph (nodes marked backward)")
    if forward != list(range(len(forward))):
        raise NotAChainError("rotor needs every forward node before every backward node")
    position = {v: i for i, v in enumerate(forward)}
    for i, v in enumerate(forward):
        if problem.preds[v] != ((forward[i - 1],) if i else ()):
            raise NotAChainError(f"forward node {problem.ids[v]!r} does not read just the previous")
    steps: list[list[int]] = [[] for _ in forward]
    step = len(forward) - 1
    for j, b in enumerate(backward):
        reads_f = [position[p] for p in problem.preds[b] if p in position]
        reads_b = [p for p in problem.preds[b] if p not in position]
        if reads_b and (j == 0 or reads_b != [backward[j - 1]]):
            raise NotAChainError(
                f"backward node {problem.ids[b]!r} must read only the previous backward node"
            )
        if reads_f:
            top = max(reads_f)
            if min(reads_f) < top - 1 or top > step:
                raise NotAChainError(
                    f"backward node {problem.ids[b]!r} reads forward nodes of several steps"
                )
            step = top
        steps[step].append(b)
    return ChainShape(tuple(forward), tuple(tuple(s) for s in steps))


def _unit(problem: Problem) -> int:
    """Bytes per memory unit of the program's grid."""
    peak = checkpoint_all_peak(problem)
    exact = reduce(math.gcd, (m for m in (*problem.mem, *problem.transient) if m), 0) or 1
    return exact if peak // exact <= MAX_UNITS else math.ceil(peak / (MAX_UNITS // 2))


class _Program:
    """The table Opt(s, t, L, .) over the memory grid and the choices that reach it."""

    def __init__(self, problem: Problem, shape: ChainShape, unit: int, deadline: Deadline) -> None:
        """Fills the table; raises DeadlineError when `deadline` passes first."""
        self.problem, self.shape, self.deadline = problem, shape, deadline
        n = len(shape.forward)
        self.size = -(-checkpoint_all_peak(problem) // unit) + 3 * n + 1
        units = [-(-m // unit) for m in problem.mem]
        held = [-(-m // unit) for m in problem.transient]  # while the op runs
        self.f = [units[v] for v in shape.forward]
        self.f_held = [held[v] for v in shape.forward]
        self.cf = [problem.cost[v] for v in shape.forward]
        g_in, last = [0] * n, 0
        for i in reversed(range(n)):
            g_in[i] = last
            if shape.steps[i]:
                last = units[shape.steps[i][-1]]
        self.g_in = g_in
        self.leaf_peak, self.leaf_cost = [], []
        for i in range(n):
            previous, peak = g_in[i], 0
            for b in shape.steps[i]:
                peak = max(peak, previous + units[b] + held[b])
                previous = units[b]
            self.leaf_peak.append(self.f[i] + peak if shape.steps[i] else 0)
            self.leaf_cost.append(sum(problem.cost[b] for b in shape.steps[i]))
        self.table: dict[tuple[int, int, bool], np.ndarray] = {}
        self.choice: dict[tuple[int, int, bool], np.ndarray] = {}
        self._fill(n)

    def _fill(self, n: int) -> None:
        grid = np.arange(self.size)
        prefix = np.concatenate([[0.0], np.cumsum(self.cf)])
        for length in range(1, n + 1):
            if self.deadline.passed():
                raise DeadlineError("rotor's table was not filled by the deadline")
            for s in range(n - length + 1):
                t = s + length - 1
                for top_live in (False, True):
                    self._cell(s, t, top_live, grid, prefix)

    def _cell(self, s: int, t: int, top_live: bool, grid: np.ndarray, prefix: np.ndarray) -> None:
        if s == t:
            cost = self.leaf_cost[t] + (0.0 if top_live or not self.shape.steps[t] else self.cf[t])
            peak = self.leaf_peak[t]
            if not top_live and self.shape.steps[t]:  # the leaf computes f_t first
                peak = max(peak, self.g_in[t] + self.f[t] + self.f_held[t])
            best = np.where(grid >= peak, cost, _INF)
            self.table[s, t, top_live] = best
            self.choice[s, t, top_live] = np.zeros(self.size, dtype=np.int32)
            return
        best = np.full(self.size, _INF)
        choice = np.zeros(self.size, dtype=np.int32)
        base = self.g_in[t] + (self.f[t] if top_live else 0)
        run_peak = 0
        for k in range(s + 1, t + 1):
            j = k - 1
            run_peak = max(run_peak, (self.f[j - 1] if j > s else 0) + self.f[j] + self.f_held[j])
            shift = self.f[k - 1]
            after = np.full(self.size, _INF)
            after[shift:] = self.table[k, t, top_live][: self.size - shift]
            for keep_top, sign in ((True, 1), (False, -1)):
                total = (prefix[k] - prefix[s]) + after + self.table[s, k - 1, keep_top]
                total[grid < base + run_peak] = _INF
                better = total < best
                best[better], choice[better] = total[better], sign * k
        self.table[s, t, top_live] = best
        self.choice[s, t, top_live] = choice

    def ops(self, m: int) -> list[tuple[str, int]]:
        """The schedule of Opt(0, n-1, False, m) as index ops (m must be feasible)."""
        out: list[tuple[str, int]] = []
        self._emit(0, len(self.shape.forward) - 1, False, m, out)
        return out

    def _emit(self, s: int, t: int, top_live: bool, m: int, out: list[tuple[str, int]]) -> None:
        fwd = self.shape.forward
        k = int(self.choice[s, t, top_live][m])
        if k == 0:
            steps = self.shape.steps[t]
            if not steps:
                if top_live:
                    out.append(("free", fwd[t]))
                return
            if not top_live:
                out.append(("compute", fwd[t]))
            previous = None
            for b in steps:
                out.append(("compute", b))
                if previous is not None:
                    out.append(("free", previous))
                previous = b
            g_in_node = self._incoming(t)
            if g_in_node is not None:
                out.append(("free", g_in_node))
            out.append(("free", fwd[t]))
            return
        keep_top = k > 0
        k = abs(k)
        for j in range(s, k):
            out.append(("compute", fwd[j]))
            if j > s:
                out.append(("free", fwd[j - 1]))
        self._emit(k, t, top_live, m - self.f[k - 1], out)
        if not keep_top:
            out.append(("free", fwd[k - 1]))
        self._emit(s, k - 1, keep_top, m, out)

    def _incoming(self, t: int) -> int | None:
        for steps in self.shape.steps[t + 1 :]:
            if steps:
                return steps[-1]
        return None


def _plan_from_ops(problem: Problem, ops: list[tuple[str, int]]) -> StagePlan:
    """The stage plan of ops whose first computations come in solver order (stage t ends with the
    first computation of node t; values live before a stage's first compute are kept into it)."""
    computed: list[tuple[int, ...]] = []
    kept: list[frozenset[int]] = []
    live: set[int] = set()
    done: set[int] = set()
    stage: list[int] = []
    for kind, v in ops:
        if kind == "free":
            live.discard(v)
            continue
        if not stage:
            kept.append(frozenset(live))
        stage.append(v)
        live.add(v)
        if v not in done:
            done.add(v)
            computed.append(tuple(sorted(stage)))
            stage = []
    kept.append(frozenset())
    return StagePlan(tuple(computed), tuple(kept))


def rotor(problem: Problem, deadline: Deadline = NEVER) -> list[Member]:
    """The rotor family: the program's schedule at every memory limit where its cost drops
    (sampled to at most 4 * SWEEP_POINTS members); none when `deadline` passes before its table
    is filled. Raises `NotAChainError` off chains."""
    shape = chain_shape(problem)
    unit = _unit(problem)
    try:
        program = _Program(problem, shape, unit, deadline)
    except TimeoutError:
        return []
    top = program.table[0, len(shape.forward) - 1, False]
    feasible = np.flatnonzero(np.isfinite(top))
    drops = [int(m) for m in feasible if m == feasible[0] or top[m] < top[m - 1]]
    if len(drops) > 4 * SWEEP_POINTS:
        step = (len(drops) - 1) / (4 * SWEEP_POINTS - 1)
        drops = sorted({drops[round(j * step)] for j in range(4 * SWEEP_POINTS)})
    members = []
    for m in drops:
        plan = _plan_from_ops(problem, program.ops(m))
        if len(plan.computed) != problem.n:
            # The program only computes what the backward reads: a last forward node that no
            # backward node reads (a loss whose gradient ignores its value) is never computed.
            missing = problem.n - len(plan.computed)
            raise NotAChainError(f"rotor's schedules leave {missing} node(s) uncomputed")
        members.append(Member(f"m={m * unit}", plan, plan_to_ops(problem, plan)))
    return members
