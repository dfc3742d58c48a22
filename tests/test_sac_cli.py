"""`remat sac`: solves and saves a plan, runs a saved one, and reports a bad budget in one line
on stderr with exit status 2."""

from __future__ import annotations

import pytest

from cli.main import main

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
