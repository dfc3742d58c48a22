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
Of a region's per-op terms, those the next op's term implies for every (c, s) are left out
(`_binding`): the same feasible plans, far fewer terms (each holds D_j, every earlier
block's variables).

and the cost in seconds is the recompute sum_j sum_{i<=stop_j} seconds_i (c_j - s_i), plus
sum_j price_j c_j (checkpoint's own price per region, possibly negative), plus
sum_j overhead_j u_j, with u_j >= s_i for every op i of block j: a region that saves an op pays
the SAC runtime's overhead, one that saves none runs as plain checkpoint and does not (u_j is
only bounded below; minimising sets it to max_i s_i). Objective: that cost (in whole
nanoseconds), or P for the least peak.

Over a union of granularities (solver/sac/union.py) a block j with a split also has its
children's c_{j,l}, s_{j,l,i} with c_j + c_{j,l} <= 1; d_j becomes the block's own savings plus
its children's; the block's checkpointed terms are enforced where c_j = 1, and its children's
terms (with D_{j,l} = D_j + the savings of children 0..l-1) and its inner stretches
(peak - D_{j,held} <= P) where c_j = 0, replacing the block's not-checkpointed terms.

Every returned plan is evaluated by the reference (`solver.sac.union.union_peak`, which runs
`solver.sac.memory`), whose peak and cost are the ones reported.
"""

from __future__ import annotations

from dataclasses import dataclass

from ortools.sat.python import cp_model

from solver.core.budget import Budget, as_percent, plain_step
from solver.deadline import Deadline
from solver.errors import InfeasibleBudgetError, SolverTimeoutError
from solver.sac.memory import SacPlan
from solver.sac.problem import SacBlock, SacProblem
from solver.sac.union import SacUnion, UnionPlan, union_cost, union_peak

NS = 1e9
"""Cost units per second in the 0/1 model (whole nanoseconds)."""

WORKERS = 8
"""CP-SAT workers (FIELD-NOTES: 8 on 2 cores proves what 2 cannot; the portfolio has LP
workers)."""


@dataclass(frozen=True)
class SacSolution:
    """A solved plan: `peak` (predicted bytes) and `cost` (recompute seconds plus each region's
    checkpoint price plus the SAC runtime's overhead of the regions that save an op) from the
    reference
    model, `status` ("OPTIMAL" or "FEASIBLE"), `bound` (proven lower bound on the cost, seconds),
    `gap` ((cost - bound) / cost, 0 when cost is 0) and `budget` (bytes)."""

    plan: SacPlan | UnionPlan
    peak: int
    cost: float
    status: str
    bound: float
    gap: float
    budget: int


class _Model:
    """The CP-SAT model of the docstring for one union of region granularities; `peak` is P.
    Per block: `c[j]`, `s[j]` (the whole block), and where it has a split, `cc[j]`, `cs[j]`
    (its children, each `c_{j,l} + c_j <= 1`). A split block's own terms hold where `c_j` is
    set, its children's and its inner stretches' where it is not (solver/sac/union.py).
    `whole=False` forbids whole-block regions where a split exists."""

    def __init__(self, union: SacUnion, budget: int, whole: bool = True) -> None:
        self.union = union
        m = self.m = cp_model.CpModel()
        self.peak = m.NewIntVar(-(2**50), budget, "P")
        self.runtime: cp_model.LinearExpr = 0  # nanoseconds of the SAC runtime's overhead
        self.c, self.s = self._regions(union.blocks.blocks, "b")
        self.cc: list[list[cp_model.IntVar] | None] = []
        self.cs: list[list[dict[int, cp_model.IntVar]] | None] = []
        for j, split in enumerate(union.splits):
            if split is None:
                self.cc.append(None)
                self.cs.append(None)
                continue
            cc, cs = self._regions(split.children, f"b{j}_")
            for v in cc:
                m.Add(v + self.c[j] <= 1)
            if not whole:
                m.Add(self.c[j] == 0)
            self.cc.append(cc)
            self.cs.append(cs)
        self._memory_terms()

    def _regions(self, blocks, prefix: str):
        c = [self.m.NewBoolVar(f"c{prefix}{j}") for j in range(len(blocks))]
        s: list[dict[int, cp_model.IntVar]] = []
        for j, block in enumerate(blocks):
            choices = {}
            for i, op in enumerate(block.ops[: block.stop + 1]):
                if op.saveable:
                    choices[i] = self.m.NewBoolVar(f"s{prefix}{j}_{i}")
                    self.m.AddImplication(choices[i], c[j])
            s.append(choices)
            ns = round(block.overhead * NS)
            if ns > 0 and choices:
                u = self.m.NewBoolVar(f"u{prefix}{j}")
                for v in choices.values():
                    self.m.AddImplication(v, u)
                self.runtime += ns * u
        return c, s

    @staticmethod
    def _savings(block: SacBlock, c, s: dict) -> cp_model.LinearExpr:
        plain = sum(op.saved_bytes for op in block.ops)
        kept = sum((block.ops[i].new_bytes - block.ops[i].output_bytes) * v for i, v in s.items())
        return (plain - block.held_extra) * c - kept

    def _memory_terms(self) -> None:
        m, P, union = self.m, self.peak, self.union
        d = []
        for j, block in enumerate(union.blocks.blocks):
            total = self._savings(block, self.c[j], self.s[j])
            if union.splits[j] is not None:
                kids = zip(union.splits[j].children, self.cc[j], self.cs[j], strict=True)
                total += sum(self._savings(child, c, s) for child, c, s in kids)
            d.append(total)
        before = [sum(d[:j]) for j in range(len(d) + 1)]
        for seg in union.blocks.segments:
            m.Add(seg.peak - before[seg.held] <= P)
        for j, block in enumerate(union.blocks.blocks):
            split, c = union.splits[j], self.c[j]
            own = self._savings(block, c, self.s[j])
            if split is None:
                self._region(block, c, self.s[j], before[j], own, [], when_off=True)
                continue
            self._region(block, c, self.s[j], before[j], own, [], when_off=False)
            off = [c.Not()]
            kids = [
                self._savings(k, v, s)
                for k, v, s in zip(split.children, self.cc[j], self.cs[j], strict=True)
            ]
            inner = [before[j] + sum(kids[:k]) for k in range(len(kids) + 1)]
            for seg in split.segments:
                m.Add(seg.peak - inner[seg.held] <= P).OnlyEnforceIf(off)
            for k, child in enumerate(split.children):
                cc, cs = self.cc[j][k], self.cs[j][k]
                self._region(child, cc, cs, inner[k], kids[k], off, when_off=True)

    def _region(self, block: SacBlock, c, s: dict, before, d, enforce: list, when_off: bool):
        """The terms of one region (NOTE [ SAC memory model ]) under the literals `enforce`;
        its not-checkpointed terms only if `when_off`. Of the per-op terms, those the next
        op's term implies are left out (`_binding`): the same feasible plans."""
        m, P = self.m, self.peak
        if when_off:
            m.Add(block.b_peak - before + block.held_extra * c <= P).OnlyEnforceIf(enforce)
            m.Add(block.f_peak - before <= P).OnlyEnforceIf([c.Not(), *enforce])
        else:
            m.Add(block.b_peak - before + block.held_extra <= P).OnlyEnforceIf([c, *enforce])
        rows = []
        for t in range(len(block.ops)):
            const, coef = block.ops[t].scratch, {}
            for i, op in enumerate(block.ops[: t + 1]):
                if op.last_read >= t:
                    const += op.new_bytes
                elif i in s:
                    coef[i] = op.new_bytes
            rows.append((const, coef))
        self._rows(block.f_start - before + block.workspace, rows, s, [c, *enforce])
        rows = []
        for t in range(block.stop + 1):
            const, coef = block.ops[t].scratch, {}
            if t in s:
                coef[t] = -const
            for i, op in enumerate(block.ops[: t + 1]):
                held = op.new_bytes if op.last_read >= t else op.saved_bytes
                const += held
                if i in s:
                    coef[i] = coef.get(i, 0) - held
            rows.append((const, coef))
        base = block.b_start - before - d + block.workspace + block.recompute_extra
        self._rows(base, rows, s, [c, *enforce])

    def _rows(self, base, rows: list[tuple[int, dict[int, int]]], s: dict, enforce: list):
        """`base + const + sum_i coef_i s_i <= P` under `enforce` for each binding row."""
        for const, coef in _binding(rows):
            terms = [(s[i], k) for i, k in coef.items() if k]
            expr = cp_model.LinearExpr.WeightedSum([v for v, _ in terms], [k for _, k in terms])
            self.m.Add(base + const + expr <= self.peak).OnlyEnforceIf(enforce)

    def cost(self) -> cp_model.LinearExpr:
        terms = 0
        regions = [(self.union.blocks.blocks, self.c, self.s)]
        for split, cc, cs in zip(self.union.splits, self.cc, self.cs, strict=True):
            if split is not None:
                regions.append((split.children, cc, cs))
        for blocks, cs_, ss in regions:
            for block, c, s in zip(blocks, cs_, ss, strict=True):
                for i, op in enumerate(block.ops[: block.stop + 1]):
                    ns = round(op.seconds * NS)
                    terms += ns * (c - s[i]) if i in s else ns * c
                terms += round(block.price * NS) * c
        return terms + self.runtime

    def solve(self, deadline: Deadline) -> tuple[cp_model.CpSolver, int]:
        """CP-SAT on the model by `deadline`, stopped when its stop is requested (Ctrl-C)."""
        solver = cp_model.CpSolver()
        solver.parameters.max_time_in_seconds = max(deadline.remaining(), 0.01)
        solver.parameters.num_workers = WORKERS
        # Ctrl-C is the caller's (`solver.interrupt`); CP-SAT's own SIGINT handler, with a
        # solution callback set, aborts the process
        solver.parameters.catch_sigint_signal = False
        with deadline.on_stop(solver.stop_search):
            return solver, solver.Solve(self.m)

    def plan(self, solver: cp_model.CpSolver) -> UnionPlan:
        def sub(c, s) -> SacPlan:
            return SacPlan(
                tuple(bool(solver.Value(v)) for v in c),
                tuple(frozenset(i for i, v in x.items() if solver.Value(v)) for x in s),
            )

        children = tuple(
            None if cc is None else sub(cc, cs) for cc, cs in zip(self.cc, self.cs, strict=True)
        )
        return UnionPlan(sub(self.c, self.s), children)


def _binding(rows: list[tuple[int, dict[int, int]]]) -> list[tuple[int, dict[int, int]]]:
    """The rows `const + sum_i coef_i s_i <= P` (s_i in {0, 1}) not implied by the row after
    them: row t is implied by row t + 1 where `const_{t+1} - const_t >= sum_i max(0, coef_t(i) -
    coef_{t+1}(i))`; implication is transitive, so every row left out is implied by one kept."""
    kept = []
    for t, (const, coef) in enumerate(rows):
        if t + 1 < len(rows):
            after, later = rows[t + 1]
            extra = sum(max(0, k - later.get(i, 0)) for i, k in coef.items())
            extra += sum(max(0, -k) for i, k in later.items() if i not in coef)
            if after - const >= extra:
                continue
        kept.append((const, coef))
    return kept


def least_peak(
    union: SacUnion, deadline: Deadline, whole: bool = True
) -> tuple[UnionPlan, int, bool]:
    """The plan of least predicted peak (bytes), whether that is proven, ties broken by nothing."""
    model = _Model(union, union.plain_peak + _upper_slack(union), whole)
    model.m.Minimize(model.peak)
    solver, status = model.solve(deadline)
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        raise SolverTimeoutError("no SAC plan found within the time limit: give more time")
    plan = model.plan(solver)
    return plan, union_peak(union, plan), status == cp_model.OPTIMAL


def _upper_slack(union: SacUnion) -> int:
    """Bytes by which a plan's peak may exceed the plain step's (a checkpoint holding inputs the
    plain block frees): bounds P's domain for the least-peak search."""
    regions = list(union.blocks.blocks)
    regions += [c for split in union.splits if split is not None for c in split.children]
    return sum(max(b.held_extra, 0) + b.workspace for b in regions) + sum(
        op.new_bytes for b in regions for op in b.ops
    )


def solve_sac(
    problem: SacProblem | SacUnion,
    budget: Budget | int | str,
    deadline: Deadline,
    whole: bool = True,
) -> SacSolution:
    """The plan of least cost (recompute seconds plus each region's checkpoint price plus the SAC
    runtime's overhead of each region saving an op) whose predicted peak is at most `budget`
    (`Budget`: bytes, a percentage of the plain step, or "min": the least peak any plan reaches,
    found with half of the time). Over a `SacUnion` the plan is a `UnionPlan`
    (per block: none, whole, or children; `whole=False`: never whole where a split exists),
    over a `SacProblem` a `SacPlan`. InfeasibleBudgetError names that least peak when the
    budget is below it; SolverTimeoutError when no plan is found in time."""
    union = problem if isinstance(problem, SacUnion) else SacUnion.whole(problem)
    wanted = Budget.of(budget)
    if wanted.least:
        _, budget, _ = least_peak(union, deadline.share(0.5), whole)
    else:
        budget = wanted.bytes(lambda: union.plain_peak)
    model = _Model(union, int(budget), whole)
    model.m.Minimize(model.cost())
    solver, status = model.solve(deadline)
    if status == cp_model.INFEASIBLE:
        hundred = plain_step(union.plain_peak_basis)
        try:
            _, least, proven = least_peak(union, deadline, whole)
        except SolverTimeoutError as e:
            raise InfeasibleBudgetError(
                f"no SAC plan fits {budget} bytes, and the least predicted peak was not found "
                "in the time left: raise the budget or time_limit, or ask for 'min'",
                None,
                int(budget) + 1,
            ) from e
        raise InfeasibleBudgetError(
            f"no SAC plan fits {budget} bytes: the least predicted peak in SAC's space is "
            f"{least} bytes ({as_percent(least, union.plain_peak, hundred)})"
            f"{'' if proven else ' (found, not proven least)'}; give at least that",
            least if proven else None,
            int(budget) + 1,
        )
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        raise SolverTimeoutError(f"no SAC plan within {budget} bytes found in time: give more time")
    plan = model.plan(solver)
    peak, cost = union_peak(union, plan), union_cost(union, plan)
    if peak > budget:
        raise AssertionError(f"CP-SAT's plan peaks at {peak} > {budget} bytes in the reference")
    bound = min(solver.BestObjectiveBound() / NS, cost)
    optimal = status == cp_model.OPTIMAL
    gap = 0.0 if optimal or cost <= 0 else (cost - bound) / cost
    result = plan if isinstance(problem, SacUnion) else plan.blocks
    return SacSolution(result, peak, cost, "OPTIMAL" if optimal else "FEASIBLE", bound, gap, budget)
