"""The exception capture raises: what failed and where (module path and aten op)."""

from solver.errors import RematError


class CaptureError(RematError, RuntimeError):
    """A model cannot be captured faithfully; the message names the module and op."""


def first_lines(error: BaseException, count: int = 6) -> str:
    """The first ``count`` non-blank lines of ``error``'s message, indented for a CaptureError."""
    lines = [line for line in str(error).splitlines() if line.strip()]
    return "\n  ".join(lines[:count])


def data_dependence(error: BaseException) -> str | None:
    """What a fake tensor could not know when ``error`` is its data-dependent failure, as a
    phrase following "data-dependent" ("output shape (nonzero, ...)", "value read (.item(),
    ...)"); None for any other error. Capture and estimate-mode plans both refuse with it."""
    from torch._subclasses.fake_tensor import (
        DataDependentOutputException,
        DynamicOutputShapeException,
    )

    if isinstance(error, DynamicOutputShapeException):
        return "output shape (nonzero, masked_select, boolean indexing)"
    if isinstance(error, DataDependentOutputException):
        return "value read (.item(), bool() or a Python branch on a tensor)"
    return None
