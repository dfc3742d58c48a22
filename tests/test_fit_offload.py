"""`fit(..., offload=link)` and `remat fit --offload`: the step's schedules may also copy values
to the host (docs/offload.md). Without a link nothing changes (no solve gets one); with one, the
size is at least keep/recompute's, proven where the one-line floor or the offload solve proves
it, and the host bytes reported are the schedule's simulated host peak, within the link's host
limit. Estimate mode (meta tensors, a toy device: deterministic costs)."""

from __future__ import annotations

import networkx as nx
import pytest
from test_executor_fit import blocks
from test_executor_offload import with_offloads
from test_fit_fsdp import TOY, meta_blocks

import executor
import solver
import solver.fitting.probe
from cli.main import main
from executor.fitting.baselines import EagerSteps, run_step
from executor.fitting.graphs import SizedGraphs, with_loss
from executor.loss import default_loss
from solver import Link
from solver.fitting.result import Fit
from solver.fitting.search import largest_fitting
from solver.fitting.sizes import DOES_NOT_FIT, FITS

pytestmark = pytest.mark.usefixtures("one_thread")

MEMORY = 100 * 1024
LIMITED = Link(1e12, 1e12, host_memory=1024)
"""Bytes per second each way (copies of these activations take nanoseconds, as the computes
do) and bytes the host may hold."""


def _reduction(size: int) -> nx.DiGraph:
    """tests/test_solver_offload.py's reduction with every byte times `size`: a (6) -> b (1) ->
    c (1) -> e (1, 5 of workspace) -> d (1), and d reads b. Keeping or recomputing b peaks at
    8 x size, offloading it at 7 x size; computing e alone needs 7 x size (the one-line floor)."""
    graph = nx.DiGraph()
    for v, mem, transient in [("a", 6, 0), ("b", 1, 0), ("c", 1, 0), ("e", 1, 5), ("d", 1, 0)]:
        graph.add_node(v, mem=mem * size, cost=1, transient=transient * size)
    graph.add_edges_from([("a", "b"), ("b", "c"), ("c", "e"), ("e", "d"), ("b", "d")])
    return graph


def test_offload_fits_a_size_keep_recompute_proves_does_not_and_the_floor_bounds_it():
    """At 56 B keep/recompute fits size 7 (8 x 7) and is proven not to fit 8; offloading b fits
    8 (7 x 8) with b's 8 B on the host, and 9 is proven not to by the one-line floor (63 B)."""
    kept = largest_fitting(_reduction, 56, time_limit=30)
    assert (kept.size, kept.upper, kept.proven) == (7, 8, True)
    link = Link(100, 100)
    found = largest_fitting(_reduction, 56, time_limit=30, offload=link)
    assert (found.size, found.upper, found.proven) == (8, 9, True)
    verdicts = {p.size: p.verdict for p in found.probes}
    assert verdicts[8] == FITS and verdicts[9] == DOES_NOT_FIT
    assert "peak floor" in next(p.reason for p in found.probes if p.size == 9)
    run = solver.simulate(_reduction(8), found.schedule.ops, link)
    assert run.valid and run.peak <= 56 and run.host_peak == 8 == found.schedule.extra["host_peak"]
    fit = Fit("batch", 56, 8, True, 9, 56, found.schedule, None, 0, None, None, None, None, "")
    fit.link = link
    assert fit.host_peak == 8
    assert "the schedule at batch 8 holds 8 B on the host (1 offloads, 1 reloads" in fit.summary()


def test_with_a_cap_the_offload_solve_s_cost_bound_refutes_less_its_rounding():
    """At 1.0x the reload before d stalls (a reload waits at its stage's start), so size 8 is
    refuted by the offload solve's cost bound, over times rounded to whole units
    (`OffloadTimes.rounding` > 0 over this link); at 1.1x the stall fits under the cap."""
    link = Link(3e3, 3e3)  # b's 8 B in 8/3000 units: no power of ten makes it whole
    capped = largest_fitting(_reduction, 56, compute_budget="1.0x", time_limit=30, offload=link)
    assert (capped.size, capped.upper, capped.proven) == (7, 8, True)
    assert "> the cap 5" in next(p.reason for p in capped.probes if p.size == 8)
    found = largest_fitting(_reduction, 56, compute_budget="1.1x", time_limit=30, offload=link)
    assert (found.size, found.upper, found.proven) == (8, 9, True)
    assert found.schedule.extra["offloads"] == 1 and found.schedule.cost <= 5.5


def test_a_host_limit_below_the_copy_leaves_keep_recompute_s_answer():
    found = largest_fitting(_reduction, 56, time_limit=30, offload=Link(100, 100, host_memory=7))
    assert (found.size, found.upper, found.proven) == (7, 8, True)  # b's copy needs 8 B of host
    assert "no schedule with offload fits" in found.probes[-1].reason


@pytest.fixture(scope="module")
def fits() -> tuple[dict[str, executor.Fit], list[object]]:
    """The same fit (the toy device, no cap) without a link and over a fast link with a host
    limit, and the link every solve of the first got. Without a cap the peak floors and
    checkpoint-all decide each size at once (2 s each, here): both fits are proven and end
    long before their 60 s, so a loaded machine leaves them the same answer."""
    links: list[object] = []
    solve = solver.fitting.probe.solve

    def recording(*args, **kwargs):
        links.append(kwargs.get("offload"))
        return solve(*args, **kwargs)

    common = {"target": TOY, "time_limit": 60}
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(solver.fitting.probe, "solve", recording)
        kept = executor.fit(meta_blocks, MEMORY, **common)
        without = list(links)
        copied = executor.fit(meta_blocks, MEMORY, offload=LIMITED, **common)
    return {"none": kept, "limited": copied}, without


def test_without_a_link_no_solve_offloads_and_nothing_is_reported(fits):
    found, links = fits
    kept = found["none"]
    assert links and set(links) == {None} and kept.proven
    assert kept.link is None and kept.host_peak is None and "offload" not in kept.summary()
    refuted = next(p for p in kept.probes if p.size == kept.upper)
    assert f"why batch {kept.upper} does not fit: {refuted.reason}" in kept.summary()


def test_with_a_link_the_size_is_at_least_keep_recompute_s(fits):
    kept, copied = fits[0]["none"], fits[0]["limited"]
    assert copied.proven and copied.size >= kept.size and copied.link == LIMITED
    assert "offload over d2h 1000 GB/s, h2d 1000 GB/s, host limit 1024 B" in copied.summary()


def test_the_host_bytes_are_the_schedule_s_simulated_host_peak_within_the_limit(fits):
    copied = fits[0]["limited"]
    graphs = SizedGraphs(with_loss(meta_blocks, default_loss), (2, 3, 4), "batch", {"target": TOY})
    run = solver.simulate(graphs(copied.size), copied.schedule.ops, copied.schedule.link)
    assert run.valid and run.peak <= copied.budget
    assert copied.host_peak == run.host_peak <= LIMITED.host_memory


def test_remat_fit_offload_reads_a_link_and_refuses_an_unknown_one(tmp_path, capsys, monkeypatch):
    TOY.save(tmp_path / "toy.json")
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "offload_models.py").write_text(
        "from test_fit_fsdp import meta_blocks\n", encoding="utf-8"
    )
    argv = ["fit", "--model", "offload_models:meta_blocks", "--memory", "100KiB"]
    argv += ["--target", str(tmp_path / "toy.json"), "--time-limit", "60"]  # proven in seconds
    assert main([*argv, "--offload", "1000,1000"]) == 0
    assert "offload over d2h 1000 GB/s, h2d 1000 GB/s" in capsys.readouterr().out
    assert main([*argv, "--offload", "nope"]) == 2
    err = capsys.readouterr().err
    assert "unknown target 'nope'" in err and err.count("\n") == 1


def test_a_real_step_under_a_schedule_that_copies_measures_its_host_copies():
    """fit's real step (`run_step`) under a schedule with offloads (`blocks` at batch 8, some
    recomputes turned into reloads): the host copies' measured peak is the simulated one."""
    graphs = SizedGraphs(with_loss(blocks, default_loss), (2, 3, 4), "batch", None)
    captured = graphs.capture(8).graph
    schedule = with_offloads(captured, [True, False], [True], Link(1e9, 1e9))
    assert schedule.extra["offloads"] > 0
    peak, host = run_step(EagerSteps(graphs, "adamw"), 8, schedule)
    assert host == schedule.extra["host_peak"] > 0 and peak > 0
