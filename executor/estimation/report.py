"""`StepEstimate`: every checkpointing strategy's bytes per rank, verdict and seconds for one
training step, side by side (`executor.estimate` makes it). Bytes are per rank; seconds are
per step; both predicted for a target, or from this machine's recording without one."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path

from executor.estimation.reserved import ReservedBytes
from executor.sac.plan import CheckpointPlan
from graph_capture.measurement.roofline import resolve_target
from solver.errors import ArgumentError
from solver.target import Device
from solver.target.components import Components

GIB = 1 << 30


@dataclass(frozen=True)
class Largest:
    """The largest size along one dimension (its factory's units) at which a strategy's step
    fits (`executor.estimation.largest`): `size` (0: not even size 1); `proven` where the size
    above it was estimated and does not fit; `upper`, the least size estimated not to fit
    (None: none found before the search ended); `note`: why an unproven search ended (no time
    left, or the model failed at a size); `limit`: at `upper`, where the row peaks and the
    largest tensor then (`StrategyEstimate.bottleneck`), `limit_bytes` its bytes."""

    size: int
    proven: bool
    upper: int | None
    note: str = ""
    limit: str = ""
    limit_bytes: int = 0

    def __str__(self) -> str:
        if self.proven:
            return f"{self.size:,} (proven)"
        above = "none found" if self.upper is None else f"{self.upper:,} does not"
        return f">= {self.size:,} ({above})" if self.size else f"open ({above})"


@dataclass(frozen=True)
class Replan:
    """remat's row at `size` along `dim` (the least size at which it is not known to fit)
    re-planned with `change` (executor/estimation/replans.py), decided as the size search
    decides (a fixed policy's row where one fits, its name in the row's note): `row` (None
    where the change does not apply, `note` saying why), judged against `usable` bytes per
    rank."""

    dim: str
    size: int
    change: str
    row: StrategyEstimate | None
    note: str = ""
    usable: int = 0

    def verdict(self, unit: tuple[str, int] = ("GiB", 1 << 30)) -> str:
        """Whether the change makes the size fit, in words, bytes in `unit` (name, bytes)."""
        name, size = unit
        if self.row is None:
            return f"not planned: {self.note}"
        if self.row.total is None:
            least = (
                "" if self.row.least is None else f" (least {self.row.least / size:,.2f} {name})"
            )
            return f"still no plan fits{least}"
        total = self.row.total
        if total <= self.usable:
            how = f" ({self.row.note})" if self.row.note else ""
            return f"fits: {total / size:,.2f} {name}, {self.row.seconds:.4g} s per step{how}"
        return f"does not fit: {total / size:,.2f} {name}"


@dataclass(frozen=True)
class StrategyEstimate:
    """One strategy's row. `name`: what it is; `components`: the rank's bytes at the step's
    peak by component (`solver.target.components`; None where no plan fits, `least` then
    says the least peak any plan reaches); `peak_at`: the window and level of the peak;
    `recompute`: seconds the strategy adds to the plain step (recompute, checkpoint's price, SAC
    overhead, copies' stall); `seconds`: the step's seconds (the plain step's plus
    `recompute`); `host_bytes`: pinned host bytes its copies hold (offload); `status`: the
    solve's with its gap ("OPTIMAL gap 0.00%", "FEASIBLE gap 0.41%"), "FIXED" for a fixed
    policy, "INFEASIBLE" where no plan fits (proven), "NONE FOUND" where the solve found
    none in its time, "NOT PREDICTED"; `note`: why a row has no
    plan, or what it is; `plan`: the `CheckpointPlan` that runs the strategy
    (`plan.apply(model)`; None for a row without one); `largest`: per dimension searched
    (`estimate`'s `factories`), the largest size at which the strategy fits; `bottleneck`:
    the largest tensor the plain step makes in the window of the peak and holds at that
    window's peak, in words (the op, its output's shape and dtype), where the recording names
    its tensors (estimate mode; empty measured), and its bytes (`bottleneck_bytes`); where no
    plan fits, those of the least-peak plan."""

    name: str
    components: Components | None
    peak_at: str
    recompute: float
    seconds: float
    status: str
    host_bytes: int = 0
    least: int | None = None
    note: str = ""
    plan: CheckpointPlan | None = field(default=None, compare=False, repr=False)
    largest: Mapping[str, Largest] = field(default_factory=dict)
    bottleneck: str = ""
    bottleneck_bytes: int = 0
    reserved: ReservedBytes | None = None

    @property
    def total(self) -> int | None:
        """Bytes per rank at the step's peak (None where no plan fits)."""
        return None if self.components is None else self.components.total


@dataclass(frozen=True)
class StepEstimate:
    """One training step's estimate: `strategies` (rows, in `STRATEGIES`' order), the memory
    each is judged against (`usable`: bytes per rank PyTorch may allocate), `target` (None:
    measured here), `world_size`, `tokens` (per rank per step; None where the inputs hold no
    token ids: then `samples`), `plain_seconds` (the step without checkpointing); `replans`,
    with `factories`: what would move remat's largest sizes, each re-planned (`Replan`);
    `reserved_note`: where the rows' reserved bytes are not predicted, why."""

    strategies: tuple[StrategyEstimate, ...]
    usable: int
    target: str | None
    world_size: int
    plain_seconds: float
    tokens: int | None
    samples: int
    basis: str = field(default="predicted")
    replans: tuple[Replan, ...] = ()
    reserved_note: str = ""

    def strategy(self, name: str) -> StrategyEstimate:
        """The row named `name`; ArgumentError naming the rows otherwise."""
        for row in self.strategies:
            if row.name == name:
                return row
        names = ", ".join(r.name for r in self.strategies)
        raise ArgumentError(f"no strategy {name!r} in this estimate: one of {names}")

    def memory_of(self, device: str | Device | int | None = None) -> int:
        """Bytes per rank of `device`: a target name, a device file, a `Device` (its usable
        memory, NCCL's share taken under FSDP2) or bytes; None: `usable`."""
        if device is None:
            return self.usable
        if isinstance(device, int):
            return device
        resolved = resolve_target(device)
        return resolved.usable(1 if self.world_size > 1 else 0)

    def fitting(self, device: str | Device | int | None = None) -> list[StrategyEstimate]:
        """The rows whose bytes per rank fit `device` (`memory_of`), fastest first."""
        memory = self.memory_of(device)
        rows = [r for r in self.strategies if r.total is not None and r.total <= memory]
        return sorted(rows, key=lambda r: r.seconds)

    def fits(self, device: str | Device | int | None = None) -> bool:
        """Whether some strategy's step fits `device` (`memory_of`)."""
        return bool(self.fitting(device))

    def throughput(self, row: StrategyEstimate) -> float:
        """Tokens per second per rank of `row` (samples per second without token ids)."""
        return (self.tokens or self.samples) / row.seconds if row.seconds > 0 else 0.0

    def to_markdown(self) -> str:
        """The table: one row per strategy, bytes in the largest unit of `UNITS` its rows
        reach, its verdict against `usable`, seconds and throughput per rank, and how its plan
        was reached (`status`)."""
        rate = "tokens/s" if self.tokens else "samples/s"
        where = self.target or "this machine (measured)"
        name, size = _unit(self)
        dims = self.dimensions()
        largest = "".join(f" largest {d} |" for d in dims)
        conf = next((r.reserved.config for r in self.strategies if r.reserved), None)
        reserved = "" if conf is None else " reserved, predicted |"
        allocator = (
            f" Reserved: the caching allocator ({conf or 'torch defaults'}) over two steps."
            if conf is not None
            else f" Reserved memory {self.reserved_note}." * bool(self.reserved_note)
        )
        head = (
            f"Per rank of {self.world_size} on {where}, {self.basis}; usable "
            f"{self.usable / size:,.2f} {name}; bytes in {name}.{allocator}\n\n"
            "| strategy | parameters | gradients | optimizer | FSDP buffers | saved activations "
            f"| transient | other | total | fits (headroom) |{reserved} step s | {rate} | plan "
            f"|{largest}\n|---|---|---|---|---|---|---|---|---|---|---|---|---|"
            + "---|" * (len(dims) + bool(reserved))
            + "\n"
        )
        lines = [_markdown_row(self, r, size, dims, conf is not None) for r in self.strategies]
        named = [
            f"- {r.name}: {r.peak_at}: {r.bottleneck}, {r.bottleneck_bytes / size:,.2f} {name}"
            for r in self.strategies
            if r.bottleneck
        ]
        largest = "\n\nThe largest tensor at each peak:\n\n" + "\n".join(named) if named else ""
        notes = [f"- {r.name}: {r.note}" for r in self.strategies if r.note and r.components]
        largest = ("\n\nNotes:\n\n" + "\n".join(notes) if notes else "") + largest
        stops = dict.fromkeys(
            f"- {r.name}, largest {d}: {v.note}"
            for r in self.strategies
            for d, v in r.largest.items()
            if v.note
        )
        ended = "\n\nSearches that ended short:\n\n" + "\n".join(stops) if stops else ""
        limits = [
            f"- {r.name}, {d} {v.upper:,}: {v.limit}, {v.limit_bytes / size:,.2f} {name}"
            for r in self.strategies
            for d, v in r.largest.items()
            if v.limit and v.upper is not None
        ]
        limit = "\n\nWhat sets each largest size (at the size above it):\n\n" if limits else ""
        moved = [
            f"- {m.dim} {m.size:,}, {m.change}: {m.verdict((name, size))}" for m in self.replans
        ]
        move = "\n\nWhat would move remat's limit (re-planned):\n\n" if moved else ""
        tail = largest + limit + "\n".join(limits) + move + "\n".join(moved) + ended
        return head + "\n".join(lines) + tail + "\n"

    def dimensions(self) -> list[str]:
        """The dimensions whose largest sizes were searched, in the order first found."""
        return list(dict.fromkeys(d for r in self.strategies for d in r.largest))

    def to_json(self) -> dict:
        """The estimate as plain data: the fields, each row with its components (bytes)."""
        head = {k: getattr(self, k) for k in self.__dataclass_fields__}
        head["strategies"] = [_row_json(r) for r in self.strategies]
        head["replans"] = [
            {**{k: getattr(m, k) for k in ("dim", "size", "change", "note", "usable")},
             "row": None if m.row is None else _row_json(m.row)}
            for m in self.replans
        ]  # fmt: skip
        return head

    def plot(self, path: str | Path) -> Path:
        """A stacked bar per strategy (components, GiB) with the usable memory as a line and
        each row's predicted reserved bytes as a mark over its bar, written to `path` (a
        format matplotlib knows by its suffix)."""
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        rows = [r for r in self.strategies if r.components is not None]
        fig, ax = plt.subplots(figsize=(1.6 * max(len(rows), 3) + 2, 4.5))
        bottoms = [0.0] * len(rows)
        for part in Components.__dataclass_fields__:
            values = [getattr(r.components, part) / GIB for r in rows]
            ax.bar([r.name for r in rows], values, bottom=bottoms, label=part.replace("_", " "))
            bottoms = [b + v for b, v in zip(bottoms, values, strict=True)]
        ax.axhline(self.usable / GIB, color="black", linestyle="--", label="usable")
        reserved = [(k, r.reserved.reserved / GIB) for k, r in enumerate(rows) if r.reserved]
        if reserved:
            at, values = zip(*reserved, strict=True)
            ax.scatter(at, values, marker="_", s=900, color="black", label="reserved, predicted")
        ax.set_ylabel("GiB per rank")
        ax.set_title(f"{self.target or 'measured here'}, {self.world_size} rank(s)")
        ax.legend(fontsize=7)
        plt.setp(ax.get_xticklabels(), rotation=20, ha="right", fontsize=8)
        fig.tight_layout()
        out = Path(path)
        fig.savefig(out)
        plt.close(fig)
        return out


def _row_json(r: StrategyEstimate) -> dict:
    """A row as plain data: its fields but the plan, its components and largest sizes as
    dicts, its total."""
    skip = ("components", "plan", "largest", "reserved")
    row = {k: getattr(r, k) for k in r.__dataclass_fields__ if k not in skip}
    row["largest"] = {d: asdict(v) for d, v in r.largest.items()}
    row["reserved"] = None if r.reserved is None else asdict(r.reserved)
    row["components"] = None if r.components is None else r.components.as_dict()
    row["total"] = r.total
    return row


UNITS = (("GiB", GIB), ("MiB", 1 << 20), ("KiB", 1 << 10))
"""The table's units, largest first: the first in which the largest row is at least 1."""


def _unit(estimate: StepEstimate) -> tuple[str, int]:
    most = max((r.total or 0 for r in estimate.strategies), default=0) or estimate.usable
    return next(((n, b) for n, b in UNITS if most >= b), UNITS[-1])


def _markdown_row(
    estimate: StepEstimate, row: StrategyEstimate, size: int, dims: list[str], reserved: bool
) -> str:
    def scaled(nbytes: int) -> str:
        return f"{nbytes / size:,.2f}"

    largest = "".join(f" {row.largest.get(d, '-')} |" for d in dims)
    if row.components is None:
        least = "" if row.least is None else f"least {scaled(row.least)}: "
        empty = " |" * (10 + reserved)
        return f"| {row.name} | {least}{row.note} |{empty} {row.status} |{largest}"
    c = row.components
    parts = [c.parameters, c.gradients, c.optimizer_states, c.fsdp_buffers]
    parts += [c.saved_activations, c.transient, c.other, c.total]
    spare = estimate.usable - c.total
    verdict = f"yes ({scaled(spare)})" if spare >= 0 else f"no (over {scaled(-spare)})"
    cells = [row.name, *map(scaled, parts), verdict]
    if reserved:
        r = row.reserved
        fails = "" if r is None or r.fits else ": an allocation fails"
        cells.append("-" if r is None else f"{scaled(r.reserved)}{fails}")
    cells += [f"{row.seconds:.4g}", f"{estimate.throughput(row):,.0f}", row.status]
    return "| " + " | ".join(cells) + " |" + largest
