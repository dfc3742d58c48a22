"""`remat sac`: solves and saves a plan, runs a saved one, and reports a bad budget in one line
on stderr with exit status 2."""

from __future__ import annotations

import dataclasses

import pytest
from sac_models import every_saveable, larger, replanned

import executor
from cli.main import main
from solver.sac.memory import offloadable, plan_host
from solver.sac.union import flatten

pytestmark = pytest.mark.usefixtures("one_thread")


def test_solve_save_and_run_a_plan(tmp_path, capsys):
    out = tmp_path / "plan.json"
    args = ["sac", "--model", "sac_models:small", "--steps", "2", "--time-limit", "10"]
    assert main([*args, "--budget", "min", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "plan: OPTIMAL" in printed and "bytes over budget: 0" in printed
    assert main([*args, "--plan", str(out)]) == 0
    assert "bytes over budget: 0" in capsys.readouterr().out


def test_bad_budget_is_one_line_and_status_2(capsys):
    assert main(["sac", "--model", "sac_models:small", "--budget", "lots"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("remat: error: cannot read memory budget") and err.count("\n") == 1


def test_offload_option_and_an_offloading_plan_file(tmp_path, capsys):
    """`--offload` solves and saves;
    `--plan` runs a plan file whose regions offload every op they may: its device peak (host
    copies told apart) within its budget, its measured host bytes equal to the predicted."""
    out = tmp_path / "plan.json"
    args = ["sac", "--steps", "2", "--time-limit", "10"]
    solve = [*args, "--model", "sac_models:small", "--budget", "min", "--offload", "25,20,1GiB"]
    assert main([*solve, "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "offload: " in printed and "bytes over budget: 0" in printed
    model, inputs = larger()
    plan = executor.checkpoint_plan(model, inputs, "min", time_limit=60, offload="h100")
    saved = every_saveable(plan)
    offloaded = tuple(
        frozenset(i for i in s if offloadable(r.ops[i]))
        for r, s in zip(plan.problem.regions(), saved, strict=True)
    )
    changed, peak = replanned(plan, saved, offloaded)
    flat = flatten(plan.problem, changed.union_plan())
    host = plan_host(*flat)
    dataclasses.replace(changed, peak=peak, budget=peak, host_peak=host).save(out)
    assert main([*args, "--model", "sac_models:larger", "--plan", str(out)]) == 0
    printed = capsys.readouterr().out
    assert f"plan measured / predicted host peak: {host:,} / {host:,}" in printed and host > 0
    assert "bytes over budget: 0" in printed
