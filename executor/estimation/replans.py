"""What would move remat's largest size (`replans`): at the least size along a dimension where
remat's row is not known to fit (it does not, or the size search left it open), the step
estimated again with one thing changed, each a re-plan of the whole step, never a guess:

- a chunked loss (`ChunkedLoss`: one chunk's logits live at once), for a Hugging Face causal
  LM given labels;
- twice the ranks (FSDP2 over 2N; from one process, over 2), for a target;
- offload to the host over the link given, or the target's (one process only: offload under
  FSDP2 is not planned).

A change that does not apply is a `Replan` without a row, saying why."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace

from torch import nn

from executor.estimation.chunked_loss import CHUNK, ChunkedLoss, chunkable
from executor.estimation.report import Replan, StepEstimate
from executor.estimation.settings import EstimateSettings
from graph_capture.measurement.roofline import resolve_target
from graph_capture.models.factories import Made, unpack_model
from solver.deadline import Deadline
from solver.errors import InternalError


@dataclass(frozen=True)
class Change:
    """One change re-planned: `what`, in words; the model it runs (`model`, None: the same)
    and the settings (`settings`, None: the same); `why_not`: why it does not apply ("": it
    does); `row`: the row that shows it."""

    what: str
    model: Callable[[nn.Module], nn.Module] | None = None
    settings: Callable[[EstimateSettings], EstimateSettings] | None = None
    why_not: str = ""
    row: str = "remat"


def changes(made: Made, s: EstimateSettings) -> list[Change]:
    """The changes that may move a limit of the model `made` under `s` (module docstring)."""
    model, _, kwargs = made
    out = [
        Change(f"a chunked loss ({CHUNK:,} tokens)", ChunkedLoss, None, chunkable(model, kwargs))
    ]
    ranks = 2 * (s.fsdp.world_size if s.fsdp is not None else s.world_size)
    wider = f"FSDP2 over {ranks} ranks"
    if s.target is None:
        out.append(Change(wider, why_not="measured here: give a target to plan other ranks"))
    else:
        fsdp = None if s.fsdp is None else replace(s.fsdp, world_size=ranks)
        out.append(Change(wider, settings=lambda s: replace(s, world_size=ranks, fsdp=fsdp)))
    link = s.link
    if link is None and s.target is not None:
        link = resolve_target(s.target).host_link
    if s.world_size > 1 or s.fsdp is not None:
        out.append(Change("offload", why_not="offload is planned for one process, not FSDP2"))
    elif link is None:
        out.append(Change("offload", why_not="no host link known: give offload="))
    else:
        what = f"offload ({link.d2h / 1e9:,.0f} GB/s to the host)"
        out.append(Change(what, settings=lambda s: replace(s, link=link), row="remat + offload"))
    return out


def replans(
    limits: Mapping[str, tuple[int, Callable[[int], object]]],
    settings: EstimateSettings,
    estimate_at: Callable[[Made, EstimateSettings, Deadline, bool], StepEstimate],
    deadline: Deadline,
) -> tuple[Replan, ...]:
    """Per dimension, at the least size remat's row is not known to fit (`limits`: the size,
    and the dimension's factory), each of `changes` re-planned by `estimate_at` deciding as the
    size search does (a fixed policy's row where one fits, else remat's solve): its row."""
    out = []
    for dim, (size, factory) in limits.items():
        made = unpack_model(factory(size))
        for change in changes(made, settings):
            if not change.why_not and deadline.passed():
                change = replace(change, why_not="no time left")
            if change.why_not:
                out.append(Replan(dim, size, change.what, None, change.why_not))
                continue
            model, inputs, kwargs = made
            run = (change.model(model) if change.model else model, inputs, kwargs)
            changed = change.settings(settings) if change.settings else settings
            try:
                est = estimate_at(run, changed, deadline, True)
            except InternalError:
                raise
            except Exception as error:  # the changed model's own failure, said in its row
                out.append(Replan(dim, size, change.what, None, f"{type(error).__name__}: {error}"))
                continue
            out.append(Replan(dim, size, change.what, est.strategy(change.row), "", est.usable))
    return tuple(out)
