"""The torch releases remat runs on, checked when `graph_capture` (and so `executor`) is imported.

remat reads torch internals that change between releases; the range is the one its suite
passes on (`.ci/run` runs it at both ends) and the one pyproject.toml declares:

- from 2.13: SAC (`executor.checkpoint_plan`) keys torch's selective-checkpoint cache by
  `torch.utils.checkpoint._sac_storage_key` and an occurrence index (`func_counter`), and its
  policy reads the op's output (`SelectiveCheckpointContext.op_output`); torch 2.12 keeps the
  cache as a list popped per op and has neither.
- to 2.14: `torch.autograd.Function.apply` is a C `classmethod_descriptor` there (a
  `classmethod` before), which capture's Function recording binds through the descriptor
  protocol. Releases after 2.14 are untested: a warning says so.
"""

from __future__ import annotations

import re
import warnings

import torch

from solver.errors import RematError

OLDEST = (2, 13)
"""The oldest torch release (major, minor) remat supports."""
NEWEST = (2, 14)
"""The newest torch release (major, minor) remat is tested on."""


class UnsupportedTorchError(RematError, ImportError):
    """The installed torch is older than `OLDEST`."""


def release(version: str) -> tuple[int, int]:
    """(major, minor) of a torch version string such as "2.14.1+cu130" or "2.15.0.dev20261201"."""
    found = re.match(r"(\d+)\.(\d+)", version)
    if found is None:
        raise UnsupportedTorchError(f"cannot read torch's version {version!r}")
    return int(found[1]), int(found[2])


def check(version: str) -> None:
    """Refuse a torch older than `OLDEST` in one line that says what to install; warn on one
    newer than `NEWEST`."""
    found = release(version)
    oldest, newest = ".".join(map(str, OLDEST)), ".".join(map(str, NEWEST))
    if found < OLDEST:
        raise UnsupportedTorchError(
            f"remat needs torch>={oldest} (found {version}): its SAC runtime reads the "
            f"selective-checkpoint cache that torch {oldest} introduced; "
            f'pip install "torch>={oldest},<{NEWEST[0]}.{NEWEST[1] + 1}"'
        )
    if found > NEWEST:
        warnings.warn(
            f"remat is tested on torch {oldest} to {newest}, found {version}: it reads torch "
            "internals that may have changed (graph_capture/torch_range.py)",
            stacklevel=2,
        )


check(torch.__version__)
