"""The device a plan is made for, as a model (`devices`): torch-free."""

from solver.target.devices import (
    BUILT_IN,
    TARGET_NAMES,
    Device,
    UnknownTargetError,
    builtin_device,
    load_device,
    op_key,
)

__all__ = [
    "BUILT_IN",
    "TARGET_NAMES",
    "Device",
    "UnknownTargetError",
    "builtin_device",
    "load_device",
    "op_key",
]
