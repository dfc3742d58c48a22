"""The device model: built-in targets, rounding, roofline seconds, device files, op costs."""

import json

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from graph_capture.measurement.roofline import (
    bytes_moved,
    is_view,
    op_flops,
    op_seconds,
    resolve_target,
    target_key,
)
from solver.target import Device, UnknownTargetError, builtin_device
from solver.target.devices import GIB, LAUNCH_SECONDS, MIB, NCCL_COMMUNICATOR_BYTES, OUTSIDE_BYTES


def test_builtin_names_and_rounding():
    h100 = builtin_device("H100")
    assert builtin_device("h100-sxm") is h100
    assert [h100.round_bytes(n) for n in (0, 1, 512, 513)] == [0, 512, 512, 1024]
    with pytest.raises(UnknownTargetError, match=r"unknown target 'tpu'.*h100"):
        builtin_device("tpu")


def test_usable_memory_is_the_capacity_less_what_the_process_holds_outside_pytorch():
    a100 = builtin_device("a100-80gb")
    assert a100.memory == 81_920 * MIB  # nvidia-smi's
    assert a100.total == round(79.25 * 1024) * MIB  # an OOM message's "total capacity"
    assert a100.usable() == a100.total - OUTSIDE_BYTES
    assert a100.usable(1) == a100.total - OUTSIDE_BYTES - NCCL_COMMUNICATOR_BYTES
    assert "78.11 GiB usable (capacity 79.25 GiB less" in a100.describe_usable(1)
    for name in ("h100", "h100-96gb", "a100-40gb", "l4", "rtx4090"):
        d = builtin_device(name)
        assert 0 < d.usable(1) < d.usable() < d.total < d.memory, name
    plain = Device("toy", {"float32": 1.0}, 1.0, memory=GIB)  # no capacity given: memory
    assert (plain.total, plain.usable(), plain.to_json()["capacity"]) == (GIB, GIB, None)
    with pytest.raises(ValueError, match=r"outside \(2 B\) must be at least 0 and less than"):
        Device("toy", {"float32": 1.0}, 1.0, memory=GIB, capacity=2, outside=2)


def test_roofline_is_the_larger_bound_and_a_measured_op_wins():
    d = Device("toy", {"float32": 100.0, "bfloat16": 400.0}, bandwidth=10.0, memory=1 << 30)
    assert d.roofline_seconds(1000, 10, "float32") == 10.0  # compute bound
    assert d.roofline_seconds(1000, 10, "bfloat16") == 2.5
    assert d.roofline_seconds(10, 1000, "bfloat16") == 100.0  # memory bound
    assert d.roofline_seconds(1000, 0, "int64") == 10.0  # unlisted dtype: the float32 rate
    measured = Device("toy", d.flops, 10.0, 1 << 30, op_seconds={"op(x)": 0.5})
    assert measured.seconds("op(x)", 1000, 10, "float32") == 0.5
    assert measured.seconds("other(x)", 1000, 10, "float32") == 10.0
    fixed = Device("toy", d.flops, 10.0, 1 << 30, op_seconds={"op(x)": 0.5}, op_overhead=1.0)
    assert fixed.seconds("other(x)", 1000, 10, "float32") == 11.0  # max(compute, memory) + fixed
    assert fixed.seconds("op(x)", 1000, 10, "float32") == 0.5  # measured: the fixed part in it


def test_cpu_pays_its_measured_seconds_per_op():
    cpu = resolve_target("cpu")
    assert cpu.kernels == "cpu" and 0 < cpu.op_overhead < 1e-3
    assert cpu.roofline_seconds(0, 0, "float32") == cpu.op_overhead


def test_device_file_round_trip(tmp_path):
    d = Device(
        "mine",
        {"float32": 1e12},
        1e11,
        1 << 34,
        rounding=256,
        op_seconds={"k": 1e-3},
        op_overhead=2e-6,
        kernels="cpu",
        op_transient={"k": 4096},
        capacity=1 << 33,
        outside=1 << 20,
    )
    d.save(tmp_path / "mine.json")
    assert Device.load(tmp_path / "mine.json") == d
    assert Device.load(tmp_path / "mine.json").usable() == (1 << 33) - (1 << 20)
    old = {**d.to_json(), "format": "remat-device/1", "name": "cpu"}
    for key in ("op_overhead", "kernels", "op_transient", "capacity", "outside"):
        del old[key]
    (tmp_path / "v1.json").write_text(json.dumps(old))
    v1 = Device.load(tmp_path / "v1.json")
    assert (v1.op_overhead, v1.kernels, v1.op_transient) == (0.0, "cpu", {})
    assert (v1.capacity, v1.outside, v1.usable()) == (None, 0, 1 << 34)  # memory, as written
    assert resolve_target(str(tmp_path / "mine.json")) == d
    (tmp_path / "bad.json").write_text('{"format": "other"}')
    with pytest.raises(UnknownTargetError, match="not a remat device file"):
        Device.load(tmp_path / "bad.json")


def test_op_costs_on_fake_tensors():
    mm = torch.ops.aten.mm.default
    with FakeTensorMode():
        a, b = torch.empty(64, 128), torch.empty(128, 32)
        out = mm(a, b)
        flops, moved = op_flops(mm, (a, b), {}, out), bytes_moved((a, b), {}, out)
        add = torch.ops.aten.add.Tensor
        same = add(a, a)
        assert bytes_moved((a, a), {}, same) == 2 * a.numel() * 4  # one input storage, one output
        assert op_flops(add, (a, a), {}, same) == 0
    assert flops == 2 * 64 * 128 * 32
    assert moved == (64 * 128 + 128 * 32 + 64 * 32) * 4
    h100 = builtin_device("h100")
    with FakeTensorMode():
        a, b = torch.empty(64, 128), torch.empty(128, 32)
        seconds = op_seconds(h100, mm, (a, b), {}, mm(a, b))
    roofline = max(flops / h100.flops["float32"], moved / h100.bandwidth)
    assert seconds == roofline + h100.op_overhead and h100.op_overhead == LAUNCH_SECONDS


def test_a_view_moves_no_bytes_and_launches_no_kernel():
    aten = torch.ops.aten
    h100 = builtin_device("h100")
    cpu_like = Device("toy", {"float32": 1e12}, 1e11, 1 << 30, op_overhead=2e-6, kernels="cpu")
    with FakeTensorMode():
        big = torch.empty(4096, 4096)
        views = [
            (aten.view.default, (big, [16, 1024, 1024])),
            (aten.t.default, (big,)),
            (aten._unsafe_view.default, (big, [4096 * 4096])),
            (aten.expand.default, (torch.empty(1, 4096), [4096, 4096])),
            (aten.reshape.default, (big, [4096 * 4096])),  # contiguous: a view
        ]
        for func, args in views:
            out = func(*args)
            assert is_view(func, args, {}, out), func
            assert op_seconds(h100, func, args, {}, out) == 0.0, func
            assert op_seconds(cpu_like, func, args, {}, out) == 2e-6, func  # in-line dispatch
        flat = aten.reshape.default(big.t(), [4096 * 4096])  # not viewable: reshape copies
        assert not is_view(aten.reshape.default, (big.t(), [4096 * 4096]), {}, flat)
        seconds = op_seconds(h100, aten.reshape.default, (big.t(), [4096 * 4096]), {}, flat)
        assert seconds == 2 * big.numel() * 4 / h100.bandwidth + LAUNCH_SECONDS
        key = target_key(aten.t.default, (big,), {})
    calibrated = Device("cal", {"float32": 1e12}, 1e11, 1 << 30, op_seconds={key: 3e-7})
    assert calibrated.view_seconds(key) == 3e-7  # a measured table wins
    assert calibrated.view_seconds("other") == 0.0


def test_cpu_fused_attention_counts_the_flash_kernels_flops():
    aten = torch.ops.aten
    with FakeTensorMode():
        q = torch.empty(1, 2, 16, 8)
        out = aten._scaled_dot_product_flash_attention_for_cpu(q, q, q, 0.0, True)
        flops = op_flops(
            aten._scaled_dot_product_flash_attention_for_cpu.default, (q, q, q), {}, out
        )
    assert flops == 4 * 2 * 16 * 16 * 8  # QK^T and PV: 2 matmuls of 2*16*16*8 multiply-adds
