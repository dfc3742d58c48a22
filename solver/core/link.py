"""The host link that offload and reload ops copy over (docs/offload.md).

A `Link` is one copy engine per direction, each carrying one copy at a time in the order the
copies are issued, an optional limit on the host bytes the copies hold, and the rule by which
the host allocator rounds each copy's buffer (`HOST_ROUNDINGS`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from solver.errors import RematError


class LinkError(RematError, ValueError):
    """A link with a bandwidth that is not a positive finite number, a bad host limit or an
    unknown host rounding."""


HOST_ROUNDINGS = ("exact", "power-of-two")
"""How the host allocator sizes a copy's buffer of n bytes: ``"exact"``, n bytes (the own
executor's CPU pool: numpy memory); ``"power-of-two"``, the least power of two >= n, 0 for 0
(pinned memory on CUDA: torch's CachingHostAllocator rounds every request with
``c10::llvm::PowerOf2Ceil``, aten/src/ATen/core/CachingHostAllocator.h,
``CachingHostAllocatorImpl::allocate``, and never splits a block)."""


def host_block_bytes(nbytes: int, rounding: str) -> int:
    """Host bytes a buffer of `nbytes` bytes takes under `rounding` (one of `HOST_ROUNDINGS`)."""
    if rounding == "exact" or nbytes <= 0:
        return max(nbytes, 0)
    if rounding == "power-of-two":
        return 1 << (nbytes - 1).bit_length()
    raise LinkError(f"host rounding must be one of {', '.join(HOST_ROUNDINGS)}, not {rounding!r}")


@dataclass(frozen=True)
class Link:
    """A host link.

    Attributes:
        d2h: device-to-host bandwidth, bytes per graph cost unit (bytes per second on captured
            graphs, whose costs are seconds).
        h2d: host-to-device bandwidth, same unit.
        host_memory: bytes the host copies may hold at once; None: unlimited.
        host_rounding: how the host allocator sizes each copy's buffer (`HOST_ROUNDINGS`):
            a copy of a value of ``mem`` bytes holds ``host_bytes(mem)`` host bytes.
    """

    d2h: float
    h2d: float
    host_memory: int | None = None
    host_rounding: str = "exact"

    def __post_init__(self) -> None:
        for name in ("d2h", "h2d"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise LinkError(f"link {name} must be a number of bytes per unit, not {value!r}")
            if not (math.isfinite(value) and value > 0):
                raise LinkError(f"link {name} must be a finite number > 0, not {value!r}")
        host = self.host_memory
        if host is not None and (isinstance(host, bool) or not isinstance(host, int) or host < 0):
            raise LinkError(f"link host_memory must be whole bytes >= 0 or None, not {host!r}")
        if self.host_rounding not in HOST_ROUNDINGS:
            raise LinkError(
                f"link host_rounding must be one of {', '.join(HOST_ROUNDINGS)}, not "
                f"{self.host_rounding!r}"
            )

    def host_bytes(self, nbytes: int) -> int:
        """Host bytes a copy of a value of `nbytes` bytes holds (one buffer, `host_rounding`)."""
        return host_block_bytes(nbytes, self.host_rounding)

    def offload_time(self, nbytes: int) -> float:
        """Graph units a device-to-host copy of `nbytes` bytes takes."""
        return nbytes / self.d2h

    def reload_time(self, nbytes: int) -> float:
        """Graph units a host-to-device copy of `nbytes` bytes takes."""
        return nbytes / self.h2d

    def to_json(self) -> dict:
        """{"d2h", "h2d", "host_memory", "host_rounding"}: the schedule file's `link`."""
        return {
            "d2h": self.d2h,
            "h2d": self.h2d,
            "host_memory": self.host_memory,
            "host_rounding": self.host_rounding,
        }

    @classmethod
    def from_json(cls, data: object) -> Link:
        """The link of `to_json` (without "host_rounding": "exact"); LinkError where a field is
        missing or wrong."""
        fields = {"d2h", "h2d", "host_memory"}
        if not isinstance(data, dict) or not fields <= set(data) <= fields | {"host_rounding"}:
            raise LinkError(
                f"a link is {{'d2h', 'h2d', 'host_memory'[, 'host_rounding']}}, not {data!r}"
            )
        return cls(
            data["d2h"], data["h2d"], data["host_memory"], data.get("host_rounding", "exact")
        )
