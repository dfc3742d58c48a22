"""`benchmarks.fit_published` on a published graph (skipped where they are absent): VGG19's
largest batch under Checkmate's protocol is proven, and is Checkmate's 289."""

from __future__ import annotations

import pytest

from benchmarks.common import GRAPHS_DIR
from benchmarks.fit_published import fit_row


@pytest.mark.skipif(not GRAPHS_DIR.is_dir(), reason="published graphs not present")
def test_vgg19_largest_batch_under_checkmates_protocol_is_proven_289():
    row = fit_row("VGG19", time_limit=30)
    assert (row["max batch"], row["proven"], row["Checkmate"]) == (289, "yes", 289)
    assert row["peak at max (B)"] <= row["memory bytes"]
