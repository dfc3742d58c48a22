"""A solved SAC plan (`CheckpointPlan`), its JSON file and the model signature it is checked by.

    plan.apply(model)                                     # checkpoint(use_reentrant=False, SAC)
    plan.save("plan.json"); executor.CheckpointPlan.load("plan.json", model)

`checkpoint_plan` (executor/sac/planning.py) solves a plan; `apply` gives its regions the
forwards of executor/sac/runtime/planned_forward.py.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import types
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from torch import nn

from executor.errors import PlanError
from executor.sac.runtime.offload import CopyStreams
from executor.sac.runtime.planned_forward import checkpointed_forward, offloading_forward
from executor.sac.runtime.policy import Policy
from solver.core.budget import plain_step
from solver.core.link import Link
from solver.errors import ScheduleMismatchError
from solver.sac.memory import SacPlan
from solver.sac.union import SacUnion, UnionPlan

__all__ = ["CheckpointPlan", "model_signature"]

FORMAT = "remat-sac-plan/7"
READS = ("remat-sac-plan/5", "remat-sac-plan/6", FORMAT)
"""The plan formats `CheckpointPlan.load` reads: 6 adds the offload choices and the link, 7 the
sizes of each op's host buffers (`solver.sac.SacOp.host_sizes`, `saved_sizes`; a format 6
file's ops have one buffer of their bytes); a format 5 file offloads nothing."""
_APPLIED = ("forward", "remat_sac_policy", "remat_sac_buffers", "remat_sac_offload")
"""The attributes `CheckpointPlan.apply` sets on a region's module."""


def model_signature(model: nn.Module) -> str:
    """A digest of the model's class and its parameters' names, shapes and dtypes."""
    text = repr(
        (
            type(model).__name__,
            [(n, tuple(p.shape), str(p.dtype)) for n, p in model.named_parameters()],
        )
    )
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _sac_plan(regions: list[tuple[bool, frozenset[int], frozenset[int], bool]]) -> SacPlan:
    """The `SacPlan` of regions given as (checkpointed, saved, offloaded, plain offloaded)."""
    checkpointed, saved, offloaded, plain = (tuple(column) for column in zip(*regions, strict=True))
    return SacPlan(
        checkpointed,
        saved,
        offloaded if any(offloaded) else None,
        plain if any(plain) else None,
    )


@dataclass(frozen=True)
class CheckpointPlan:
    """A solved SAC plan. `model_signature`: a digest of the model it was solved for
    (`model_signature`); `regions`: its candidate regions (module names) in order, each block
    followed by its children where it can be split (at most one of a block and its children is
    checkpointed); per region, `region_types` (class names), `ops` (the recorded op stream),
    `checkpointed` (whether it runs inside a checkpoint) and `saved` (the op positions it saves
    rather than recomputes). `peak`: predicted step peak (bytes above what exists before the
    step); `cost`: seconds, the recompute (measured per op) plus each region's checkpoint price
    (measured per region) plus the SAC overhead of each region saving an op (measured per
    region; a region saving nothing runs as plain checkpoint); `bound`: proven lower bound on
    the cost; `gap`: (cost - bound) / cost; `status`: "OPTIMAL" or "FEASIBLE" ("FIXED": a fixed
    policy's, `executor.estimate`); `budget`: bytes; `plain_peak`: the peak of the step without
    checkpointing (100%; `plain_step` names it: measured, or predicted in estimate mode).
    `target`: None where bytes and seconds were measured here; in estimate mode the target
    device's name, and `plain_peak` and every second are predicted for it
    (executor/sac/recording/estimate.py). `world_size` > 1: sharded by FSDP2, and `peak`,
    `budget`, `plain_peak` are bytes per rank on the device (resident included: docs/sac.md,
    "Under FSDP2"). `link`: the host link the plan was solved with (None: it offloads nothing);
    `offloaded`: per region, the saved op positions whose outputs wait on the host between the
    forward and the recompute (None: none); `plain_offloaded`: per region, whether it is not
    checkpointed and the storages its ops create that autograd saves wait on the host (None:
    none); `host_peak`: the bytes those host copies hold at their most (predicted); `cost` then
    includes the copies' stall, predicted from the link (docs/sac.md, "Offload")."""

    model_signature: str
    regions: tuple[str, ...]
    region_types: tuple[str, ...]
    ops: tuple[tuple[str, ...], ...]
    checkpointed: tuple[bool, ...]
    saved: tuple[frozenset[int], ...]
    status: str
    peak: int
    cost: float
    bound: float
    gap: float
    budget: int
    plain_peak: int
    problem: SacUnion
    target: str | None = None
    world_size: int = 1
    link: Link | None = None
    offloaded: tuple[frozenset[int], ...] | None = None
    host_peak: int = 0
    plain_offloaded: tuple[bool, ...] | None = None

    def plain_offloads(self) -> tuple[bool, ...]:
        """Per region, whether it offloads its saved storages while not checkpointed."""
        return self.plain_offloaded or (False,) * len(self.regions)

    def offloads(self) -> tuple[frozenset[int], ...]:
        """Per region, the offloaded op positions (empty where the plan offloads nothing)."""
        return self.offloaded or (frozenset(),) * len(self.regions)

    @property
    def plain_step(self) -> str:
        """The name of 100%: "the measured plain step", or "the predicted plain step" in
        estimate mode."""
        return plain_step("measured" if self.target is None else "predicted")

    def union_plan(self) -> UnionPlan:
        """The plan over `problem`'s regions (each block, then its children where it has a
        split), as the solver's `UnionPlan`, its offloads included."""
        per_region = list(
            zip(self.checkpointed, self.saved, self.offloads(), self.plain_offloads(), strict=True)
        )
        blocks, kids, k = [], [], 0
        for split in self.problem.splits:
            blocks.append(per_region[k])
            m = 0 if split is None else len(split.children)
            kids.append(None if split is None else _sac_plan(per_region[k + 1 : k + 1 + m]))
            k += 1 + m
        return UnionPlan(_sac_plan(blocks), tuple(kids))

    def checkpointed_regions(self) -> list[str]:
        """Names of the regions that run inside a checkpoint."""
        return [n for n, c in zip(self.regions, self.checkpointed, strict=True) if c]

    def __repr__(self) -> str:
        """One line: status, regions checkpointed and saving ops, peak against budget, cost."""
        checkpointed = self.checkpointed_regions()
        saving = sum(1 for c, s in zip(self.checkpointed, self.saved, strict=True) if c and s)
        basis = "measured" if self.target is None else f"predicted for {self.target}"
        if self.world_size > 1:
            basis += f", per rank of {self.world_size}"
        if self.link is not None:
            ops = sum(len(o) for o in self.offloads())
            plain = sum(self.plain_offloads())
            basis += f", {ops} ops and {plain} regions offloaded, host {self.host_peak:,} B"
        return (
            f"CheckpointPlan({self.status}, {len(checkpointed)} of {len(self.regions)} regions "
            f"checkpointed ({saving} saving ops), peak {self.peak:,} B of budget "
            f"{self.budget:,} B ({self.plain_step} {self.plain_peak:,} B), cost {self.cost:.6f} s, "
            f"gap {self.gap:.2%}, {basis})"
        )

    def check_model(self, model: nn.Module) -> None:
        """ScheduleMismatchError unless `model` is the model this plan was solved for."""
        if model_signature(model) != self.model_signature:
            raise ScheduleMismatchError(
                f"this SAC plan was solved for another model (parameters differ from "
                f"{type(model).__name__}'s): solve a plan for this model"
            )
        modules = dict(model.named_modules())
        for name, kind in zip(self.regions, self.region_types, strict=True):
            if name not in modules or type(modules[name]).__name__ != kind:
                raise ScheduleMismatchError(
                    f"the SAC plan's region {name} ({kind}) is not a module of this model: "
                    "the plan was solved for other modules; solve one for these"
                )

    def apply(self, model: nn.Module, streams: CopyStreams | None = None) -> nn.Module:
        """Wrap each checkpointed block's `forward` (its class's) in `torch.utils.checkpoint(
        use_reentrant=False)` with its SAC policy (module hooks, FSDP2's included, stay
        outside); in place, returns `model`. A deep copy of the model keeps the plan. The
        buffers each region's forward mutates (recorded with the plan) are restored around its
        recompute, so the step updates them once. The regions' host copies run on `streams`
        (one device-to-host and one host-to-device stream per CUDA device, shared by every
        region; a new `CopyStreams` by default)."""
        self.check_model(model)
        modules = dict(model.named_modules())
        regions = self.problem.regions()
        streams = CopyStreams() if streams is None else streams
        for j, name in enumerate(self.regions):
            module = modules[name]
            if hasattr(module, "remat_sac_policy") or hasattr(module, "remat_sac_offload"):
                raise PlanError(f"block {name} already runs under a SAC plan: apply it once")
            if self.plain_offloads()[j]:
                module.remat_sac_offload = streams
                module.forward = types.MethodType(offloading_forward, module)
            if not self.checkpointed[j]:
                continue
            offloaded = self.offloads()[j]
            module.remat_sac_policy = Policy(name, self.ops[j], self.saved[j], offloaded, streams)
            module.remat_sac_buffers = regions[j].buffers
            module.forward = types.MethodType(checkpointed_forward, module)
        return model

    @contextlib.contextmanager
    def applied(self, model: nn.Module, streams: CopyStreams | None = None) -> Iterator[nn.Module]:
        """`apply` for the length of the block; after it, each region's module as it was."""
        modules = dict(model.named_modules())
        before = {
            name: {a: modules[name].__dict__[a] for a in _APPLIED if a in modules[name].__dict__}
            for name in self.regions
            if name in modules
        }
        self.apply(model, streams)
        try:
            yield model
        finally:
            for name, attributes in before.items():
                for a in _APPLIED:
                    modules[name].__dict__.pop(a, None)
                modules[name].__dict__.update(attributes)

    def save(self, path: str | Path) -> None:
        """Write the plan as JSON."""
        data = {
            "format": FORMAT,
            "model_signature": self.model_signature,
            "regions": [
                {
                    "name": n,
                    "type": t,
                    "checkpointed": c,
                    "saved": sorted(s),
                    "offloaded": sorted(f),
                    "plain_offloaded": p,
                    "ops": list(o),
                }
                for n, t, c, s, f, p, o in zip(
                    self.regions,
                    self.region_types,
                    self.checkpointed,
                    self.saved,
                    self.offloads(),
                    self.plain_offloads(),
                    self.ops,
                    strict=True,
                )
            ],
            "link": None if self.link is None else self.link.to_json(),
            "host_peak": self.host_peak,
            **{k: getattr(self, k) for k in ("status", "peak", "cost", "bound", "gap")},
            **{k: getattr(self, k) for k in ("budget", "plain_peak", "target", "world_size")},
            "problem": self.problem.to_json(),
        }
        Path(path).write_text(json.dumps(data))

    @classmethod
    def load(cls, path: str | Path, model: nn.Module) -> CheckpointPlan:
        """Read a plan written by `save` (format 7; 6: one host buffer per op; 5: offloading
        nothing), checked against `model` (ScheduleMismatchError for a plan of another model
        or other blocks, PlanError for a file that is not a plan)."""
        try:
            data = json.loads(Path(path).read_text())
        except (OSError, ValueError) as e:
            raise PlanError(f"{path} is not a SAC plan file ({e}): write one with plan.save") from e
        found = data.get("format") if isinstance(data, dict) else None
        if isinstance(found, str) and found.startswith("remat-sac-plan/") and found not in READS:
            raise PlanError(
                f"{path} is a SAC plan of format {found!r}, not {FORMAT!r} (its problem lacks "
                "what this version records, or names it otherwise): solve it again with "
                "checkpoint_plan"
            )
        try:
            if found not in READS:
                raise PlanError(f"format {data.get('format')!r}, not {FORMAT!r}")
            regions = data["regions"]
            link = data.get("link")
            offloaded = tuple(frozenset(r.get("offloaded", ())) for r in regions)
            plain = tuple(bool(r.get("plain_offloaded", False)) for r in regions)
            plan = cls(
                model_signature=data["model_signature"],
                regions=tuple(r["name"] for r in regions),
                region_types=tuple(r["type"] for r in regions),
                ops=tuple(tuple(r["ops"]) for r in regions),
                checkpointed=tuple(bool(r["checkpointed"]) for r in regions),
                saved=tuple(frozenset(r["saved"]) for r in regions),
                **{k: data[k] for k in ("status", "peak", "cost", "bound", "gap")},
                **{k: data[k] for k in ("budget", "plain_peak")},
                problem=SacUnion.from_json(data["problem"]),
                target=data.get("target"),
                world_size=int(data.get("world_size", 1)),
                link=None if link is None else Link.from_json(link),
                offloaded=offloaded if any(offloaded) else None,
                host_peak=int(data.get("host_peak", data.get("host", 0))),
                plain_offloaded=plain if any(plain) else None,
            )
            if (plan.offloaded is not None or any(plain)) and plan.link is None:
                raise PlanError("it offloads ops but has no link")
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise PlanError(f"{path} is not a SAC plan file ({e}): write one with plan.save") from e
        plan.check_model(model)
        return plan
