"""The one exception capture raises: what failed and where (module path and aten op)."""


class CaptureError(RuntimeError):
    """A model cannot be captured faithfully; the message names the module and op."""


def first_lines(error: BaseException, count: int = 6) -> str:
    """The first ``count`` non-blank lines of ``error``'s message, indented for a CaptureError."""
    lines = [line for line in str(error).splitlines() if line.strip()]
    return "\n  ".join(lines[:count])
