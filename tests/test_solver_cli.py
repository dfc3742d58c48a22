"""`remat solve`: table, schedule file and error exit."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

import solver
from cli.main import build_parser, main
from cli.solve import run_solve
from solver.examples import residual_demo
from solver.io import save_graph


def test_solve_prints_the_table_and_writes_a_loadable_schedule(tmp_path, capsys):
    graph = residual_demo(blocks=2)
    save_graph(graph, tmp_path / "g.json")
    out = tmp_path / "s.json"
    assert (
        main(
            [
                "solve",
                str(tmp_path / "g.json"),
                "--budget",
                "80%",
                "--out",
                str(out),
                "--time-limit",
                "30",
                "--quiet",
            ]
        )
        == 0
    )
    text = capsys.readouterr().out
    for word in (
        "method",
        "exact",
        "OPTIMAL",
        "sqrt_segments",
        "chen_greedy",
        "eviction",
        "overhead",
    ):
        assert word in text
    schedule = solver.Schedule.load(out, graph)
    assert schedule.status == "OPTIMAL" and schedule.peak <= schedule.budget


def test_memory_objective_from_the_command_line(tmp_path, capsys):
    graph = residual_demo(blocks=1)
    save_graph(graph, tmp_path / "g.json")
    assert (
        main(
            [
                "solve",
                str(tmp_path / "g.json"),
                "--objective",
                "memory",
                "--compute-budget",
                "1.1x",
                "--quiet",
            ]
        )
        == 0
    )
    text = capsys.readouterr().out
    assert "least peak" in text
    assert "eviction" not in text  # it needs a byte budget


def test_errors_exit_2_with_a_message(tmp_path, capsys):
    assert main(["solve", str(tmp_path / "missing.json")]) == 2
    assert "cannot read graph file" in capsys.readouterr().err
    graph = residual_demo(blocks=1)
    save_graph(graph, tmp_path / "g.json")
    assert main(["solve", str(tmp_path / "g.json"), "--budget", "1%", "--quiet"]) == 2
    assert "minimum feasible budget" in capsys.readouterr().err
    path = str(tmp_path / "g.json")
    mixed = {
        ("--objective", "memory", "--budget", "80%"): "--budget is for --objective cost",
        ("--compute-budget", "1.2x"): "--compute-budget is for --objective memory",
        ("--objective", "memory", "--offload", "pcie5"): "--offload is for --objective cost",
        ("--budget", "min", "--offload", "pcie5"): "--offload is for --objective cost at a "
        "--budget in bytes or percent, not --budget min",
    }
    for flags, message in mixed.items():  # a budget the objective would ignore is refused
        assert main(["solve", path, *flags, "--quiet"]) == 2
        assert message in capsys.readouterr().err


def test_the_least_peak_takes_a_compute_budget_as_the_library_does(tmp_path, capsys):
    """`remat solve` checks its options with `solve`'s own check: --budget min bounds the
    recomputation of its least peak with --compute-budget, as `solve(graph, "min",
    compute_budget=...)` does."""
    save_graph(residual_demo(blocks=1), tmp_path / "g.json")
    argv = ["solve", str(tmp_path / "g.json"), "--budget", "min", "--compute-budget", "1.05x"]
    out = tmp_path / "s.json"
    assert main([*argv, "--quiet", "--no-baselines", "--time-limit", "30", "--out", str(out)]) == 0
    schedule = solver.Schedule.load(out)
    assert schedule.compute_budget is not None
    assert schedule.cost <= schedule.compute_budget * (1 + 1e-12)
    assert "the least peak, then the least cost at it" in capsys.readouterr().out


def test_an_output_file_that_cannot_be_written_is_refused_before_solving(tmp_path, capsys):
    """Found only after the solve, it would cost the whole solve: refused first, in one line,
    with nothing solved (no table, no progress)."""
    save_graph(residual_demo(blocks=1), tmp_path / "g.json")
    missing = tmp_path / "no" / "such" / "dir" / "s.json"
    argv = [
        "solve",
        str(tmp_path / "g.json"),
        "--quiet",
        "--time-limit",
        "30",
        "--out",
        str(missing),
    ]
    assert main(argv) == 2
    out, err = capsys.readouterr()
    assert f"cannot write --out {missing}: no directory" in err and err.count("\n") == 1
    assert out == ""


def test_the_time_limit_counts_from_the_command_start(tmp_path):
    """Run as the command, `remat solve` counts its limit from the process's start (imports
    and loading included): a start that has spent the exact solve's share is refused with a
    message, and one that leaves time solves in it."""
    graph = residual_demo(blocks=2)
    args = build_parser().parse_args(["solve", "--demo", "--time-limit", "10", "--quiet"])
    spent = time.perf_counter() - 9.0  # 90% of the limit gone: past the exact solve's 80%
    with pytest.raises(ValueError, match=r"--time-limit 10 s was spent before the solve began"):
        run_solve(args, graph, spent)
    assert run_solve(args, graph, time.perf_counter() - 5.0) == 0


def test_process_start_is_the_interpreter_start():
    """`process_start` of a fresh interpreter lies between the instant before it was spawned
    (less the 10 ms resolution of /proc's start time) and its first statement:
    `time.perf_counter` is CLOCK_MONOTONIC, one clock for every process on Linux, so the
    instants compare across processes whatever the machine's load."""
    code = (
        "import time; first = time.perf_counter(); time.sleep(0.3)\n"
        "from solver.deadline import process_start\n"
        "print(process_start(), first)"
    )
    spawned = time.perf_counter()
    ran = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    start, first = map(float, ran.stdout.split())
    assert spawned - 0.011 <= start <= first
