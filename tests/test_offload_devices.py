"""One device per plan: `remat solve --offload` pairs a host link with the seconds of the device
it is attached to (docs/offload.md, "Devices"), read from the graph's attributes `target`
(estimate mode), `device` (a measured capture) and `cost_model`."""

from __future__ import annotations

import pytest

from cli.main import main
from solver.core.link import Link
from solver.examples import residual_demo
from solver.io import load_graph, save_graph
from solver.target.devices import Device

SOLVE = ["--budget", "80%", "--time-limit", "10", "--quiet", "--no-baselines"]

CPU_FILE = "cpu.json"
GPU_FILE = "h100.json"
"""Device files (written in each test's directory): this CPU's, and an H100's with a measured
link (as `remat calibrate` and `remat calibrate --base h100` write them)."""


def _device_files(directory) -> None:
    Device(
        "cpu",
        {"float32": 1e11},
        bandwidth=1e10,
        memory=1 << 40,
        rounding=1,
        kernels="cpu",
        host_link=Link(2e10, 3e10),
    ).save(directory / CPU_FILE)
    Device(
        "h100", {"float32": 6e13}, bandwidth=3e12, memory=80 << 30, host_link=Link(5e10, 5e10)
    ).save(directory / GPU_FILE)


PAIRED = [
    ({"device": "cpu"}, "25,20", "offload link: d2h 25 GB/s, h2d 20 GB/s (10^9 bytes per unit"),
    (
        {"device": "cpu"},
        CPU_FILE,
        "cpu's host link, d2h 20 GB/s, h2d 30 GB/s; the graph's seconds measured on cpu",
    ),
    (
        {"device": "cuda"},
        "h100",
        "h100's host link, d2h 64 GB/s, h2d 64 GB/s; the graph's seconds measured on cuda",
    ),
    ({"device": "cuda"}, "pcie4", "a GPU's host link, d2h 32 GB/s"),
    ({"target": "h100"}, "h100", "the graph's seconds predicted for h100"),
    ({"target": "h100"}, "h100-sxm", "the graph's seconds predicted for h100"),
    ({"target": "h100"}, GPU_FILE, "h100's host link, d2h 50 GB/s"),
    ({"target": "a100-80gb"}, "pcie4", "the graph's seconds predicted for a100-80gb"),
    ({"target": "cpu"}, CPU_FILE, "the graph's seconds predicted for cpu"),
    ({}, "h100", "taken per unit of the graph's costs (the graph does not say which device's"),
]
"""(graph attributes, --offload, the header's pairing line): links that pair with the graph."""

REFUSED = [
    ({"device": "cpu"}, "h100", "add --target h100 to the capture"),
    ({"device": "cpu", "cost_model": "time"}, GPU_FILE, "add --target h100 to the capture"),
    ({"device": "cpu"}, "pcie5", "add --target GPU (one of h100, "),
    ({"device": "cuda"}, CPU_FILE, "give a GPU's link (pcie5, pcie4, c2c"),
    ({"target": "h100"}, "a100", "give --offload h100 (or a bus: pcie5, pcie4, c2c) to pair"),
    ({"target": "h100"}, CPU_FILE, "give --offload h100"),
    ({"target": "cpu"}, "pcie5", "the device file of `remat calibrate` for cpu"),
    ({"device": "cpu", "cost_model": "flops"}, "h100", "this graph's costs are FLOPs"),
]
"""(graph attributes, --offload, what the refusal says to do): links of another device."""


def _graph_file(directory, attributes: dict[str, str]):
    graph = residual_demo(blocks=2)
    graph.graph.update(attributes)
    path = directory / "g.json"
    save_graph(graph, path)
    assert {k: load_graph(path).graph.get(k) for k in attributes} == attributes  # kept
    return path


def _offload(directory, offload: str) -> str:
    return str(directory / offload) if offload.endswith(".json") else offload


@pytest.mark.parametrize(("attributes", "offload", "line"), PAIRED)
def test_a_link_of_the_device_whose_seconds_the_graph_has_is_solved_and_named(
    tmp_path, capsys, attributes, offload, line
):
    _device_files(tmp_path)
    path = _graph_file(tmp_path, attributes)
    assert main(["solve", str(path), *SOLVE, "--offload", _offload(tmp_path, offload)]) == 0
    out = capsys.readouterr().out
    header = next(text for text in out.splitlines() if text.startswith("offload link: "))
    assert line in header
    assert "exact + offload" in out


@pytest.mark.parametrize(("attributes", "offload", "advice"), REFUSED)
def test_a_link_of_another_device_is_refused_in_one_line_saying_what_to_give(
    tmp_path, capsys, attributes, offload, advice
):
    _device_files(tmp_path)
    path = _graph_file(tmp_path, attributes)
    assert main(["solve", str(path), *SOLVE, "--offload", _offload(tmp_path, offload)]) == 2
    captured = capsys.readouterr()
    assert captured.err.count("\n") == 1 and captured.err.startswith("remat: error: --offload ")
    assert advice in captured.err and "or D2H,H2D in 10^9 bytes per unit" in captured.err
    assert "exact" not in captured.out


def test_target_on_a_graph_that_is_not_captured_is_refused(tmp_path, capsys):
    path = _graph_file(tmp_path, {"device": "cpu"})
    assert main(["solve", str(path), *SOLVE, "--target", "h100"]) == 2
    err = capsys.readouterr().err
    assert f"the graph file {path} is not captured" in err and err.count("\n") == 1
    assert main(["solve", "--demo", "residual", *SOLVE, "--target", "h100"]) == 2
    assert "the demo graph residual is not captured" in capsys.readouterr().err


def test_a_cpu_capture_refuses_a_gpu_link_and_its_estimate_takes_it(tmp_path, capsys):
    """The issue's command on a small model: measured on this CPU, `--offload h100` is refused
    with the fix; with `--target h100` the plan pairs the H100's seconds with its link. The
    capture records the device, the cost model and the target, and a saved graph keeps them."""
    model = ["solve", "--model", "sac_models:small", *SOLVE]
    assert main([*model, "--offload", "h100"]) == 2
    err = capsys.readouterr().err.splitlines()[-1]
    assert "this graph's seconds are measured on cpu: add --target h100 to the capture" in err
    assert main([*model, "--offload", "h100", "--target", "h100"]) == 0
    out = capsys.readouterr().out
    assert (
        "offload link: h100's host link, d2h 64 GB/s, h2d 64 GB/s; the graph's seconds "
        "predicted for h100" in out
    )
