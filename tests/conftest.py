"""Shared pytest configuration: deterministic hypothesis runs for CI, a pinned torch thread
count for bit-exactness tests."""

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
