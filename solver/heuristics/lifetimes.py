"""Plans from value lifetimes, and a local search over lifetimes within a budget.

A lifetime assignment says, for each value v (node index):

- `end[v]`: the last stage in which v's first copy (computed in stage v) may still be read; the
  copy is dropped after its last read up to that stage. `end[v] = n - 1` keeps it while any
  stage reads it, recomputes of its users included.
- `retain[v]`: what happens to a copy of v recomputed in stage t: AT_USE, dropped when stage t
  ends; READ, kept up to its last reader's first computation; LAST, kept while any stage reads
  it.

A stage that needs a value none of whose copies is live recomputes it (and, recursively, its
missing inputs): `plan_from_lifetimes` turns an assignment into a stage plan, and every plan it
gives is valid (`solver.core.stages`). Checkpoint policies are assignments: `plan_from_keep` is end
n - 1 for a kept value and its last forward reader otherwise, with retain LAST.

`lifetime_search` looks for a cheap assignment whose plan fits a budget: from a start (a
relaxation's solution through `start_from_away`, or `longest`), it moves the peak stage's values
out (a first copy ends at its previous read, a recomputed copy is retained less) until the plan
fits, then lets values live longer wherever that is cheaper and still fits (each start alone,
then the best also through swaps, `_improve`), then perturbs and repeats until its deadline (an
iterated local search; a seeded RNG keeps it deterministic). Where the graph has repeated
blocks (`solver.core.repeats`), each start is first repaired and improved with every move also
tried in every block at once, then again with single moves.
On op-level graphs of real models it finds schedules within 0-1% of the cascade cover's bound
where eviction is 1-5% away (`benchmarks.solving.solver_scale`).
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from solver.collection import paused_collection
from solver.core.graph import Problem
from solver.core.repeats import Mirrors, mirrors
from solver.core.stages import (
    LAST,
    Lifetimes,
    Member,
    StagePlan,
    Window,
    lifetime_windows,
    plan_from_lifetimes,
    plan_to_ops,
)
from solver.deadline import Deadline
from solver.heuristics.eviction import rebuild_costs
from solver.heuristics.lifetime_moves import (
    END,
    apply_move,
    copied_block,
    longer_moves,
    moves_out,
)


def longest(problem: Problem) -> Lifetimes:
    """Every copy kept while any stage reads it: checkpoint-all's plan."""
    n = problem.n
    return Lifetimes((n - 1,) * n, (LAST,) * n)


@dataclass(frozen=True)
class _Evaluation:
    """An assignment's plan as the search needs it, without building the plan: its cost, its
    per-stage peaks (as `plan_to_ops` gives them) and the copies, from `lifetime_windows`."""

    lifetimes: Lifetimes
    cost: float
    stage_peaks: tuple[int, ...]
    windows: list[list[Window]]

    @property
    def peak(self) -> int:
        return max(self.stage_peaks, default=0)

    def live_around(self, t: int) -> set[int]:
        """Values live when stage t begins or carried out of it."""
        return {
            v
            for v, copies in enumerate(self.windows)
            if any(start <= u <= last for start, _, last in copies for u in (t, t + 1))
        }

    def member(self, problem: Problem) -> Member:
        plan = plan_from_lifetimes(problem, self.lifetimes)
        return Member("lifetime search", plan, plan_to_ops(problem, plan), self.lifetimes)


def _evaluate(problem: Problem, lifetimes: Lifetimes) -> _Evaluation:
    """The plan's cost and stage peaks from its copies: what is carried into each stage (a
    difference array over the copies), then the stage's computes with eager frees, as
    `plan_to_ops` runs them. O(total computes * in-degree)."""
    n, mem, transient, preds = problem.n, problem.mem, problem.transient, problem.preds
    computed, windows, serving = lifetime_windows(problem, lifetimes)
    carried = [0] * (n + 2)
    for v, copies in enumerate(windows):
        for start, _, last in copies:
            if last >= start:
                carried[start] += mem[v]
                carried[last + 1] -= mem[v]
    peaks, live, cost = [], 0, 0.0
    for t, stage in enumerate(computed):
        live += carried[t]
        used = serving[t]
        if used is None:  # t alone: its output and transient over what is carried in
            peaks.append(live + mem[t] + transient[t])
            cost += problem.cost[t]
            continue
        bytes_now, peak = live, 0
        last_use: dict[int, int] = {}
        for k in stage:
            cost += problem.cost[k]
            last_use[k] = k
            for p in preds[k]:
                last_use[p] = k
        for k in stage:
            bytes_now += mem[k]
            peak = max(peak, bytes_now + transient[k])
            for i in {*preds[k], k}:
                if last_use[i] == k and used[i][2] < t + 1:  # not carried into t + 1
                    bytes_now -= mem[i]
        peaks.append(peak)
    return _Evaluation(lifetimes, cost, tuple(peaks), windows)


def start_from_away(problem: Problem, away: dict[int, int], kept: set[int]) -> Lifetimes:
    """An assignment from a relaxation's solution: `away[v]`, the first stage at which v is
    away, ends v's first copy at its last read before that stage; a value in `kept` keeps its
    first copy past its last reader, for recomputes that read it later; every other first copy
    ends at its last reader. Recomputed copies live while any stage reads them."""
    n = problem.n
    end = []
    for v, users in enumerate(problem.succs):
        if v in away:
            end.append(max([v, *(r for r in users if r < away[v])]))
        else:
            end.append(n - 1 if v in kept else max(users, default=v))
    return Lifetimes(tuple(end), (LAST,) * n)


def start_from_member(problem: Problem, member: Member) -> Lifetimes:
    """The lifetimes a member's plan came from, where known; else `start_from_plan`."""
    return member.lifetimes or start_from_plan(problem, member.plan)


def start_from_plan(problem: Problem, plan: StagePlan) -> Lifetimes:
    """An assignment that follows a plan's first copies: each lives as long as the plan keeps
    it without a break after its computation; recomputed copies: LAST."""
    n = problem.n
    end = []
    for v in range(n):
        t = v
        while t + 1 < n and v in plan.kept[t + 1]:
            t += 1
        end.append(t)
    return Lifetimes(tuple(end), (LAST,) * n)


@dataclass(frozen=True)
class LifetimeMoves:
    """How `lifetime_search` draws its moves: `seed` of its perturbations; `candidates`: moves
    evaluated per repair step; `mirrored`: where the graph has repeated blocks
    (`solver.core.repeats`), also try each move in every block at once."""

    seed: int = 0
    candidates: int = 3
    mirrored: bool = True


def lifetime_search(
    problem: Problem,
    budget: int,
    starts: Sequence[Lifetimes],
    *,
    deadline: Deadline,
    found: Callable[[Member], object] | None = None,
    enough: Callable[[Member], bool] | None = None,
    stop: Callable[[], bool] | None = None,
    moves: LifetimeMoves = LifetimeMoves(),
) -> Member | None:
    """The cheapest plan within `budget` bytes found from `starts` by `deadline`: each start
    repaired and improved without swaps, then the best improved with swaps, then
    perturb-repair-improve rounds (module docstring), drawing its moves as `moves` says; None
    when no start could be repaired. `found` is called with each better plan as it comes; the
    search stops early once `enough(plan)` says it cannot be beaten, or when `stop()` says so
    between rounds once every start has been tried."""
    candidates = moves.candidates
    with paused_collection():  # the search allocates millions of acyclic objects
        rng = random.Random(moves.seed)
        mirror_groups = (mirrors(problem) or None) if moves.mirrored else None
        best: _Evaluation | None = None
        # each start repaired and improved with moves in every block, then (where it overflows)
        # again with moves of one value: the first is quicker on many blocks (GPT-2-24), the
        # second often ends cheaper (GPT-2-12), where it has the time
        pool = [(start, spread) for start in starts for spread in _repairs(mirror_groups)]
        swapped = False  # whether the best has been improved with swaps
        while not deadline.passed() and not (stop is not None and not pool and stop()):
            spread = None  # perturbation rounds repair and improve with single moves
            if pool:
                start, spread = pool.pop(0)
                if pool and pool[0][0] is start and _evaluate(problem, start).peak <= budget:
                    pool.pop(0)  # it fits: its other repair would make no move either
            elif best is not None:
                start = (
                    best.lifetimes if not swapped else _perturbed(problem, best, rng, mirror_groups)
                )
                swapped = True
            else:
                break
            repaired = _repair(problem, budget, start, deadline, candidates, spread)
            if repaired is None:
                continue
            improved = _improve(
                problem,
                budget,
                repaired,
                deadline,
                candidates,
                with_swaps=swapped,
                mirrors=spread,
            )
            if best is None or improved.cost < best.cost - 1e-12:
                best = improved
                member = best.member(problem)
                if found is not None:
                    found(member)
                if enough is not None and enough(member):
                    break
        return None if best is None else best.member(problem)


def _repairs(mirrors: Mirrors | None) -> tuple[Mirrors | None, ...]:
    """How `lifetime_search` repairs each start: with moves in every block first, then alone."""
    return (mirrors, None) if mirrors is not None else (None,)


def _repair(
    problem: Problem,
    budget: int,
    lifetimes: Lifetimes,
    deadline: Deadline,
    candidates: int,
    mirrors: Mirrors | None,
) -> _Evaluation | None:
    """Moves values out of the highest stage until the plan fits (None if it cannot)."""
    current = _evaluate(problem, lifetimes)
    while current.peak > budget:
        if deadline.passed():
            return None
        moved = _repair_steps(problem, budget, current, 1, candidates, mirrors)
        if moved is current:
            return None
        current = moved
    return current


def _repair_steps(
    problem: Problem,
    budget: int,
    current: _Evaluation,
    steps: int,
    candidates: int,
    mirrors: Mirrors | None,
) -> _Evaluation:
    """Up to `steps` moves out of the highest stage while the plan overflows (the same plan when
    there is none): of the `candidates` moves that free the most bytes per unit of rebuild cost
    (the value's and its missing ancestors', `solver.heuristics.eviction.rebuild_costs`), each
    alone and, with `mirrors`, also made in every block (`apply_move`), the one that adds the least
    cost per byte it takes off that stage; a move made in every block is preferred while its
    price is within `MIRROR_SLACK` of the least (it does in one step what would take one step
    per block, and mirrors' measured costs differ by noise)."""
    for _ in range(steps):
        if current.peak <= budget:
            break
        t = max(range(problem.n), key=current.stage_peaks.__getitem__)
        live = current.live_around(t)
        moves = moves_out(problem, current.lifetimes, live, t)
        if not moves:
            break
        rebuild = rebuild_costs(problem, live)
        moves.sort(key=lambda m: -problem.mem[m[0]] / (rebuild[m[0]] + 1e-12))
        tried = []
        for move in moves[:candidates]:
            spreads = (None, mirrors) if mirrors is not None and mirrors.of(move[0]) else (None,)
            for spread in spreads:
                trial = _evaluate(problem, apply_move(problem, current.lifetimes, move, spread))
                lower = current.stage_peaks[t] - trial.stage_peaks[t]
                # cost added per byte taken off the peak stage; moves that take none off come last
                price = (trial.cost - current.cost) / lower if lower > 0 else math.inf
                key = (trial.peak > budget, price, trial.peak, trial.cost)
                tried.append((key, spread is not None, trial))
        (overflows, least_price, _, _), _, _ = min(tried, key=lambda x: x[0])
        in_every_block = [
            x
            for x in tried
            if x[1] and x[0][0] == overflows and x[0][1] <= least_price * (1 + MIRROR_SLACK)
        ]
        current = min(in_every_block or tried, key=lambda x: x[0])[2]
    return current


MIRROR_SLACK = 0.25
"""`_repair_steps` takes a move made in every block over a cheaper move made once while it adds
at most this much more cost per byte."""


def _improve(
    problem: Problem,
    budget: int,
    best: _Evaluation,
    deadline: Deadline,
    candidates: int,
    *,
    with_swaps: bool,
    mirrors: Mirrors | None,
) -> _Evaluation:
    """Lets values live longer (first copies to their next read or while read, recomputed
    copies retained more), costliest values first, while that is cheaper and fits: with
    `mirrors`, first each change made in every block at once (one evaluation instead of one per
    block), then each block's lifetimes copied onto its neighbours (`_block_copies`), then each
    value alone. With `with_swaps`, once a sweep finds nothing, also where a short repair
    (`SWAP_STEPS`) makes it fit (slower: a swap evaluates up to SWAP_STEPS * `candidates`
    plans). Only values recomputed somewhere are tried: for any other no stage lacks a copy, so
    a longer life saves nothing."""
    if mirrors:
        best = _sweeps(problem, budget, best, deadline, candidates, with_swaps, mirrors)
        best = _block_copies(problem, budget, best, deadline, candidates, mirrors)
    return _sweeps(problem, budget, best, deadline, candidates, with_swaps, None)


def _block_copies(
    problem: Problem,
    budget: int,
    best: _Evaluation,
    deadline: Deadline,
    candidates: int,
    mirrors: Mirrors,
) -> _Evaluation:
    """Each block's lifetimes copied onto the block before and the block after it
    (`solver.heuristics.lifetime_moves.copied_block`), where that is cheaper and fits or a short
    repair (`SWAP_STEPS`) makes it fit, until no copy helps: a mix of block patterns (some
    blocks kept richer than others where the budget holds only a few rich ones), which a move
    made in every block cannot reach and single moves reach one value at a time."""
    blocks = mirrors.blocks
    improved = True
    while improved and not deadline.passed():
        improved = False
        for i, source in enumerate(blocks):
            for target in blocks[max(i - 1, 0) : i] + blocks[i + 1 : i + 2]:
                if deadline.passed():
                    return best
                copied = copied_block(problem, mirrors, best.lifetimes, source, target)
                trial = _evaluate(problem, copied)
                if trial.peak > budget and trial.cost < best.cost - 1e-12:
                    trial = _repair_steps(problem, budget, trial, SWAP_STEPS, candidates, None)
                if trial.peak <= budget and trial.cost < best.cost - 1e-12:
                    best, improved = trial, True
    return best


def _sweeps(
    problem: Problem,
    budget: int,
    best: _Evaluation,
    deadline: Deadline,
    candidates: int,
    with_swaps: bool,
    mirrors: Mirrors | None,
) -> _Evaluation:
    """`_improve`'s sweeps, each move made alone or (`mirrors`) in every block."""
    order = sorted(range(problem.n), key=lambda v: -problem.cost[v])
    if mirrors is not None:  # one value per group, the others follow it
        order = [v for v in order if mirrors.of(v)[:1] == (v,)]
    swapping = False  # this sweep also tries swaps
    while not deadline.passed():
        improved = False
        for v in order:
            if deadline.passed():
                break
            group = mirrors.of(v) if mirrors is not None else (v,)
            if all(len(best.windows[w]) < 2 for w in group):  # never recomputed
                continue
            for move in longer_moves(problem, best.lifetimes, v):
                trial = _evaluate(problem, apply_move(problem, best.lifetimes, move, mirrors))
                if swapping and trial.peak > budget and trial.cost < best.cost - 1e-12:
                    trial = _repair_steps(problem, budget, trial, SWAP_STEPS, candidates, mirrors)
                if trial.peak <= budget and trial.cost < best.cost - 1e-12:
                    best, improved = trial, True
                    break
        if improved:
            swapping = False
        elif swapping or not with_swaps:
            break
        else:
            swapping = True
    return best


SWAP_STEPS = 2
"""`_improve` lets a value live longer even where that overflows, if at most this many repair
moves (`_repair_steps`) bring the plan back within the budget at a lower cost: a swap of a
costly recompute for cheaper ones at the peak stage."""


def _perturbed(
    problem: Problem, best: _Evaluation, rng: random.Random, mirrors: Mirrors | None
) -> Lifetimes:
    """The best assignment with a few values moved: out of the peak stage or a random one,
    and one lifetime lengthened to the longest; with `mirrors`, each move made in every block
    half of the time."""
    lifetimes = best.lifetimes
    t = max(range(problem.n), key=best.stage_peaks.__getitem__)
    for _ in range(rng.randint(1, 3)):
        spread = mirrors if mirrors and rng.random() < 0.5 else None
        u = rng.randrange(problem.n)
        moves = moves_out(problem, lifetimes, best.live_around(u), u)
        moves += moves_out(problem, lifetimes, best.live_around(t), t)
        if moves:
            lifetimes = apply_move(problem, lifetimes, rng.choice(moves), spread)
        longest_life = (rng.randrange(problem.n), END, problem.n - 1)
        lifetimes = apply_move(problem, lifetimes, longest_life, spread)
    return lifetimes
