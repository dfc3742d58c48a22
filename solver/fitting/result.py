"""What `fit` answers (`Fit`) and the torch-free rules around it: the eager measurement that
contradicts a proof (`eager_above`). Sizes are in the fitted dimension's units, bytes whole-step
bytes unless named."""

from __future__ import annotations

from dataclasses import dataclass, field

from solver.core.budget import human_bytes
from solver.core.link import Link
from solver.core.schedule import Schedule
from solver.fitting.fsdp import FsdpBytes
from solver.fitting.probe import Probe
from solver.fitting.static import StaticBytes

RUNTIME = "remat's executor (executor.Rematerialized)"


@dataclass
class Fit:
    """What `fit` found. Sizes are in `dim` units; bytes are whole-step bytes unless named.

    `size`: the largest size proven to fit (None: none was); `proven`: the size after it (or
    `low`) is proven not to fit; `upper`: the least size proven not to fit (None: none was; the
    sizes between are open); `low`: where the search started; `budget`: the step's byte budget
    at `size` as `rematerialize` takes it (the memory less `static`); `schedule`: the schedule
    at `size`; `measured_peak`: one real step's whole-step peak at `size` under `runtime`;
    `eager_size`, `eager_over`: eager's largest size, measured, and the measured whole-step
    peak at eager_size + 1; `per_block_size`: per-block `torch.utils.checkpoint`'s largest size
    within the cap, as the solver predicts it; `bytes_model`: how the bytes at each size were
    obtained; `stopped`: "time limit" or "interrupted" where the call ended on its deadline
    (None: it finished); `seconds`: its wall time; `notes`: what was skipped or not done;
    `warnings`: measurements that contradict the proof; `probes`: the solver's probes;
    `fsdp`: per-rank FSDP2 bytes where the fit is for `world_size` > 1 (then `static` is one
    rank's and `budget` is left after the FSDP bytes, `solver.fitting.fsdp`); `link`: the host
    link the schedules could offload over (None: keep or recompute only), `host_peak` what the
    schedule at `size` holds on the host at most (per rank), `measured_host_peak` what the real
    step's host copies held at most (bytes; None where no step ran or without a link)."""

    dim: str
    memory: int
    size: int | None
    proven: bool
    upper: int | None
    budget: int | None
    schedule: Schedule | None
    static: StaticBytes | None
    optimizer_temporaries: int
    measured_peak: int | None
    eager_size: int | None
    eager_over: int | None
    per_block_size: int | None
    bytes_model: str
    low: int = 1
    max_overhead: str | None = None
    stopped: str | None = None
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    runtime: str = RUNTIME
    probes: list[Probe] = field(default_factory=list, repr=False)
    fsdp: FsdpBytes | None = None
    link: Link | None = None
    measured_host_peak: int | None = None

    @property
    def host_peak(self) -> int | None:
        """Bytes the schedule at `size` holds on the host at most (`solver.simulate`'s
        `host_peak`; 0 for a schedule that copies nothing); None without a link or a size."""
        if self.link is None or self.schedule is None:
            return None
        return int(self.schedule.extra.get("host_peak", 0))

    def summary(self) -> str:
        """The result as lines for a terminal."""
        d = self.dim
        lines = [self._head()]
        refuted = next((p for p in self.probes if p.size == self.upper), None)
        if refuted is not None:
            lines.append(f"why {d} {self.upper} does not fit: {refuted.reason}")
        lines.append(f"bytes: {self.bytes_model}")
        if self.stopped is not None:
            lines.append(
                f"{'interrupted' if self.stopped == 'interrupted' else 'the time limit passed'}"
                f" at {self.seconds:.1f} s: what follows is what was known then"
            )
        if self.static is not None and self.size is not None:
            s, params = self.static, "parameters" if self.fsdp is None else "sharded parameters"
            lines.append(
                f"before the step at {d} {self.size}: {params} {s.parameters} B, gradients "
                f"{s.gradients} B, optimizer state {s.optimizer_state} B, buffers {s.buffers} B, "
                f"inputs {s.inputs} B; step budget {self.budget} B; optimizer step temporaries "
                f"{self.optimizer_temporaries} B"
            )
        if self.fsdp is not None:
            lines.append(self.fsdp.line())
        if self.schedule is not None:
            lines.append(
                f"schedule at {d} {self.size}: peak {self.schedule.peak} B, cost "
                f"{self.schedule.cost:.6g} s ({self.schedule.status})"
            )
        if self.link is not None:
            lines.append(self._offload_line())
        if self.measured_peak is not None:
            verdict = "within" if self.measured_peak <= self.memory else "OVER"
            host = ""
            if self.measured_host_peak is not None:
                host = (
                    f"; its host copies held at most {self.measured_host_peak} B (predicted "
                    f"{self.host_peak} B)"
                )
            lines.append(
                f"one real step at {d} {self.size} under {self.runtime}: whole-step peak "
                f"{self.measured_peak} B, {verdict} {self.memory} B{host}"
            )
        if self.eager_size is not None or self.eager_over is not None:
            over = "" if self.eager_over is None else f"; measured {self.eager_over} B at +1"
            lines.append(f"eager: largest {d} {self.eager_size}{over}")
        cap = "unlimited compute" if self.max_overhead is None else f"within {self.max_overhead}"
        lines.append(f"per-block checkpoint (predicted, {cap}): largest {d} {self.per_block_size}")
        lines += [f"note: {n}" for n in self.notes]
        lines += [f"WARNING: {w}" for w in self.warnings]
        return "\n".join(lines)

    def _offload_line(self) -> str:
        """The host link and what the schedule at the answer copies over it."""
        link = self.link
        assert link is not None
        limit = "" if link.host_memory is None else f", host limit {link.host_memory} B"
        over = f"offload over d2h {link.d2h / 1e9:g} GB/s, h2d {link.h2d / 1e9:g} GB/s{limit}"
        schedule = self.schedule
        if schedule is None:
            return f"{over}: no schedule"
        extra = schedule.extra
        if not extra.get("offloads"):
            return f"{over}: the schedule at {self.dim} {self.size} copies nothing"
        per = "" if self.fsdp is None else " per rank"
        return (
            f"{over}: the schedule at {self.dim} {self.size} holds {self.host_peak} B on the "
            f"host{per} ({extra['offloads']} offloads, {extra['reloads']} reloads, stall "
            f"{extra['stall']:.6g} s of its cost)"
        )

    def _head(self) -> str:
        d, memory = self.dim, human_bytes(self.memory)
        if self.size is None:
            if self.proven:
                return f"no {d} fits in {memory} ({d} {self.low} proven not to fit)"
            return f"no {d} shown to fit in {memory} ({self._open(self.low)})"
        if self.proven:
            return f"largest {d}: {self.size} ({d} {self.size + 1} proven not to fit)"
        return f"largest {d} proven: {self.size} ({self._open(self.size + 1)})"

    def _open(self, first: int) -> str:
        d = self.dim
        if self.upper is None:
            return f"{d} {first} and above open"
        return f"{d} {first}..{self.upper - 1} open, {self.upper} proven not to fit"


def cut_short(what: str, largest: int | None) -> str:
    shown = "" if largest is None else f"; the largest shown to fit: {largest}"
    return f"{what} was cut short by the deadline{shown}"


def eager_above(
    dim: str,
    eager_size: int,
    peak: int | None,
    memory: int,
    upper: int | None,
    notes: list[str],
    warnings: list[str],
) -> None:
    """Eager measured within the memory at `eager_size`, above remat's answer: a warning where
    the solver proved that size does not fit (its bytes then overstate this step's), a note
    where it was open."""
    fact = f"eager trains at {dim} {eager_size} (measured {peak} B within {memory} B)"
    if upper is not None and eager_size >= upper:
        warnings.append(
            f"{fact}, which the proof says does not fit: the captured bytes overstate this "
            "step's (compare the graph's bytes with the measured ones); the answer is not the "
            "largest"
        )
    else:
        notes.append(f"{fact}, a size the search left open: larger sizes were not tried")
