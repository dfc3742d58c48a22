"""`python -m benchmarks.gpu_check` on the CPU (``--quick``, the GPT-2 model): the table's
structure (every runtime a cell; each a result or a refusal with its reason in one line), its
header (the deterministic settings, the structure step), eager's repeat, the offload cells'
copies, and its numbers (measured peaks against predicted where the CPU measures exactly,
host bytes, gradients)."""

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
    command += ["--max-seconds", "2000"]  # the scaled limits: more than the 10 minutes
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
            assert "\n" not in cell["result"], cell  # one line
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
    args.compile_models = ["gpt2"]
    path = measure_link(args)
    link = named_link(str(path))
    assert path == tmp_path / "link.json" and link.d2h > 0 and link.h2d > 0
    line = next(line for line in describe(args, path, "not run") if line.startswith("- link "))
    assert f"{link.d2h / 1e9:g} GB/s device-to-host" in line and "measured here" in line
    assert "published figure: 64 and 64 GB/s" in line


def test_runs_that_ran_are_bit_equal_and_measured(table: dict) -> None:
    for cell in cells(table).values():
        if cell["result"] != "ok":
            continue
        if cell["runtime"] != "eager":  # eager's is its repeat's
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
        by_runtime["remat+offload"]["measured_host_peak"]
        == by_runtime["remat+offload"]["predicted_host_peak"]
    )
    for runtime in ("sac", "sac+offload"):
        cell = by_runtime[runtime]
        assert cell["result"] == "ok", cell
        assert abs(cell["measured_peak"] / cell["predicted_peak"] - 1) <= 0.001, cell
    offloaded = by_runtime["sac+offload"]
    assert offloaded["measured_host_peak"] == offloaded["predicted_host_peak"] > 0, offloaded


def test_the_header_names_the_deterministic_settings_and_the_structure_step(table: dict) -> None:
    line = next(x for x in table["header"] if x.startswith("- deterministic: "))
    for setting in (
        "torch.use_deterministic_algorithms(True)",
        "CUBLAS_WORKSPACE_CONFIG=:4096:8",
        "torch.backends.cudnn.deterministic=True",
        "torch.backends.cudnn.benchmark=False",
    ):
        assert setting in line
    structure = next(x for x in table["header"] if x.startswith("- structure: "))
    assert structure == (
        "- structure: not run: --device cpu (the `cuda` tests skip without a CUDA device)"
    )
    assert all(x in table["markdown"] for x in table["header"])


def test_eager_repeat_is_reported(table: dict) -> None:
    assert cells(table)["eager"]["grads"] == "repeats bit for bit"


def test_every_offload_cell_moves_a_copy_or_says_why_it_cannot(table: dict) -> None:
    """Each offload cell's budget is below keep/recompute's least peak: its plan moves copies
    (counted, with host bytes); compile+offload's ops need an accelerator, and its cell says
    so in one line."""
    by_runtime = cells(table)
    for runtime in ("remat+offload", "sac+offload"):
        cell = by_runtime[runtime]
        assert cell["result"] == "ok" and cell["copies"] > 0, cell
        assert cell["predicted_host_peak"] > 0 and cell["measured_host_peak"] > 0, cell
        assert cell["budget"] < by_runtime[runtime.removesuffix("+offload")]["predicted_peak"]
    sac = by_runtime["sac+offload"]["moved"]
    assert "per copy, measured on the device (cpu)" in sac and "regions parked" in sac
    refused = by_runtime["compile+offload"]["result"]
    assert refused.startswith("refused: ") and "accelerator" in refused and "\n" not in refused


def test_pytest_summary_counts_and_first_failure() -> None:
    from benchmarks.gpu_check.driver import pytest_summary

    out = (
        "FAILED tests/test_x.py::test_a - AssertionError: no\n1 failed, 2 passed, 3 skipped in 1.0s"
    )
    line, failed = pytest_summary(out, 1)
    assert failed and line == (
        "`pytest -m 'cuda and not long'`: 2 passed, 1 failed, 3 skipped, 0 errors (exit status "
        "1); first: "
        "FAILED tests/test_x.py::test_a - AssertionError: no"
    )
    line, failed = pytest_summary("no tests ran in 0.1s", 5)  # none marked cuda selected
    assert not failed and line.startswith("`pytest -m 'cuda and not long'`: 0 passed, 0 failed")


def test_the_structure_step_leaves_the_inductor_compiling_cuda_test_to_the_compile_cells() -> None:
    """The structure step's 40 s hold the collection and the short CUDA tests; the compile
    offload test's five inductor compiles take minutes: it is marked `long`, which the step's
    expression leaves out, and every other CUDA test is selected."""
    import ast
    from pathlib import Path

    from _pytest.mark.expression import Expression

    from benchmarks.gpu_check.spec import STRUCTURE_TESTS

    selects = Expression.compile(STRUCTURE_TESTS)
    selected, left = [], []
    for path in sorted(Path(__file__).parent.glob("test_*.py")):
        for node in ast.parse(path.read_text()).body:
            if not isinstance(node, ast.FunctionDef):
                continue
            marks = {
                d.attr if isinstance(d, ast.Attribute) else getattr(d.func, "attr", None)
                for d in node.decorator_list
                if isinstance(d, ast.Attribute | ast.Call)
            }
            if "cuda" in marks:
                chosen = selects.evaluate(lambda name, marks=marks: name in marks)
                (selected if chosen else left).append(node.name)
    assert left == ["test_compile_offload_on_cuda_matches_torch_within_its_predicted_peak"]
    assert len(selected) >= 5


def test_a_runtime_that_differs_is_wrong_only_where_eager_repeats_itself() -> None:
    """Eager repeating itself: any difference is WRONG (`Mismatch`); eager not repeating
    itself: a difference within eager's own spread passes, beyond it is `Unsure`."""
    import torch

    from benchmarks.gpu_check.spec import Mismatch, Run, Unsure
    from benchmarks.zoo import Bench

    class Scale(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = torch.nn.Parameter(torch.ones(4))
            self.nudge = 0.0

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return ((self.w + self.nudge) * x).sum()

    model = Scale()
    bench = Bench(model, (torch.arange(4.0),), [])
    run = Run("t", bench, torch.device("cpu"), "h100", None, "aot_eager", 1, 1.0)
    run.reference_and_repeat()
    assert run.repeats is None and run.check(model, model, exact=True) == "bit-equal"
    model.nudge = 1e-3
    with pytest.raises(Mismatch, match="loss differs"):
        run.check(model, model, exact=True)
    run.repeats = "loss differs"  # as if eager's second step had differed by its spread
    run.spread = dict.fromkeys(run.spread, 1.0)
    assert run.check(model, model, exact=True).startswith("within eager's spread")
    run.spread = dict.fromkeys(run.spread, 1e-6)
    with pytest.raises(Unsure, match="beyond eager's own spread"):
        run.check(model, model, exact=True)


def test_the_own_executor_cells_start_from_the_pristine_buffers() -> None:
    """The own executor's cells share the captured model: each starts from its buffers as
    captured, not as the cell before left them (BatchNorm's running statistics advance with
    every step), so a second cell is not WRONG with remat blameless."""
    import torch
    from torch import nn

    from benchmarks.gpu_check.cells import CELLS, capture_phase, guarded, setup
    from benchmarks.gpu_check.spec import Cell, Run
    from benchmarks.zoo import Bench

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layers = nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.Tanh())
            self.head = nn.Linear(16, 1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.head(self.layers(x)).square().mean()

    torch.manual_seed(0)
    bench = Bench(Net().train(), (torch.randn(4, 8),), [])
    run = Run("net", bench, torch.device("cpu"), "h100", "aot_eager", 1, 0.2)
    setup(run)
    assert (
        guarded(run, Cell("net", "capture"), "capture", lambda: capture_phase(run)).result == "ok"
    )
    for _ in range(2):
        cell = Cell("net", "remat")
        done = guarded(run, cell, "remat", lambda c=cell: CELLS["remat"](run, c))
        assert done.result == "ok" and done.grads == "bit-equal", done
