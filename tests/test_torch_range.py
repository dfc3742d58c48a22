"""The torch range remat supports: one range in pyproject.toml, graph_capture.torch_range and
.ci/run (which runs the suite at both ends), an older torch refused in one line."""

import re
import tomllib
import warnings
from pathlib import Path

import pytest
import torch

from graph_capture.torch_range import NEWEST, OLDEST, UnsupportedTorchError, check, release
from graph_capture.trace.autograd_functions import recording_functions

ROOT = Path(__file__).resolve().parents[1]


def test_release_reads_local_and_dev_versions():
    assert release("2.14.1+cu130") == (2, 14)
    assert release("2.13.0+cpu") == (2, 13)
    assert release("2.15.0.dev20261201") == (2, 15)
    assert release("10.2") == (10, 2)


def test_an_older_torch_is_refused_in_one_line_that_says_what_to_install():
    with pytest.raises(UnsupportedTorchError) as caught:
        check("2.12.1+cu130")
    message = str(caught.value)
    assert "\n" not in message
    assert "torch>=2.13" in message and "2.12.1" in message and "pip install" in message
    assert isinstance(caught.value, ImportError)


def test_a_newer_torch_warns_and_the_supported_ones_are_silent():
    with pytest.warns(UserWarning, match="tested on torch 2.13 to 2.14, found 2.15.0"):
        check("2.15.0")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check("2.13.0+cpu")
        check("2.14.1")
        check(torch.__version__)


def test_pyproject_declares_the_checked_range():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    (torch_req,) = [d for d in project["dependencies"] if re.match(r"torch\b", d)]
    assert torch_req == f"torch>={OLDEST[0]}.{OLDEST[1]},<{NEWEST[0]}.{NEWEST[1] + 1}"


def test_ci_runs_the_suite_at_both_ends_of_the_range():
    ci = (ROOT / ".ci" / "run").read_text()
    versions = re.findall(r"^suite (\d+\.\d+\.\d+)", ci, flags=re.MULTILINE)
    assert {release(v) for v in versions} == {OLDEST, NEWEST}
    readme = (ROOT / "README.md").read_text()
    for version in versions:
        assert f"torch=={version}" in readme


def test_function_recording_restores_torchs_own_apply():
    """`apply` is a classmethod up to torch 2.13 and a C classmethod_descriptor from 2.14: the
    recording binds either and puts the very object back."""
    original = torch.autograd.Function.__dict__["apply"]

    class Double(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * 2

        @staticmethod
        def backward(ctx, grad):
            return grad * 3  # not the forward's derivative: the Function's own backward runs

    x = torch.ones(3, requires_grad=True)
    with recording_functions() as applied:
        y = Double.apply(x)
    assert applied == [Double]
    assert torch.autograd.Function.__dict__["apply"] is original
    y.sum().backward()
    assert torch.equal(x.grad, torch.full((3,), 3.0))


def _private_torch_imports() -> set[tuple[str, str | None]]:
    """(module, name) of every import of a private torch module or name in the library
    (`from torch._x import y`, `import torch._x`, `from torch.a import _b`), name None for a
    module import."""
    import ast

    found: set[tuple[str, str | None]] = set()
    for package in ("graph_capture", "solver", "executor", "cli", "benchmarks"):
        for path in (ROOT / package).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("torch"):
                    private_module = "._" in node.module
                    for alias in node.names:
                        if private_module or alias.name.startswith("_"):
                            found.add((node.module, alias.name))
                elif isinstance(node, ast.Import):
                    found.update(
                        (alias.name, None)
                        for alias in node.names
                        if alias.name.startswith("torch") and "._" in alias.name
                    )
    return found


def test_every_private_torch_name_the_library_imports_exists_on_this_torch():
    """The names a new torch release may drop, each checked: a failure names the module and the
    name, and graph_capture/torch_range.py's range is what must change."""
    import importlib

    imports = _private_torch_imports()
    assert ("torch.utils.checkpoint", "_sac_storage_key") in imports  # the walk sees them
    missing = []
    for module, name in sorted(imports, key=str):
        try:
            loaded = importlib.import_module(module)
        except ImportError as error:
            missing.append(f"{module} ({error})")
            continue
        if name is not None and not hasattr(loaded, name):
            try:
                importlib.import_module(f"{module}.{name}")
            except ImportError:
                missing.append(f"{module}.{name}")
    assert not missing, f"torch {torch.__version__} lacks: {', '.join(missing)}"
