"""A lower bound on the peak of every schedule: the one-line bound raised by pending inputs.

The one-line bound says computing node v needs v's output, its inputs and its transient bytes
live at once. The inputs were themselves computed earlier, and each stayed live from its
computation until v's. Take a set P of values whose copies are all live at some moment and were
all computed before it (at v's compute, v's inputs). Of those copies, let u be the one computed
last: when u was computed, the other members of P were already live (computed earlier, live
until the moment), and so were u's inputs. So some compute op had live at once

    P, u's inputs, and u's transient bytes,

and the set (P - {u}) | inputs(u) is again live at that op and computed before it. Nobody
knows which member of P came last, so the bound takes the least over u:

    F(P, d) = min over u in P of max(bytes(P | inputs(u)) + transient(u),
                                     F((P - {u}) | inputs(u), d - 1)),
    F(P, 0) = bytes(P),

and every schedule (any op sequence, recomputations included, so the stage space too) peaks at
or above max over v of max(one-line(v), F(inputs(v), depth)). Values of 0 bytes are left out of
P (a weaker bound: their inputs are not followed), as are P larger than `width` (F(P, 0) is
taken there).

It is above the one-line bound where a backward op reads two values and the later one's inputs
are large: a tanh GELU's backward reads `tanh` and the incoming gradient, and whichever came
last was computed with the other live beside its own 1 MB input. On GPT-2 graphs captured by
`benchmarks.running.capture_graphs` it is 1.30-1.33x the one-line bound.
"""

from __future__ import annotations

from collections.abc import Sequence

DEPTH = 3
"""How many computations back from each node the argument is followed."""

WIDTH = 8
"""Largest pending set branched on (a node reading many values would multiply the work)."""


def pending_inputs_floor(
    mem: Sequence[int],
    transient: Sequence[int],
    preds: Sequence[Sequence[int]],
    depth: int = DEPTH,
    width: int = WIDTH,
) -> int:
    """Bytes no schedule of the graph can peak below for the inputs pending at each compute
    (module docstring): the most over nodes v of F(inputs(v), depth). The graph is in index
    form, `solver.core.graph.Problem`'s `mem`, `transient` and `preds`; `Problem.
    memory_lower_bound` is the larger of this and the one-line bound. Deterministic; about a
    second on 10,000 nodes."""
    inputs = [frozenset(u for u in p if mem[u] > 0) for p in preds]
    memo: dict[tuple[frozenset[int], int], int] = {}

    def pending(live: frozenset[int], d: int) -> int:
        key = (live, d)
        if key in memo:
            return memo[key]
        here = sum(mem[x] for x in live)
        if d > 0 and live and len(live) <= width:
            here = min(
                max(
                    sum(mem[x] for x in live | inputs[u]) + transient[u],
                    pending((live - {u}) | inputs[u], d - 1),
                )
                for u in live
            )
        memo[key] = here
        return here

    return max((pending(inputs[v], depth) for v in range(len(preds))), default=0)
