"""The one exception capture raises: what failed and where (module path and aten op)."""


class CaptureError(RuntimeError):
    """A model cannot be captured faithfully; the message names the module and op."""
