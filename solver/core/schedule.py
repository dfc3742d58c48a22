"""The Schedule type that every solver and baseline returns, and its JSON file format."""

from __future__ import annotations

import json
import math
from collections.abc import Hashable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import networkx as nx

from solver.core.graph import Problem, prepare
from solver.core.simulate import simulate
from solver.core.stages import IndexedSchedule
from solver.errors import InvalidScheduleError, ScheduleMismatchError

FORMAT = "remat.schedule"
FORMAT_VERSION = 1

Op = tuple[str, Hashable]


@dataclass
class Schedule:
    """A checked schedule with what is known about its quality.

    Attributes:
        ops: ("compute", node) / ("free", node) in execution order; nodes are graph node ids.
        cost: total cost of the computes, in the graph's cost unit (checked by `simulate`).
        peak: peak bytes under the README's semantics, transient bytes included (checked by
            `simulate`).
        method: who made it ("exact", "checkpoint_all", "sqrt_segments", ...).
        objective: "cost" (minimise cost under `budget`) or "memory" (minimise peak under
            `compute_budget`).
        status: "OPTIMAL" when proven optimal for `objective` in the solver's schedule space,
            else "FEASIBLE".
        bound: proven lower bound on the objective (cost units or bytes), None when unknown.
        budget: the memory budget in bytes it was solved for (None: unconstrained).
        compute_budget: the cost budget it was solved for (objective="memory"), else None.
        solve_seconds: wall-clock seconds spent producing it.
        graph_fingerprint: `Problem.fingerprint` of the graph it belongs to.
        recomputes: compute ops beyond each node's first.
    """

    ops: list[Op]
    cost: float
    peak: int
    method: str
    objective: str
    status: str
    bound: float | None
    budget: int | None
    compute_budget: float | None
    solve_seconds: float
    graph_fingerprint: str
    recomputes: int = 0
    extra: dict = field(default_factory=dict)

    @property
    def gap(self) -> float | None:
        """Relative optimality gap (objective - bound) / objective; 0.0 when proven optimal."""
        if self.bound is None:
            return None
        value = self.cost if self.objective == "cost" else float(self.peak)
        if value <= 0:
            return 0.0
        return max(0.0, (value - self.bound) / value)

    def check_graph(self, graph: nx.DiGraph | Problem) -> None:
        """Raise ScheduleMismatchError unless this schedule was solved for `graph`."""
        problem = graph if isinstance(graph, Problem) else prepare(graph)
        if problem.fingerprint != self.graph_fingerprint:
            raise ScheduleMismatchError(
                f"this schedule was solved for graph {self.graph_fingerprint}, but the graph "
                f"given has fingerprint {problem.fingerprint} (different nodes, edges or bytes). "
                "Solve a new schedule for this graph (remat solve ... --out FILE)."
            )

    def to_json(self) -> str:
        """Serialise to the versioned JSON format (node ids must be JSON scalars)."""
        payload = {"format": FORMAT, "version": FORMAT_VERSION, **asdict(self)}
        payload["ops"] = [[kind, node] for kind, node in self.ops]
        return json.dumps(payload, indent=1)

    def save(self, path: str | Path) -> None:
        """Write `to_json()` to `path`."""
        Path(path).write_text(self.to_json())

    @classmethod
    def from_json(cls, text: str, graph: nx.DiGraph | None = None) -> Schedule:
        """Parse a schedule; with `graph`, also check it belongs to that graph and is valid."""
        try:
            payload = json.loads(text)
        except json.JSONDecodeError as exc:
            raise InvalidScheduleError(f"not a schedule file: {exc}") from exc
        if not isinstance(payload, dict) or payload.get("format") != FORMAT:
            raise InvalidScheduleError(f"not a schedule file (no 'format': {FORMAT!r})")
        if payload.get("version") != FORMAT_VERSION:
            raise InvalidScheduleError(
                f"schedule format version {payload.get('version')} is not supported "
                f"(this remat reads version {FORMAT_VERSION}); solve the schedule again"
            )
        del payload["format"], payload["version"]
        payload["ops"] = [(kind, node) for kind, node in payload["ops"]]
        schedule = cls(**payload)
        if graph is not None:
            schedule.check_graph(graph)
            checked = simulate(graph, schedule.ops)
            checked.raise_if_invalid()
            if checked.peak != schedule.peak:
                raise InvalidScheduleError(
                    f"the file claims peak {schedule.peak} bytes but the schedule gives "
                    f"{checked.peak} on this graph"
                )
        return schedule

    @classmethod
    def load(cls, path: str | Path, graph: nx.DiGraph | None = None) -> Schedule:
        """Read a schedule file (see `from_json`)."""
        return cls.from_json(Path(path).read_text(), graph)


def make_schedule(
    graph: nx.DiGraph,
    problem: Problem,
    indexed: IndexedSchedule | Sequence[tuple[str, int]],
    *,
    method: str,
    objective: str = "cost",
    status: str = "FEASIBLE",
    bound: float | None = None,
    budget: int | None = None,
    compute_budget: float | None = None,
    solve_seconds: float = 0.0,
    extra: dict | None = None,
) -> Schedule:
    """Turn index ops into a Schedule, checked by the independent simulator.

    Raises InvalidScheduleError if the simulator rejects the ops or disagrees with the peak and
    cost the producer computed: a solver bug must never reach the user as a schedule.
    """
    index_ops = indexed.ops if isinstance(indexed, IndexedSchedule) else indexed
    ops = [(kind, problem.ids[i]) for kind, i in index_ops]
    checked = simulate(graph, ops)
    checked.raise_if_invalid()
    if isinstance(indexed, IndexedSchedule) and (
        checked.peak != indexed.peak
        or not math.isclose(checked.cost, indexed.cost, rel_tol=1e-9, abs_tol=1e-9)
    ):
        raise InvalidScheduleError(
            f"{method}: internal accounting (peak {indexed.peak}, cost {indexed.cost}) disagrees "
            f"with the simulator (peak {checked.peak}, cost {checked.cost}); please report this"
        )
    return Schedule(
        ops=ops,
        cost=checked.cost,
        peak=checked.peak,
        method=method,
        objective=objective,
        status=status,
        bound=bound,
        budget=budget,
        compute_budget=compute_budget,
        solve_seconds=solve_seconds,
        graph_fingerprint=problem.fingerprint,
        recomputes=checked.recomputes,
        extra=extra or {},
    )
