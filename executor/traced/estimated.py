"""A schedule solved in estimate mode, run on the real model.

A capture in estimate mode (`graph_capture.capture`'s ``target``) traces the same joint graph
as the measured capture of the same architecture and shapes, but its bytes are predicted (no
kernel workspaces; rounded for the target's allocator) and its costs are the target's. Its
schedules (``extra["target"]``) are therefore matched to a measured capture by structure
(`graph_capture.dag.structure_fingerprint`: node ids, ops, shapes, dtypes, edges), never by
bytes; a graph that differs in any of those is refused. The first training step under such a
schedule measures its peak and reports it against the predicted one (`EstimateCheck`, and an
`EstimatedPeakWarning`).
"""

from __future__ import annotations

import dataclasses
import warnings
from dataclasses import dataclass

import networkx as nx
import torch

from graph_capture.measurement.peak import PeakMemory, PeakWindow
from solver.core.graph import prepare
from solver.core.schedule import Schedule
from solver.core.simulate import simulate
from solver.errors import ScheduleMismatchError

__all__ = ["EstimateCheck", "EstimatedPeakWarning", "FirstStepPeak", "match_estimated"]


class EstimatedPeakWarning(UserWarning):
    """The first step of a schedule solved in estimate mode: its measured peak against the
    predicted one (issued once per `executor.Rematerialized`)."""


@dataclass(frozen=True)
class EstimateCheck:
    """The first step of a schedule solved in estimate mode, measured.

    ``target``: the device it was solved for; ``predicted_bytes``: its peak in estimate mode;
    ``capture_bytes``: its peak on this model's measured capture (workspaces included);
    ``measured_bytes``: the first step's measured peak above its start; ``budget``: the budget
    it was solved for (bytes, None without one).
    """

    target: str
    predicted_bytes: int
    capture_bytes: int
    measured_bytes: int
    budget: int | None

    def describe(self) -> str:
        budget = "" if self.budget is None else f", budget {self.budget}"
        within = "" if self.budget is None else f" (within budget: {self.within_budget})"
        return (
            f"first step of a schedule solved in estimate mode for target '{self.target}': "
            f"measured peak {self.measured_bytes} bytes, predicted {self.predicted_bytes} "
            f"(measured / predicted {self.measured_bytes / max(1, self.predicted_bytes):.4f}; "
            f"{self.capture_bytes} on this model's measured capture{budget}){within}"
        )

    @property
    def within_budget(self) -> bool | None:
        return None if self.budget is None else self.measured_bytes <= self.budget


def match_estimated(schedule: Schedule, dag: nx.DiGraph, path: object) -> Schedule:
    """``schedule`` (solved in estimate mode) for the measured capture ``dag``: the same ops,
    its peak and cost replayed on ``dag``'s bytes and costs (status FEASIBLE, bound unknown),
    the estimate's peak kept in ``extra["estimated_peak"]``. Raises `ScheduleMismatchError`
    naming the first difference when ``dag`` is another graph."""
    solved, here = schedule.extra.get("structure"), dag.graph.get("structure")
    if solved is None or solved != here:
        raise ScheduleMismatchError(
            f"schedule {path} was solved in estimate mode for target "
            f"'{schedule.extra.get('target')}' on a graph that is not this model's: "
            f"{_first_difference(schedule, dag)}. Refusing to run it: estimate again for this "
            "model and these input shapes (or capture_options as in the estimate)"
        )
    checked = simulate(dag, schedule.ops)
    checked.raise_if_invalid()
    problem = prepare(dag)
    return dataclasses.replace(
        schedule,
        cost=checked.cost,
        peak=checked.peak,
        status="FEASIBLE",
        bound=None,
        graph_fingerprint=problem.fingerprint,
        cost_fingerprint=problem.cost_fingerprint,
        recomputes=checked.recomputes,
        extra={**schedule.extra, "estimated_peak": schedule.peak},
    )


def _first_difference(schedule: Schedule, dag: nx.DiGraph) -> str:
    nodes = {v for _, v in schedule.ops}
    missing = [v for v in nodes if v not in dag]
    if missing:
        return f"its node '{sorted(map(str, missing))[0]}' is not in this capture"
    extra = [v for v in dag if v not in nodes]
    if extra:
        return f"this capture's node '{sorted(map(str, extra))[0]}' is not in it"
    return "the same node names, but other ops, shapes, dtypes or edges"


class FirstStepPeak:
    """Measures the first training step of a schedule solved in estimate mode, in two windows
    (the profiler cannot stay on across autograd's backward): the step's forward, then its
    backward. The step's peak is the larger of the forward's and what the forward left plus the
    backward's; what the caller allocates between the two (the loss) is not seen. `end` sets
    `check` and warns."""

    def __init__(self, schedule: Schedule, device: torch.device) -> None:
        self.schedule = schedule
        self.device = device
        self.window: PeakWindow | None = None
        self.forward: PeakMemory | None = None
        self.check: EstimateCheck | None = None

    def start(self) -> None:
        """Open a window: the forward's, or the backward's once the forward's is measured."""
        if self.check is None and self.window is None:
            self.window = PeakWindow(self.device)

    def end_forward(self) -> None:
        if self.window is not None and self.forward is None:
            self.forward, self.window = self.window.close(), None

    def end(self) -> None:
        if self.window is None or self.forward is None:
            return
        backward, self.window = self.window.close(), None
        measured = max(self.forward.peak_bytes, self.forward.end_bytes + backward.peak_bytes)
        extra = self.schedule.extra
        self.check = EstimateCheck(
            target=str(extra.get("target")),
            predicted_bytes=int(extra.get("estimated_peak", self.schedule.peak)),
            capture_bytes=self.schedule.peak,
            measured_bytes=measured,
            budget=self.schedule.budget,
        )
        warnings.warn(self.check.describe(), EstimatedPeakWarning, stacklevel=2)
