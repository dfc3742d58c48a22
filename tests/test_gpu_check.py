"""`python -m benchmarks.gpu_check` on the CPU (``--quick``, the GPT-2 model): the table's
structure (every runtime a cell; each a result or a refusal with its reason) and its numbers
(measured peaks against predicted where the CPU measures exactly, host bytes, gradients)."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.gpu_check import RUNTIMES

pytest.importorskip("transformers")

GENERATOR_STATE_BYTES = 5056
"""The CPU generator's saved state, charged by the own executor's model at every random node
and not allocated by the step (docs/executor.md): a dropout model's measured peak may lie this
far under the predicted one."""


@pytest.fixture(scope="module")
def table(tmp_path_factory: pytest.TempPathFactory) -> dict:
    out = tmp_path_factory.mktemp("gpu_check")
    command = [sys.executable, "-m", "benchmarks.gpu_check", "--device", "cpu", "--quick"]
    # twice the phase limits: CI runs this beside another pytest worker on two cores
    command += ["--models", "gpt2", "--steps", "2", "--limit-scale", "2", "--out", str(out)]
    # the published link: a link measured on loaded cores can make offload not pay, and the
    # host bytes below are checked where the plans copy something
    command += ["--link", "h100"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    root = Path(__file__).resolve().parents[1]
    done = subprocess.run(command, capture_output=True, text=True, timeout=420, cwd=root, env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    markdown = (out / "gpu_check.md").read_text()
    return {"markdown": markdown, **json.loads((out / "gpu_check.json").read_text())}


def cells(table: dict) -> dict[str, dict]:
    return {c["runtime"]: c for c in table["cells"]}


def test_every_runtime_is_a_result_or_a_refusal_with_its_reason(table: dict) -> None:
    by_runtime = cells(table)
    assert list(by_runtime) == list(RUNTIMES)
    for cell in by_runtime.values():
        assert cell["result"] == "ok" or cell["result"].startswith("refused: "), cell
        if cell["result"] != "ok":
            assert len(cell["result"]) > len("refused: ") + 10, cell
    refused = by_runtime["compile+offload"]["result"]
    assert refused.startswith("refused: CompileError") and "pinned host memory" in refused
    rows = [line for line in table["markdown"].splitlines() if line.startswith("| gpt2 |")]
    assert len(rows) == len(RUNTIMES)
    assert any("published figure" in line for line in table["header"])


def test_the_link_is_measured_on_the_device_and_read_by_path(tmp_path: Path) -> None:
    """``--link measured`` (the default): the link measured on the device, saved as a device
    file the workers read by path, and the header gives it beside the published figure."""
    from benchmarks.gpu_check import describe, measure_link
    from solver.target.devices import named_link

    args = argparse.Namespace(
        device="cpu", target="h100", quick=True, out=tmp_path, link="measured", models=["gpt2"]
    )
    args.argv, args.limit_scale = ["--device", "cpu", "--quick"], 1.0
    path = measure_link(args)
    link = named_link(str(path))
    assert path == tmp_path / "link.json" and link.d2h > 0 and link.h2d > 0
    line = next(line for line in describe(args, path) if line.startswith("- link "))
    assert f"{link.d2h / 1e9:g} GB/s device-to-host" in line and "measured here" in line
    assert "published figure: 64 and 64 GB/s" in line


def test_runs_that_ran_are_bit_equal_and_measured(table: dict) -> None:
    for cell in cells(table).values():
        if cell["result"] != "ok":
            continue
        assert cell["grads"] == "bit-equal", cell  # the CPU compiles with aot_eager
        assert cell["measured_peak"] > 0 and 0 < cell["measured_s"] < 10, cell
        assert cell["predicted_s"] > 0, cell
        if cell["runtime"] != "eager":
            assert cell["status"] in ("OPTIMAL", "FEASIBLE"), cell
            assert cell["measured_peak"] <= cell["budget"], cell


def test_measured_peaks_and_host_bytes_match_the_predicted_ones(table: dict) -> None:
    by_runtime = cells(table)
    for runtime in ("remat", "remat+offload"):
        cell = by_runtime[runtime]
        assert cell["result"] == "ok", cell
        slack = cell["predicted_peak"] - cell["measured_peak"]
        assert 0 <= slack <= 2 * GENERATOR_STATE_BYTES, cell  # two dropout sites in a block
    assert (
        by_runtime["remat+offload"]["host_measured"]
        == by_runtime["remat+offload"]["host_predicted"]
    )
    for runtime in ("sac", "sac+offload"):
        cell = by_runtime[runtime]
        assert cell["result"] == "ok", cell
        assert abs(cell["measured_peak"] / cell["predicted_peak"] - 1) <= 0.001, cell
    offloaded = by_runtime["sac+offload"]
    assert offloaded["host_measured"] == offloaded["host_predicted"] > 0, offloaded
