"""The host link that offload and reload ops copy over (docs/offload.md).

A `Link` is one copy engine per direction, each carrying one copy at a time in the order the
copies are issued, and an optional limit on the host bytes the copies hold.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from solver.errors import RematError


class LinkError(RematError, ValueError):
    """A link with a bandwidth that is not a positive finite number, or a bad host limit."""


@dataclass(frozen=True)
class Link:
    """A host link.

    Attributes:
        d2h: device-to-host bandwidth, bytes per graph cost unit (bytes per second on captured
            graphs, whose costs are seconds).
        h2d: host-to-device bandwidth, same unit.
        host_memory: bytes the host copies may hold at once; None: unlimited.
    """

    d2h: float
    h2d: float
    host_memory: int | None = None

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

    def offload_time(self, nbytes: int) -> float:
        """Graph units a device-to-host copy of `nbytes` bytes takes."""
        return nbytes / self.d2h

    def reload_time(self, nbytes: int) -> float:
        """Graph units a host-to-device copy of `nbytes` bytes takes."""
        return nbytes / self.h2d

    def to_json(self) -> dict:
        """{"d2h", "h2d", "host_memory"}: the schedule file's `link`."""
        return {"d2h": self.d2h, "h2d": self.h2d, "host_memory": self.host_memory}

    @classmethod
    def from_json(cls, data: object) -> Link:
        """The link of `to_json`; LinkError where a field is missing or wrong."""
        if not isinstance(data, dict) or set(data) != {"d2h", "h2d", "host_memory"}:
            raise LinkError(f"a link is {{'d2h', 'h2d', 'host_memory'}}, not {data!r}")
        return cls(data["d2h"], data["h2d"], data["host_memory"])
