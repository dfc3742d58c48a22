"""`benchmarks.planning.offload_llama` at a tiny Llama-3 (the benchmark's code, its FSDP2 policy
on h100 and its link, in seconds): the point's rows and table, and `scale_fit.remat_fit` with
offload, so that the benchmark cannot rot."""

from __future__ import annotations

import pytest

from benchmarks.planning import offload_llama, scale_fit, scale_llama

pytestmark = pytest.mark.usefixtures("one_thread")

TINY = {
    **scale_llama.LLAMA3,  # its vocabulary of 128,256: the float32 logits set the floor
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
}


@pytest.fixture
def tiny(monkeypatch):
    pytest.importorskip("transformers")
    monkeypatch.setitem(scale_llama.RUNS, "tiny", (TINY, 1, 256, "h100", 8, None))
    return "tiny"


def test_the_point_rows_and_table_at_a_tiny_llama(tiny):
    # 3 s a solve: keep/recompute closes in a tenth of a second on these 102 nodes; the offload
    # model (60,648 variables) is too large for 3 s, so the offload solve returns its incumbent
    # at once rather than running CP-SAT to its limit, on any machine
    point = offload_llama.point(tiny, 2, time_limit=3, tight=0.9)
    assert point["fixed"] > 0 and 0 < point["checkpoint-all peak"] < point["usable"]
    assert "the loss" in point["floor"]["node"]  # the cross-entropy's backward, float32 logits
    tight = point["budgets"]["90% of checkpoint-all"]
    kept, copied = tight["keep/recompute"], tight["offload"]
    assert max(kept["peak"], copied["peak"]) <= tight["budget"]
    assert copied["cost"] <= kept["cost"] * (1 + 1e-9)  # the offload space holds kept's plan
    assert copied["host_peak"] >= 0 and copied["status"] in ("OPTIMAL", "FEASIBLE")
    assert "too many for the" in copied["not built"]  # the table's status says so
    for got in point["reloads instead"]:  # each a valid schedule: stall waits on its reloads
        assert got["stall s"] >= 0 and got["cost s"] >= point["once s"] - 1e-12
    plan = scale_llama.part_plan(tiny, 60, layers=2)  # OPTIMAL in about a second
    table = offload_llama.table({"point": point, "plan": plan})
    assert len(table.splitlines()) == 2 + len(offload_llama.SAC_ROWS) + 2 * 2
    assert "| remat + offload (pcie5) | 90% of checkpoint-all" in table


def test_remat_fit_with_the_link_at_a_tiny_llama(tiny):
    """At sequence 8192 a batch row's float32 logits (4 GiB) and their gradient's set the
    one-line floor: the fit with the link is proven where keep/recompute's is."""
    found = scale_fit.remat_fit(  # proven by the floor in about 10 s: the limit is a margin
        "batch", 120, "module", layers=1, offload=offload_llama.LINK, name=tiny, memory=40 << 30
    )
    assert found["proven"] and found["upper"] == found["largest"] + 1
    assert found["host peak"] == 0  # keep/recompute's schedule at the answer copies nothing
    assert "offload over d2h 64 GB/s, h2d 64 GB/s" in found["summary"]
