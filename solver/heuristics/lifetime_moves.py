"""Moves of the lifetime search (`solver.heuristics.lifetimes`): changes to one value's lifetime,
made alone or in every copy of a repeated block (`solver.core.repeats`), and block patterns
copied from one block onto another. Every move gives lifetimes, and every lifetimes a valid plan
(`solver.core.stages.plan_from_lifetimes`): moves choose among plans, they cannot break one."""

from __future__ import annotations

from solver.core.graph import Problem
from solver.core.repeats import BlockIndex, Mirrors
from solver.core.stages import AT_USE, LAST, Lifetimes

Move = tuple[int, int, int]
"""A change to one value's lifetime: (v, END, stage) ends v's first copy at `stage`;
(v, RETAIN, kind) retains v's recomputed copies as `kind` (`solver.core.stages.AT_USE`...)."""

END, RETAIN = 0, 1


def apply_move(
    problem: Problem, lifetimes: Lifetimes, move: Move, mirrors: Mirrors | None
) -> Lifetimes:
    """`lifetimes` with `move` made, and with `mirrors` made the same way to each of v's
    mirrors: the same retention, or an end at the counterpart of the stage in the mirror's block
    (`counterpart_stage`)."""
    v, what, value = move
    end, retain = list(lifetimes.end), list(lifetimes.retain)
    for w in (mirrors.of(v) if mirrors is not None else ()) or (v,):
        if what == RETAIN:
            retain[w] = value
        else:
            assert mirrors is not None or w == v
            end[w] = value if w == v else counterpart_stage(problem, mirrors, value, w)
    return Lifetimes(tuple(end), tuple(retain))


def counterpart_stage(problem: Problem, mirrors: Mirrors, stage: int, w: int) -> int:
    """`stage` seen from w's block: its mirror there; the last stage, and a stage with no mirror
    there, stay (no earlier than w)."""
    if stage == problem.n - 1:
        return stage
    there = mirrors.counterpart(stage, mirrors.block[w])
    return max(w, stage if there is None else there)


def longer_moves(problem: Problem, lifetimes: Lifetimes, v: int) -> list[Move]:
    """v's first copy to its next read (while read, past the last), its recomputed copies
    retained one step more."""
    later = [r for r in problem.succs[v] if r > lifetimes.end[v]]
    moves = []
    if later:
        moves.append((v, END, later[0]))
    elif lifetimes.end[v] < problem.n - 1:
        moves.append((v, END, problem.n - 1))
    if lifetimes.retain[v] < LAST:
        moves.append((v, RETAIN, lifetimes.retain[v] + 1))
    return moves


def moves_out(problem: Problem, lifetimes: Lifetimes, live: set[int], t: int) -> list[Move]:
    """Ways to take a value live at stage t out of it: end a first copy at its last read
    before t, or retain a recomputed copy less; `live`: the values live around stage t."""
    moves = []
    for v in live:
        if v < t <= lifetimes.end[v]:
            earlier = [r for r in problem.succs[v] if r < t]
            moves.append((v, END, max([v, *earlier])))
        if lifetimes.retain[v] > AT_USE:
            moves.append((v, RETAIN, lifetimes.retain[v] - 1))
    return moves


def copied_block(
    problem: Problem, mirrors: Mirrors, lifetimes: Lifetimes, source: BlockIndex, target: BlockIndex
) -> Lifetimes:
    """`lifetimes` with each grouped node of block `target` living as its mirror in `source`
    does (an end at the mirror of the stage, `counterpart_stage`; the same retention)."""
    end, retain = list(lifetimes.end), list(lifetimes.retain)
    for group in mirrors.groups:
        v = mirrors.counterpart(group[0], source)
        w = mirrors.counterpart(group[0], target)
        if v is not None and w is not None:
            end[w] = counterpart_stage(problem, mirrors, lifetimes.end[v], w)
            retain[w] = lifetimes.retain[v]
    return Lifetimes(tuple(end), tuple(retain))
