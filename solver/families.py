"""Every heuristic family the solver knows for a graph: the baselines, plus rotor on chains.

The exact solver warm-starts from their best member, and the frontier and benchmarks compare
against them, so all three read the same list.
"""

from __future__ import annotations

import contextlib

from solver.baselines import BASELINES, Member
from solver.graph import Problem
from solver.rotor import NotAChainError, rotor

ROTOR_MAX_FORWARD = 80
"""Longest chain (forward nodes) rotor runs on: its program is O(n^3) array operations over the
memory grid, about a minute at 150 forward nodes on a 2-core machine."""


def families(problem: Problem) -> dict[str, list[Member]]:
    """Every family of `solver.BASELINES` by name, plus "rotor" when the graph is the training
    graph of a chain of at most ROTOR_MAX_FORWARD forward nodes."""
    out = {name: make(problem) for name, make in BASELINES.items()}
    if sum(not b for b in problem.backward) <= ROTOR_MAX_FORWARD:
        with contextlib.suppress(NotAChainError):
            out["rotor"] = rotor(problem)
    return out


def all_members(problem: Problem) -> list[Member]:
    """Every member of every family: the candidates for a warm start."""
    return [member for members in families(problem).values() for member in members]
