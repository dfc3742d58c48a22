"""The 0/1 model of the least-recompute SAC plan under a peak budget, for CP-SAT (`PlanModel`;
`solver.sac.solve` solves it).

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
(`binding_rows`): the same feasible plans, far fewer terms (each holds D_j, every earlier
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

With a host link (NOTE [ SAC offload model ], solver/sac/memory.py) each offloadable op i of
a region also has o_i <= s_i (offloaded): d_j gains sum_i o_i b_i (the host holds them), every
recompute term keeps the offload-free d_j (the reloads are back on the device through the
recompute), sum o_i h_i <= host_memory over every region (h_i: the host bytes of op i's host
buffers, one per output tensor, each rounded by the link's host allocator: `offload_host`),
and the cost gains per region the stall of its copies, exact for the FIFO engines without
big-M terms, and the runtime's `offload_seconds` per offloaded op:

    forward:    w_f >= T_i - T + sum_{k>=i} o_k off_k      (every offloadable i; w_f >= 0)
    recompute:  w_r >= sum_{k<=i} o_k re_k - R_i            (every offloadable i <= stop)

(T_i: forward seconds through op i, T: the whole forward's; R_i = sum_{k<i} seconds_k (c_j -
s_k): the rerun seconds before op i; off_k, re_k: the link's copy seconds of b_k.) A term of
an op that is not offloaded is implied by the next offloaded op's (forward) or the previous
one's (recompute), so the largest term over offloaded ops, the FIFO's wait, is what binds.
A region r that may park (a block without a split, or a child) has q_r <= 1 - c_r (a child's
also <= 1 - c_j): d gains q_r times its saved bytes, the host those storages' host buffers
(`park_host`, rounded as h_i is), the cost its copies' seconds (of the saved bytes) both ways
plus `offload_seconds` per saved storage.
"""

from __future__ import annotations

from ortools.sat.python import cp_model

from solver.core.link import Link
from solver.deadline import Deadline
from solver.sac.memory import (
    SacPlan,
    offload_host,
    offloadable,
    park_host,
    plain_offload_bytes,
    plain_offload_count,
)
from solver.sac.problem import SacBlock
from solver.sac.union import SacUnion, UnionPlan

NS = 1e9
"""Cost units per second in the 0/1 model (whole nanoseconds)."""

WORKERS = 8
"""CP-SAT workers (FIELD-NOTES: 8 on 2 cores proves what 2 cannot; the portfolio has LP
workers)."""


class PlanModel:
    """The CP-SAT model of the docstring for one union of region granularities; `peak` is P.
    Per block: `c[j]`, `s[j]` (the whole block), and where it has a split, `cc[j]`, `cs[j]`
    (its children, each `c_{j,l} + c_j <= 1`). A split block's own terms hold where `c_j` is
    set, its children's and its inner stretches' where it is not (solver/sac/union.py).
    `whole=False` forbids whole-block regions where a split exists. With `link`, `o[j]`
    (`co[j]` for children) are the offload variables and the copies' stall is in `runtime`."""

    def __init__(
        self, union: SacUnion, budget: int, whole: bool = True, link: Link | None = None
    ) -> None:
        self.union, self.link = union, link
        m = self.m = cp_model.CpModel()
        self.peak = m.NewIntVar(-(2**50), budget, "P")
        # nanoseconds of the SAC runtime's overhead and the copies' stall
        self.runtime: cp_model.LinearExpr = 0
        self.host: cp_model.LinearExpr = 0  # host bytes, as the link's allocator rounds them
        self.c, self.s, self.o, self.q = self._regions(
            union.blocks.blocks, "b", [s is None for s in union.splits]
        )
        self.cc: list[list[cp_model.IntVar] | None] = []
        self.cs: list[list[dict[int, cp_model.IntVar]] | None] = []
        self.co: list[list[dict[int, cp_model.IntVar]] | None] = []
        self.cq: list[list[cp_model.IntVar | None] | None] = []
        for j, split in enumerate(union.splits):
            if split is None:
                self.cc.append(None)
                self.cs.append(None)
                self.co.append(None)
                self.cq.append(None)
                continue
            cc, cs, co, cq = self._regions(split.children, f"b{j}_", [True] * len(split.children))
            for v in cc:
                m.Add(v + self.c[j] <= 1)
            for v in cq:
                if v is not None:
                    m.AddImplication(v, self.c[j].Not())
            if not whole:
                m.Add(self.c[j] == 0)
            self.cc.append(cc)
            self.cs.append(cs)
            self.co.append(co)
            self.cq.append(cq)
        if link is not None and link.host_memory is not None:
            m.Add(self.host <= link.host_memory)
        self._memory_terms()

    def _regions(self, blocks, prefix: str, plain_ok: list[bool]):
        """Per region: c, s (its saves), o (its offloaded saves) and q (its saved storages
        offloaded while it is not checkpointed; None where `plain_ok` is False, without a
        link, or where it saves nothing)."""
        c = [self.m.NewBoolVar(f"c{prefix}{j}") for j in range(len(blocks))]
        s: list[dict[int, cp_model.IntVar]] = []
        o: list[dict[int, cp_model.IntVar]] = []
        q: list[cp_model.IntVar | None] = []
        for j, block in enumerate(blocks):
            choices, off = {}, {}
            for i, op in enumerate(block.ops[: block.stop + 1]):
                if op.saveable:
                    choices[i] = self.m.NewBoolVar(f"s{prefix}{j}_{i}")
                    self.m.AddImplication(choices[i], c[j])
                if self.link is not None and offloadable(op):
                    off[i] = self.m.NewBoolVar(f"o{prefix}{j}_{i}")
                    self.m.AddImplication(off[i], choices[i])
                    self.host += offload_host(op, self.link) * off[i]
                    self.runtime += round(self.union.blocks.offload_seconds * NS) * off[i]
            s.append(choices)
            o.append(off)
            ns = round(block.overhead * NS)
            if ns > 0 and choices:
                u = self.m.NewBoolVar(f"u{prefix}{j}")
                for v in choices.values():
                    self.m.AddImplication(v, u)
                self.runtime += ns * u
            if off:
                self.runtime += self._stall(block, c[j], choices, off, f"{prefix}{j}")
            q.append(self._plain(block, c[j], f"{prefix}{j}") if plain_ok[j] else None)
        return c, s, o, q

    def _plain(self, block: SacBlock, c, name: str) -> cp_model.IntVar | None:
        """The variable of the region offloading its saved storages while not checkpointed,
        with its host bytes and its cost (copies counted as not overlapping compute, and the
        runtime's price per op); None without a link or saved storages."""
        nbytes = plain_offload_bytes(block)
        if self.link is None or nbytes == 0:
            return None
        v = self.m.NewBoolVar(f"q{name}")
        self.m.AddImplication(v, c.Not())
        self.host += park_host(block, self.link) * v
        copies = self.link.offload_time(nbytes) + self.link.reload_time(nbytes)
        price = plain_offload_count(block) * round(self.union.blocks.offload_seconds * NS)
        self.runtime += (round(copies * NS) + price) * v
        return v

    def _stall(self, block: SacBlock, c, s: dict, o: dict, name: str) -> cp_model.IntVar:
        """Nanoseconds the region's copies stall the step (the module docstring's w_f + w_r)."""
        assert self.link is not None
        m, seconds = self.m, [round(op.seconds * NS) for op in block.ops]
        off = {i: round(self.link.offload_time(block.ops[i].new_bytes) * NS) for i in o}
        re = {i: round(self.link.reload_time(block.ops[i].new_bytes) * NS) for i in o}
        forward = m.NewIntVar(0, sum(off.values()), f"wf{name}")
        for i in o:
            later = sum(off[k] * o[k] for k in o if k >= i)
            m.Add(forward >= sum(seconds[: i + 1]) - sum(seconds) + later)
        recompute = m.NewIntVar(0, sum(re.values()), f"wr{name}")
        for i in o:
            rerun = sum(seconds[k] * (c - s[k]) if k in s else seconds[k] * c for k in range(i))
            m.Add(recompute >= sum(re[k] * o[k] for k in o if k <= i) - rerun)
        return forward + recompute

    @staticmethod
    def _savings(block: SacBlock, c, s: dict, o: dict | None = None, q=None) -> cp_model.LinearExpr:
        """The block's savings d_j; with its offload variables `o` and `q`, those the host
        holds too."""
        plain = sum(op.saved_bytes for op in block.ops)
        kept = sum((block.ops[i].new_bytes - block.ops[i].output_bytes) * v for i, v in s.items())
        offloaded = sum(block.ops[i].new_bytes * v for i, v in (o or {}).items())
        parked = 0 if q is None else plain_offload_bytes(block) * q
        return (plain - block.held_extra) * c - kept + offloaded + parked

    def _memory_terms(self) -> None:
        m, P, union = self.m, self.peak, self.union
        d = []
        for j, block in enumerate(union.blocks.blocks):
            total = self._savings(block, self.c[j], self.s[j], self.o[j], self.q[j])
            if union.splits[j] is not None:
                kids = zip(
                    union.splits[j].children,
                    self.cc[j],
                    self.cs[j],
                    self.co[j],
                    self.cq[j],
                    strict=True,
                )
                total += sum(self._savings(child, c, s, o, q) for child, c, s, o, q in kids)
            d.append(total)
        before = [sum(d[:j]) for j in range(len(d) + 1)]
        for seg in union.blocks.segments:
            m.Add(seg.peak - before[seg.held] <= P)
        if union.blocks.root_b_peak is not None:  # every block's backward over: nothing held
            m.Add(union.blocks.root_b_peak <= P)
        for j, block in enumerate(union.blocks.blocks):
            split, c = union.splits[j], self.c[j]
            own = self._savings(block, c, self.s[j])
            if split is None:
                self._region(block, c, self.s[j], before[j], own, [], when_off=True)
                continue
            self._region(block, c, self.s[j], before[j], own, [], when_off=False)
            off = [c.Not()]
            kids = [
                self._savings(k, v, s, o, q)
                for k, v, s, o, q in zip(
                    split.children, self.cc[j], self.cs[j], self.co[j], self.cq[j], strict=True
                )
            ]
            inner = [before[j] + sum(kids[:k]) for k in range(len(kids) + 1)]
            for seg in split.segments:
                m.Add(seg.peak - inner[seg.held] <= P).OnlyEnforceIf(off)
            for k, child in enumerate(split.children):
                cc, cs = self.cc[j][k], self.cs[j][k]
                own = self._savings(child, cc, cs)
                self._region(child, cc, cs, inner[k], own, off, when_off=True)

    def _region(self, block: SacBlock, c, s: dict, before, d, enforce: list, when_off: bool):
        """The terms of one region (NOTE [ SAC memory model ]) under the literals `enforce`;
        its not-checkpointed terms only if `when_off`. `d`: its savings without offload (its
        recompute holds the reloaded storages). Of the per-op terms, those the next
        op's term implies are left out (`binding_rows`): the same feasible plans."""
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
        for const, coef in binding_rows(rows):
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
        def chosen(x: dict) -> frozenset[int]:
            return frozenset(i for i, v in x.items() if solver.Value(v))

        def sub(c, s, o, q) -> SacPlan:
            offloaded = tuple(chosen(x) for x in o)
            plain = tuple(v is not None and bool(solver.Value(v)) for v in q)
            return SacPlan(
                tuple(bool(solver.Value(v)) for v in c),
                tuple(chosen(x) for x in s),
                offloaded if any(offloaded) else None,
                plain if any(plain) else None,
            )

        children = tuple(
            None if cc is None else sub(cc, cs, co, cq)
            for cc, cs, co, cq in zip(self.cc, self.cs, self.co, self.cq, strict=True)
        )
        return UnionPlan(sub(self.c, self.s, self.o, self.q), children)


def binding_rows(rows: list[tuple[int, dict[int, int]]]) -> list[tuple[int, dict[int, int]]]:
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
