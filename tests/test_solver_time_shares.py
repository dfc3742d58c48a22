"""`TimeShares`: one object says how a solve's seconds are shared out, read by the exact
pipeline, the offload solve and `remat solve` alike."""

from __future__ import annotations

import ast
import inspect
import time
from dataclasses import asdict, replace
from pathlib import Path

import pytest

import cli.solve
import solver
from cli.main import build_parser
from solver.exact.offload.search import solve_with_offload
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


def test_every_other_calls_shares_are_written_out_with_the_numbers_they_run_with():
    """`fit`'s, `checkpoint_plan`'s, `rematerialize`'s, `compile`'s and `estimate`'s shares, beside
    `TimeShares`."""
    assert asdict(solver.FitShares()) == {
        "search": 0.6,
        "keep_recompute": 0.5,
        "probe": 0.25,
        "probe_least_peak": 0.25,
    }
    assert asdict(solver.SacShares()) == {
        "recording": 0.5,
        "block_streams": 1 / 3,
        "child_streams": 1 / 2,
        "least_peak": 0.5,
    }
    assert asdict(solver.RematerializeShares()) == {"solve_at_least": 0.5}
    assert asdict(solver.CompileShares()) == {"first_solves": 0.5}
    assert asdict(solver.EstimateShares()) == {"first": 0.4, "search": 0.6, "deciding": 1.0}


LIBRARY = ("graph_capture", "solver", "executor", "cli")
NOT_SHARES = {
    "solver/milp/cpsat.py:OVERRUN_SHARE": "how far CP-SAT overruns its time limit, measured: "
    "a model of the engine, not a share of a call's seconds given to a step",
}
"""Module constants named as shares that are no share of a call's seconds, each with why."""


def _share_literals() -> list[str]:
    """'path:line what' for each share of a call's seconds written in place, outside
    solver/time_shares.py: a number passed to `Deadline.share`, the time left divided or
    multiplied by a number, and a module constant named ``*_SHARE``."""
    root = Path(__file__).resolve().parents[1]
    found = []
    for package in LIBRARY:
        for path in sorted((root / package).rglob("*.py")):
            where = str(path.relative_to(root))
            tree = ast.parse(path.read_text())
            for node in tree.body:
                targets = node.targets if isinstance(node, ast.Assign) else []
                for target in targets:
                    name = getattr(target, "id", "")
                    if name.endswith("_SHARE") and f"{where}:{name}" not in NOT_SHARES:
                        found.append(f"{where}:{node.lineno} {name}")
            for node in ast.walk(tree):
                if _is_call_of(node, "share") and node.args and _number(node.args[0]):
                    found.append(f"{where}:{node.lineno} .share({ast.unparse(node.args[0])})")
                if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult | ast.Div):
                    sides = (node.left, node.right)
                    if any(_is_call_of(s, "remaining") for s in sides) and any(map(_number, sides)):
                        found.append(f"{where}:{node.lineno} {ast.unparse(node)}")
    return found


def _is_call_of(node: ast.AST, method: str) -> bool:
    return (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == method
    )


def _number(node: ast.AST) -> bool:
    """A number written out: a constant, or constants combined (1 / 3)."""
    if isinstance(node, ast.Constant):
        return isinstance(node.value, int | float) and not isinstance(node.value, bool)
    if isinstance(node, ast.BinOp):
        return _number(node.left) and _number(node.right)
    return False


def test_every_share_of_a_calls_seconds_lives_in_time_shares():
    """No share is written where it is taken: each is a field of a frozen object in
    solver/time_shares.py with its default, passed down as a parameter."""
    assert _share_literals() == []
