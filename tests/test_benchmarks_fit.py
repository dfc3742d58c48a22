"""`benchmarks.planning.fit_published` on a published graph (skipped where they are absent): VGG19's
largest batch under Checkmate's protocol is proven, agrees with Checkmate's published batch,
and is derived again without the fit's search.

Every node's bytes are linear in the batch and the costs do not change with it, so every
schedule's peak at batch b is b times its peak at batch 1, and the largest batch that fits is
memory // (the least peak within the compute cap at batch 1): one solve at batch 1, where the
fit probes large batches and bisects between them."""

from __future__ import annotations

import pytest

import solver
from benchmarks.common import GRAPHS_DIR
from benchmarks.planning.fit_published import GRAPHS, fit_row, per_sample
from solver.io import load_graph


@pytest.mark.skipif(not GRAPHS_DIR.is_dir(), reason="published graphs not present")
def test_vgg19_largest_batch_is_proven_and_is_memory_over_the_least_peak_per_sample():
    row = fit_row("VGG19", time_limit=30)
    assert row["proven"] == "yes"
    assert row["peak at max (B)"] <= row["memory bytes"]
    spec = GRAPHS["VGG19"]
    one = per_sample(load_graph(GRAPHS_DIR / f"{spec.stem}_train_nx.json"), spec.batch)
    assert not any("transient" in attrs for _, attrs in one.nodes(data=True))  # bytes: `mem`
    every_node = sum(attrs["cost"] for _, attrs in one.nodes(data=True))
    forward = sum(attrs["cost"] for _, attrs in one.nodes(data=True) if not attrs["backward"])
    least = solver.solve(
        one, objective="memory", compute_budget=every_node + forward, time_limit=30
    )
    assert least.status == "OPTIMAL"
    assert row["max batch"] == row["memory bytes"] // least.peak == row["Checkmate"]
