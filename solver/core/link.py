"""The host link that offload and reload ops copy over (docs/offload.md).

A `Link` is its copy engines, each carrying one copy at a time in the order the copies are
issued: one per direction (`duplex`), or one both directions share; each copy takes its
direction's fixed latency plus its bytes over its direction's bandwidth. And an optional limit
on the host bytes the copies hold, and the rule by which the host allocator rounds each copy's
buffer (`HOST_ROUNDINGS`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from solver.errors import RematError


class LinkError(RematError, ValueError):
    """A link with a bandwidth that is not a positive finite number, a latency that is not a
    finite number >= 0, or a bad host limit, duplex flag or host rounding."""


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


REQUIRED = ("d2h", "h2d", "host_memory")
"""The fields every `Link.to_json` holds."""
OPTIONAL = {"d2h_latency": 0.0, "h2d_latency": 0.0, "duplex": True, "host_rounding": "exact"}
"""The fields a link file may leave out, with the value read in their place (a file written
before a field existed reads as the link it described: no latency, one engine per direction,
exact host bytes)."""


@dataclass(frozen=True)
class Link:
    """A host link.

    Attributes:
        d2h: device-to-host bandwidth, bytes per graph cost unit (bytes per second on captured
            graphs, whose costs are seconds).
        h2d: host-to-device bandwidth, same unit.
        host_memory: bytes the host copies may hold at once; None: unlimited.
        d2h_latency: graph units (seconds on captured graphs) every device-to-host copy takes
            besides its bytes over `d2h` (the copy's launch and completion), one per copy.
        h2d_latency: the same for every host-to-device copy.
        duplex: True: one copy engine per direction, the two running at once; False: one engine
            that both directions share, carrying every copy in the order they are issued
            (torch's `ao` offload ops, one transfer stream for both directions).
        host_rounding: how the host allocator sizes each copy's buffer (`HOST_ROUNDINGS`):
            a copy of a value of ``mem`` bytes holds ``host_bytes(mem)`` host bytes.
    """

    d2h: float
    h2d: float
    host_memory: int | None = None
    d2h_latency: float = 0.0
    h2d_latency: float = 0.0
    duplex: bool = True
    host_rounding: str = "exact"

    def __post_init__(self) -> None:
        for name in ("d2h", "h2d"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise LinkError(f"link {name} must be a number of bytes per unit, not {value!r}")
            if not (math.isfinite(value) and value > 0):
                raise LinkError(f"link {name} must be a finite number > 0, not {value!r}")
        for name in ("d2h_latency", "h2d_latency"):
            value = getattr(self, name)
            number = not isinstance(value, bool) and isinstance(value, int | float)
            if not (number and math.isfinite(value) and value >= 0):
                raise LinkError(
                    f"link {name} must be a finite number of units >= 0 (seconds on captured "
                    f"graphs), not {value!r}"
                )
        host = self.host_memory
        if host is not None and (isinstance(host, bool) or not isinstance(host, int) or host < 0):
            raise LinkError(f"link host_memory must be whole bytes >= 0 or None, not {host!r}")
        if not isinstance(self.duplex, bool):
            raise LinkError(f"link duplex must be True or False, not {self.duplex!r}")
        if self.host_rounding not in HOST_ROUNDINGS:
            raise LinkError(
                f"link host_rounding must be one of {', '.join(HOST_ROUNDINGS)}, not "
                f"{self.host_rounding!r}"
            )

    def host_bytes(self, nbytes: int) -> int:
        """Host bytes a copy of a value of `nbytes` bytes holds (one buffer, `host_rounding`)."""
        return host_block_bytes(nbytes, self.host_rounding)

    def offload_time(self, nbytes: int) -> float:
        """Graph units a device-to-host copy of `nbytes` bytes takes: its latency plus its
        bytes over the bandwidth."""
        return self.d2h_latency + nbytes / self.d2h

    def reload_time(self, nbytes: int) -> float:
        """Graph units a host-to-device copy of `nbytes` bytes takes: its latency plus its
        bytes over the bandwidth."""
        return self.h2d_latency + nbytes / self.h2d

    def to_json(self) -> dict:
        """{"d2h", "h2d", "host_memory", "d2h_latency", "h2d_latency", "duplex",
        "host_rounding"}: the schedule file's `link`."""
        return {
            "d2h": self.d2h,
            "h2d": self.h2d,
            "host_memory": self.host_memory,
            "d2h_latency": self.d2h_latency,
            "h2d_latency": self.h2d_latency,
            "duplex": self.duplex,
            "host_rounding": self.host_rounding,
        }

    @classmethod
    def from_json(cls, data: object) -> Link:
        """The link of `to_json`, the fields of `OPTIONAL` at their defaults where absent;
        LinkError where a field is missing, unknown or wrong."""
        if (
            not isinstance(data, dict)
            or not set(REQUIRED) <= set(data)
            or not set(data) <= {*REQUIRED, *OPTIONAL}
        ):
            raise LinkError(
                f"a link is {{'d2h', 'h2d', 'host_memory'}} and optionally "
                f"{', '.join(repr(k) for k in OPTIONAL)}, not {data!r}"
            )
        return cls(**{**OPTIONAL, **data})
