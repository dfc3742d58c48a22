"""Smoke test of the benchmarks' quick path on tiny inputs (CI: well under a minute)."""

from __future__ import annotations

import csv
import itertools
from pathlib import Path

import pytest

import solver
from benchmarks.common import GRAPHS_DIR, Settings, plot_frontier, write_table
from benchmarks.solving import frontier, published, seeds
from solver.io import load_graph


def _settings(tmp_path: Path) -> Settings:
    return Settings(tmp_path, quick=True, time_limit=1, repeats=1)


def test_tables_and_plot_are_written(tmp_path: Path) -> None:
    rows = [{"method": "exact", "budget_frac": 0.5, "overhead": 0.1}]
    md = write_table(rows, tmp_path, "t", "title")
    assert "| exact | 0.5 | 0.1 |" in md.read_text()
    with open(tmp_path / "t.csv") as f:
        assert next(csv.DictReader(f))["method"] == "exact"
    assert plot_frontier(rows, tmp_path / "t.png", "t").stat().st_size > 0


def test_seed_rows_on_a_16_stack(tmp_path: Path) -> None:
    rows = seeds.every_k_rows(16, _settings(tmp_path))
    k4 = next(r for r in rows if r["k"] == 4)
    assert k4["every_k_peak"] == 4 + 16 // 4  # k + n/k units
    assert k4["rotor_recompute"] <= k4["every_k_recompute"]
    assert k4["exact_recompute"] <= k4["every_k_recompute"]


@pytest.mark.skipif(not GRAPHS_DIR.is_dir(), reason="published graphs absent")
def test_published_ratio_row(tmp_path: Path) -> None:
    (row,) = published.ratio_rows("VGG16_256_224x224x3", _settings(tmp_path), (0.9,))
    assert row["status"] in ("OPTIMAL", "FEASIBLE")
    assert all(row[m] == "NO FIT" or row[m] >= 1 - 1e-9 for m in ("sqrt_segments", "every_k"))


def test_model_frontier_and_measurements(tmp_path: Path) -> None:
    predicted, measured = frontier.run_model("stack16", _settings(tmp_path))
    assert any(r["method"] == "exact" for r in predicted)
    methods = {r["method"] for r in measured}
    assert {"eager (plain)", "remat sqrt_segments", "torch.utils.checkpoint per block"} <= methods
    assert (tmp_path / "frontier_stack16.png").exists()


def test_stage_lp_row_times_a_published_graph() -> None:
    from benchmarks.solving.stage_lp import lp_row

    path = GRAPHS_DIR / "fcn_8_vgg_32_416x608x3_train_nx.json"
    if not path.exists():
        pytest.skip(f"{path} not present")
    row = lp_row("fcn", path, 0.8, time_limit=30)
    assert row["variables"] > 0 and row["LP s"] is not None and row["variables per LP s"] > 0


def test_median_interval_holds_the_median_and_is_reproducible() -> None:
    from benchmarks.running.real_models import median_interval

    samples = [1.10, 1.14, 1.12, 1.30, 1.11, 1.13, 1.09, 1.12, 1.15, 1.12]
    low, high = median_interval(samples)
    assert low <= 1.12 <= high  # the sample median (1.12) lies inside
    assert min(samples) <= low and high <= max(samples)
    assert median_interval(samples) == (low, high)  # fixed seed
    assert median_interval([1.2] * 8) == (1.2, 1.2)  # no spread, no width


def test_an_overhead_interval_is_resolved_when_a_tenth_of_the_overhead_or_a_point_wide() -> None:
    from benchmarks.running.real_models import resolved

    assert resolved(1.192, 1.208)  # 1.6 points wide on a 20% overhead
    assert not resolved(1.17, 1.36)  # 19 points on 26%: more rounds
    assert resolved(1.026, 1.035)  # under a point on a 3% overhead: as fine as timing gets
    assert not resolved(1.02, 1.04)
    assert resolved(0.995, 1.005)  # the noise floor's control step


def test_overhead_rounds_stop_once_resolved_and_at_the_cap_otherwise() -> None:
    from benchmarks.running.real_models import REMAT_FULL, rounds_until_resolved

    calls = itertools.count()
    seconds = {
        REMAT_FULL: lambda: 0.01,
        "steady": lambda: 0.02,  # +100%, a tight interval after one block
        "bursty": lambda: 0.01 if next(calls) % 2 else 0.04,  # +0% or +300%
    }

    def timer(pair: dict, rounds: int) -> dict[str, list[float]]:
        """Step times as the steps state them: the rule, not this machine's clock."""
        return {name: [seconds[name]() for _ in range(rounds)] for name in pair}

    steps = {name: lambda: None for name in seconds}
    steady = rounds_until_resolved(steps, "steady", rounds=6, max_rounds=24, timer=timer)
    assert len(steady["steady"]) == len(steady[REMAT_FULL]) == 6
    bursty = rounds_until_resolved(steps, "bursty", rounds=6, max_rounds=15, timer=timer)
    assert len(bursty["bursty"]) == len(bursty[REMAT_FULL]) == 12  # whole blocks, up to the cap


def test_cover_ceiling_is_under_a_schedule_it_bounds() -> None:
    from benchmarks.solving.cover_ceiling import ceiling_row

    path = GRAPHS_DIR / "random_layered_n100_w0.27_nlv0.75_ed0.2_scd0.14.json"
    if not path.exists():
        pytest.skip(f"{path} not present")
    row = ceiling_row(path, "90%", time_limit=20, least_time_limit=0)
    assert row["proven"] and row["rows"] > 0 and row["bound"] > 0
    graph = load_graph(path)
    schedule = solver.solve(graph, row["bytes"], time_limit=5)
    first = sum(graph.nodes[v]["cost"] for v in graph)
    assert row["bound"] <= (schedule.cost - first) / first + 1e-4  # rounded to 4 places


def test_sac_estimate_row_runs_both_plans_on_the_real_model() -> None:
    """`benchmarks.planning.sac_estimate.compare` on its smallest model: both plans at one
    budget in bytes, each measured within it on the real model."""
    pytest.importorskip("transformers")
    from benchmarks.planning.sac_estimate import MIB, compare

    row = compare("gpt2_tiny", "60%", steps=1, time_limit=10)
    assert row["estimate budget"] == "measured plan's"
    for mode in ("measured", "estimate"):
        assert 0 < row[f"{mode} measured MiB"] * MIB <= row["budget MiB"] * MIB
        assert row[f"{mode} ms"] > 0
