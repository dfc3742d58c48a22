"""Shared pytest configuration: deterministic hypothesis runs for CI, a pinned torch thread
count for bit-exactness tests, and a `device` parameter over the devices this machine has."""

import os

import pytest
from hypothesis import HealthCheck, settings

settings.register_profile(
    "ci",
    derandomize=True,
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.load_profile("ci")

# cuBLAS picks its workspace per call unless this is set before CUDA starts; with it (and
# deterministic algorithms, below) a CUDA kernel returns the same bits on every run
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

# Under pytest-xdist (`pytest -n 2`, the README's command) each worker has a core of its own:
# one torch thread per worker, set before torch starts, so that two workers do not
# oversubscribe two cores. Exactness tests pin their own count (`one_thread`).
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("OMP_NUM_THREADS", "1")


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """A test with a ``device`` argument runs once per available device: "cpu", and "cuda"
    where torch sees a GPU (torch is imported only for such tests)."""
    if "device" in metafunc.fixturenames:
        import torch

        metafunc.parametrize("device", ["cpu"] + (["cuda"] if torch.cuda.is_available() else []))


@pytest.fixture(autouse=True)
def _deterministic_cuda(request: pytest.FixtureRequest):
    """On the "cuda" parameter, deterministic kernels (bit-exactness compares two runs)."""
    callspec = getattr(request.node, "callspec", None)
    if callspec is None or callspec.params.get("device") != "cuda":
        yield
        return
    import torch

    before = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    yield
    torch.use_deterministic_algorithms(before)


@pytest.fixture(scope="module")
def one_thread():
    """Exactness holds at a fixed thread count (1 vs 2 threads differ already for eager).

    Use with `pytestmark = pytest.mark.usefixtures("one_thread")`; torch is imported here only
    when a test asks for it, so solver tests never import torch."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
