"""The host link measured by `remat calibrate` (`graph_capture.measurement.link`), stored in the
device file and used by name wherever a link is taken (`--offload FILE`, `offload="FILE"`)."""

from __future__ import annotations

import json
import math

import pytest
import torch

import solver
from cli.main import main
from graph_capture.measurement.link import (
    MIN_LINK_BYTES,
    fit_copy_times,
    link_sizes,
    measure_host_link,
)
from solver.core.link import Link, LinkError
from solver.examples import residual_demo
from solver.target.devices import Device, UnknownTargetError, builtin_device, named_link

pytestmark = pytest.mark.usefixtures("one_thread")

SMALL = 1 << 20


def test_the_cpu_link_is_a_positive_rate_and_a_latency_each_way_with_no_host_limit():
    link = measure_host_link("cpu", SMALL, repeats=3)
    for rate in (link.d2h, link.h2d):
        assert math.isfinite(rate) and rate > 0
    for latency in (link.d2h_latency, link.h2d_latency):
        assert math.isfinite(latency) and 0 <= latency < 1e-3
    assert link.host_memory is None and link.duplex
    assert link.offload_time(SMALL) == pytest.approx(link.d2h_latency + SMALL / link.d2h)


def test_the_copy_sizes_run_from_a_kibibyte_to_the_largest_in_fourfold_steps():
    assert link_sizes(64 << 20) == [1 << k for k in range(10, 27, 2)]
    assert link_sizes(3000) == [MIN_LINK_BYTES, 3000]
    with pytest.raises(ValueError, match="at least 2048 bytes"):
        link_sizes(2047)


def test_the_fit_recovers_a_known_latency_and_bandwidth_from_synthetic_timings():
    sizes = link_sizes(64 << 20)
    latency, bandwidth = 7e-6, 25e9
    exact = [latency + n / bandwidth for n in sizes]
    assert fit_copy_times(sizes, exact) == (pytest.approx(latency), pytest.approx(bandwidth))
    noisy = [t * (1 + 0.03 * (-1) ** i) for i, t in enumerate(exact)]  # +-3% per size
    fitted = fit_copy_times(sizes, noisy)
    assert fitted == (pytest.approx(latency, rel=0.05), pytest.approx(bandwidth, rel=0.05))
    # a free fit below 0 (timer noise on a fast copy): the latency is held at 0
    held = fit_copy_times([1024, 2048, 4096], [0.9e-7, 2e-7, 4e-7])
    assert held[0] == 0 and held[1] == pytest.approx(1024 / 1e-7, rel=0.05)
    with pytest.raises(ValueError, match="do not grow with the size"):
        fit_copy_times([1024, 4096], [2e-6, 1e-6])


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal where CUDA is absent")
def test_a_cuda_link_without_cuda_is_refused_in_one_line():
    with pytest.raises(ValueError, match="no CUDA device here") as info:
        measure_host_link("cuda", SMALL)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(("where", "nbytes"), [("meta", SMALL), ("cpu", 0)])
def test_other_devices_and_empty_copies_are_refused(where, nbytes):
    with pytest.raises(ValueError):
        measure_host_link(where, nbytes)


def test_calibrate_writes_the_measured_link_and_solve_uses_it(tmp_path, capsys):
    path = tmp_path / "cpu.json"
    args = ["calibrate", "--model", "sac_models:small", "--out", str(path)]
    assert main([*args, "--link-bytes", str(SMALL)]) == 0
    assert "host link measured d2h" in capsys.readouterr().err
    link = Device.from_json(json.loads(path.read_text())).host_link
    assert isinstance(link, Link) and link.d2h > 0 and link.h2d > 0
    assert named_link(str(path)) == link
    graph = residual_demo()
    assert solver.solve(graph, "80%", offload=str(path), time_limit=10).link == link
    solve = ["solve", "--demo", "residual", "--budget", "80%", "--time-limit", "10", "--quiet"]
    assert main([*solve, "--offload", str(path), "--no-baselines"]) == 0
    assert f"offload over d2h {link.d2h / 1e9:g}"[:24] in capsys.readouterr().out


def test_a_device_file_without_a_link_is_refused_with_what_to_do(tmp_path):
    path = tmp_path / "bare.json"
    Device("bare", {"float32": 1e12}, bandwidth=1e11, memory=1 << 30).save(path)
    with pytest.raises(LinkError, match="remat calibrate"):
        named_link(str(path))
    with pytest.raises(UnknownTargetError, match="cannot read device file"):
        named_link(str(tmp_path / "missing.json"))


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal where CUDA is absent")
def test_calibrate_base_needs_cuda_and_no_models(tmp_path, capsys):
    out = str(tmp_path / "h100.json")
    assert main(["calibrate", "--base", "h100", "--out", out]) == 2
    assert "no CUDA device: run it on the GPU machine" in capsys.readouterr().err
    assert main(["calibrate", "--base", "h100", "--demo", "gpt", "--out", out]) == 2
    assert "drop --model/--demo" in capsys.readouterr().err
    assert builtin_device("h100").host_link == named_link("h100")
