"""The device a plan is made for, as a model (`devices`), FSDP2's per-rank memory (`fsdp`)
and a step's per-rank peak under it (`rank_peak`): torch-free."""

from solver.target.devices import (
    BUILT_IN,
    TARGET_NAMES,
    Device,
    DeviceError,
    UnknownTargetError,
    builtin_device,
    op_key,
)
from solver.target.fsdp import (
    BACKENDS,
    FsdpMemory,
    FsdpPolicy,
    Moment,
    fsdp_memory,
    nccl_communicators,
)
from solver.target.rank_peak import (
    RankPeak,
    StepWindows,
    activation_budget,
    activation_budgets,
    predict_peak,
)

__all__ = [
    "BACKENDS",
    "BUILT_IN",
    "TARGET_NAMES",
    "Device",
    "DeviceError",
    "FsdpMemory",
    "FsdpPolicy",
    "Moment",
    "RankPeak",
    "StepWindows",
    "UnknownTargetError",
    "activation_budget",
    "activation_budgets",
    "builtin_device",
    "fsdp_memory",
    "nccl_communicators",
    "op_key",
    "predict_peak",
]
