"""The FSDP2 memory model's arithmetic (`solver.target.fsdp`) against numbers computed by hand.

Two blocks of parameters (8, 4) and (8,), a root of (10, 4), two ranks. Per group, fp32: the
padded shard is 4x4 + 4 = 20 elements (root: 5x4), so the all-gather output is 2 x 20 x 4 =
160 bytes, the unsharded parameters 160, the reduce-scatter input 160 and output 80, the
unsharded gradients 160. The 2-rank gloo run against real FSDP2 is
`benchmarks.planning.fsdp_memory`.
"""

from __future__ import annotations

import dataclasses

import pytest

from solver.target import (
    FsdpPolicy,
    StepWindows,
    activation_budget,
    activation_budgets,
    fsdp_memory,
    predict_peak,
)

BLOCKS = [[(8, 4), (8,)], [(8, 4), (8,)]]
ROOT = [(10, 4)]


def _at(memory, window: str, level: str) -> list[int]:
    return [m.fsdp_bytes for m in memory.moments if (m.window, m.level) == (window, level)]


def test_resident_bytes_are_padded_shards_and_adamw_state():
    m = fsdp_memory(BLOCKS, ROOT, FsdpPolicy(2))
    assert m.resident_parts == {"sharded params": 3 * 80, "optimizer state": 2 * 3 * 80}
    assert m.after == 3 * 80  # the sharded gradients
    assert m.unsharded_grads == (160, 160, 160)
    counters = fsdp_memory(BLOCKS, ROOT, FsdpPolicy(2, step_counters_on_device=True))
    assert counters.resident == m.resident + 5 * 4  # one float32 `step` per parameter
    # (5, 3) over 2 ranks: shards of 3 rows, padded; rank 1 holds 2 rows of optimizer state
    odd = [fsdp_memory([], [(5, 3)], FsdpPolicy(2, rank=r, optimizer="adamw")) for r in (0, 1)]
    assert [o.resident_parts["sharded params"] for o in odd] == [36, 36]
    assert [o.resident_parts["optimizer state"] for o in odd] == [72, 48]
    sgd = fsdp_memory(BLOCKS, ROOT, FsdpPolicy(2, optimizer="sgd_momentum"))
    assert sgd.resident_parts["optimizer state"] == 3 * 80
    assert fsdp_memory(BLOCKS, ROOT, FsdpPolicy(2, optimizer="sgd")).resident == 240


def test_moments_follow_torch_order():
    m = fsdp_memory(BLOCKS, ROOT, FsdpPolicy(2))
    # block 0's all-gather beside the root's held output, then its copy-out
    assert _at(m, "forward 0", "start") == [160 + 160 + 160, 160 + 160 + 160]
    assert _at(m, "between 0", "peak") == [160 + 160]  # unsharded root, block 0's output held
    # block 0's pre-backward: copy-out beside block 1's reduce-scatter input and sharded grads,
    # block 1's unsharded gradients freed
    assert _at(m, "backward 0", "start") == [160 + 160 - 160 + 80 + 160 + 160]
    assert m.max_fsdp_bytes() == 560
    kept = fsdp_memory(BLOCKS, ROOT, FsdpPolicy(2, reshard_after_forward=False))
    assert _at(kept, "between 0", "peak") == [160 + 160 + 160]  # block 0 stays unsharded
    assert _at(kept, "backward 1", "start") == []  # nothing to gather in backward
    assert kept.max_fsdp_bytes("backward 1") == 160 * 3
    gloo = fsdp_memory(BLOCKS, ROOT, FsdpPolicy(2, backend="gloo"))
    assert _at(gloo, "forward 0", "start")[0] == 480 + 160  # its copy of the output
    assert _at(gloo, "backward 1", "end")[1] == _at(m, "backward 1", "end")[1] + 160


def test_mixed_precision_and_rounding():
    bf16 = FsdpPolicy(2, param_dtype="bfloat16", reduce_dtype="float32")
    m = fsdp_memory(BLOCKS, ROOT, bf16)
    # copy-in 40 and all-gather 80 (bf16) beside the root's held 80 and unsharded 80
    assert _at(m, "forward 0", "start")[0] == 80 + 80 + 80 + 40
    assert m.unsharded_grads == (80, 80, 80)
    # reduce in fp32: input 160; output 80 is the sharded gradient (no cast)
    assert _at(m, "backward 1", "end") == [80 + 80 + 160, 80 + 80 + 160 - 80 + 80]
    cast = fsdp_memory(BLOCKS, ROOT, FsdpPolicy(2, param_dtype="bfloat16"))
    # reduce in bf16: input 80, output 40, then its fp32 cast 80 beside it
    assert _at(cast, "backward 1", "end")[-1] == 80 + 80 + 80 - 80 + 40 + 80
    assert cast.after == 3 * 80
    rounded = fsdp_memory(BLOCKS, ROOT, FsdpPolicy(2, rounding=512))
    assert rounded.resident_parts["sharded params"] == 2 * 2 * 512 + 512
    # unsharded root (one parameter), block 0's all-gather output, its two parameters unsharded
    assert _at(rounded, "forward 0", "start")[1] == 512 + 512 + 2 * 512
    one = fsdp_memory(BLOCKS, ROOT, FsdpPolicy(1))  # nothing gathered: the copies into U only
    assert one.max_fsdp_bytes("forward 0") == 160 + 160


def test_peak_and_budgets_combine_windows():
    m = fsdp_memory(BLOCKS, ROOT, FsdpPolicy(2))
    w = StepWindows(
        f_start=(10, 20),
        f_peak=(15, 25),
        b_start=(400, 300),
        b_peak=(450, 350),
        before=5,
        between=(20,),
        head=290,
        end=320,
    )
    p = predict_peak(m, w)
    assert (p.step_peak, p.window, p.level) == (400 + 560, "backward 0", "start")
    assert p.peak == m.resident + 960
    assert p.windows["forward 1"] == 25 + 480
    assert p.windows["backward 0"] == 960
    cut = dataclasses.replace(w, backward_start=250, root_b_start=330, root_b_peak=340)
    assert cut.level("head", "start", 0) == 250 and cut.level("head", "peak", 0) == 290
    assert cut.level("backward 0", "end", 0) == 330 and w.level("backward 0", "end", 0) == 450
    assert cut.level("root backward", "peak", 0) == 340
    assert w.level("root backward", "end", 7) == 320
    budgets = activation_budgets(m, 10_000)
    assert budgets["backward 0"] == 10_000 - 720 - 560
    assert activation_budget(m, 10_000) == 10_000 - 720 - 560
    with pytest.raises(ValueError, match="unequal length"):
        StepWindows((1,), (1,), (1,), (1, 2), before=0, between=(), head=0)
    with pytest.raises(ValueError, match="dim 0"):
        fsdp_memory([[()]], [], FsdpPolicy(2))
    with pytest.raises(ValueError, match="unknown dtype"):
        FsdpPolicy(2, param_dtype="bf16")
