"""`TimeShares`: one object says how a solve's seconds are shared out, read by the exact
pipeline, the offload solve and `remat solve` alike."""

from __future__ import annotations

import inspect
import time
from dataclasses import asdict, replace

import pytest

import cli.solve
import solver
from cli.main import build_parser
from solver.exact.offload import solve_with_offload
from solver.exact.options import DEFAULT
from solver.examples import residual_demo


def test_the_defaults_are_the_shares_the_solves_were_tuned_with():
    """Each default, written out: a change to one is a change of behaviour, made here too."""
    assert asdict(solver.TimeShares()) == {
        "warm_start": 0.5,
        "heuristic": 0.1,
        "peak_search_small": 0.2,
        "policy": 0.1,
        "cover": 0.1,
        "cascade_first": 0.15,
        "cascade": 0.8,
        "cascade_small": 0.3,
        "cascade_eviction": 0.5,
        "lp": 0.5,
        "lp_repeat": 0.1,
        "probe": 0.5,
        "minimise": 0.5,
        "least_peak": 0.5,
        "offload_keep_recompute": 0.3,
        "offload_keep_recompute_alone": 0.9,
        "offload_heuristics": 0.5,
        "command_exact": 0.8,
        "command_keep_recompute": 0.5,
    }
    assert solver.SolveOptions().shares == solver.TimeShares()


def test_the_library_and_the_command_read_the_same_object():
    """`solve` and `solve_with_offload` default to the `SolveOptions` whose shares `remat
    solve` reads; the command's exact solves end by that object's `command_exact` of
    --time-limit (a start that has spent 70% of 10 s solves at 0.8 and is refused at 0.6)."""
    for function in (solver.solve, solve_with_offload):
        assert inspect.signature(function).parameters["options"].default is cli.solve.DEFAULT
    assert cli.solve.DEFAULT is DEFAULT
    graph = residual_demo(blocks=2)
    args = build_parser().parse_args(["solve", "--demo", "--time-limit", "10", "--quiet"])
    assert cli.solve.run_solve(args, graph, time.perf_counter() - 7.0) == 0
    shares = replace(DEFAULT.shares, command_exact=0.6)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(cli.solve, "DEFAULT", replace(DEFAULT, shares=shares))
        with pytest.raises(ValueError, match=r"--time-limit 10 s was spent before the solve"):
            cli.solve.run_solve(args, graph, time.perf_counter() - 7.0)
