"""The Schedule type that every solver and baseline returns, and its JSON file format."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import networkx as nx

from solver.core.graph import Problem, prepare
from solver.core.link import Link, LinkError
from solver.core.simulate import Op, simulate
from solver.core.stages import IndexedSchedule
from solver.errors import InternalError, InvalidScheduleError, ScheduleMismatchError

FORMAT = "remat.schedule"
FORMAT_VERSION = 2
READ_VERSIONS = (1, 2)
"""Versions `Schedule.from_json` reads: 1 has no `link` (read as None; a file without a
`version` is read as 1); 2 adds it, and offload and reload ops (docs/offload.md)."""


@dataclass
class Schedule:
    """A checked schedule with what is known about its quality.

    Attributes:
        ops: ("compute", node) / ("free", node), and with a link ("offload", node) /
            ("reload", node), in execution order; nodes are graph node ids.
        cost: total cost of the computes, plus the stall waiting for copies where it has a
            link, in the graph's cost unit (checked by `simulate`).
        peak: peak bytes under the README's semantics, transient bytes included (checked by
            `simulate`).
        method: who made it ("exact", "checkpoint_all", "sqrt_segments", ...).
        objective: "cost" (minimise cost under `budget`) or "memory" (minimise peak under
            `compute_budget`).
        status: "OPTIMAL" when proven optimal for `objective` in the solver's schedule space,
            else "FEASIBLE".
        bound: proven lower bound on the objective (cost units or bytes), None when unknown.
        budget: the memory budget in bytes it was solved for (None: unconstrained).
        compute_budget: the cost budget it was solved for (objective="memory", or the
            least-peak search of a "min" budget), else None.
        solve_seconds: wall-clock seconds spent producing it.
        graph_fingerprint: `Problem.fingerprint` of the graph it belongs to.
        cost_fingerprint: `Problem.cost_fingerprint` of the costs it was solved with ("" where
            unknown): `cost`, `status` and `bound` are statements about those costs.
        recomputes: compute ops beyond each node's first.
        link: the host link its offload and reload ops copy over (docs/offload.md); None: a
            keep/recompute schedule.
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
    cost_fingerprint: str = ""
    link: Link | None = None

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
        """Parse a schedule file's text. Every field must have its type, and the claims must
        agree with each other (`_check_claims`). With `graph`, the schedule must belong to it
        (fingerprint) and its ops are replayed by the simulator: the peak and recomputes the file
        states, and its cost where the graph has the same costs, must be what they give
        (`_check_replay`). Raises InvalidScheduleError (or ScheduleMismatchError) saying what
        disagrees."""
        try:
            payload = json.loads(text)
        except (ValueError, RecursionError) as exc:
            raise InvalidScheduleError(f"not a schedule file: {exc}") from exc
        if not isinstance(payload, dict) or payload.get("format") != FORMAT:
            raise InvalidScheduleError(f"not a schedule file (no 'format': {FORMAT!r})")
        version = payload.get("version", 1)
        if isinstance(version, bool) or version not in READ_VERSIONS:
            raise InvalidScheduleError(
                f"schedule format version {version!r} is not supported (this remat reads "
                f"versions {', '.join(map(str, READ_VERSIONS))}); solve the schedule again"
            )
        if version == 1 and "link" in payload:
            raise InvalidScheduleError("a version 1 schedule file has no 'link' field")
        schedule = cls(**_fields(payload))
        schedule._check_claims()
        if graph is not None:
            schedule.check_graph(graph)
            schedule._check_replay(graph)
        return schedule

    @classmethod
    def load(cls, path: str | Path, graph: nx.DiGraph | None = None) -> Schedule:
        """Read a schedule file (see `from_json`)."""
        try:
            text = Path(path).read_text()
        except (OSError, ValueError) as exc:
            raise InvalidScheduleError(f"cannot read schedule file {path}: {exc}") from exc
        return cls.from_json(text, graph)

    def _check_claims(self) -> None:
        """The stated numbers agree with each other: a bound is at most the objective's value
        and equals it exactly when the status is OPTIMAL; the peak and cost are within the
        budgets."""
        value = self.cost if self.objective == "cost" else float(self.peak)
        close = self.bound is not None and math.isclose(self.bound, value, rel_tol=1e-9)
        if self.bound is not None and self.bound > value and not close:
            raise InvalidScheduleError(
                f"the file claims a lower bound of {self.bound:g} above its own {self.objective} "
                f"{value:g}"
            )
        if self.status == "OPTIMAL" and not close:
            raise InvalidScheduleError(
                f"the file claims OPTIMAL but its bound {self.bound} is not its {self.objective} "
                f"{value:g}"
            )
        if self.budget is not None and self.peak > self.budget:
            raise InvalidScheduleError(
                f"the file claims peak {self.peak} bytes, over its budget of {self.budget}"
            )
        limit = self.compute_budget
        if limit is not None and self.cost > limit * (1 + 1e-12):
            raise InvalidScheduleError(
                f"the file claims cost {self.cost:g}, over its compute budget of {limit:g}"
            )

    def _check_replay(self, graph: nx.DiGraph) -> None:
        """The ops replayed on `graph` give the peak and recomputes the file states, and the
        cost where the graph's costs are those the file was solved with. Where they are not (a
        new capture measures other times), the schedule is still valid but its cost claims are
        not: the cost is the replay's, the status "FEASIBLE" and the bound unknown
        (`extra["costs_changed"]`)."""
        checked = simulate(graph, self.ops, self.link)
        checked.raise_if_invalid()
        same_costs = self.cost_fingerprint == prepare(graph).cost_fingerprint
        cost_ok = math.isclose(checked.cost, self.cost, rel_tol=1e-9, abs_tol=1e-9)
        if (checked.peak, checked.recomputes) != (self.peak, self.recomputes) or (
            same_costs and not cost_ok
        ):
            raise InvalidScheduleError(
                f"the file claims cost {self.cost:g}, peak {self.peak} bytes and "
                f"{self.recomputes} recomputes, but its ops give cost {checked.cost:g}, peak "
                f"{checked.peak} and {checked.recomputes} recomputes on this graph"
            )
        if not same_costs:
            self.cost, self.status, self.bound = checked.cost, "FEASIBLE", None
            self.extra = {**self.extra, "costs_changed": True}


_FIELDS: dict[str, tuple[type | tuple[type, ...], bool]] = {
    "ops": (list, False),
    "cost": ((int, float), False),
    "peak": (int, False),
    "method": (str, False),
    "objective": (str, False),
    "status": (str, False),
    "bound": ((int, float), True),
    "budget": (int, True),
    "compute_budget": ((int, float), True),
    "solve_seconds": ((int, float), False),
    "graph_fingerprint": (str, False),
    "recomputes": (int, False),
    "extra": (dict, False),
    "cost_fingerprint": (str, False),
    "link": (dict, True),
}
"""Each field of the file: its JSON type(s) and whether it may be null."""

OPTIONAL = {"cost_fingerprint": "", "link": None}
"""Fields a file may lack (written before they existed), with the value they then take."""


def _fields(payload: dict) -> dict:
    """The Schedule fields of a file's payload, each checked against `_FIELDS`."""
    fields = OPTIONAL | {k: v for k, v in payload.items() if k not in ("format", "version")}
    missing = [name for name in _FIELDS if name not in fields]
    unknown = [name for name in fields if name not in _FIELDS]
    if missing or unknown:
        what = f"lacks {', '.join(missing)}" if missing else f"has unknown {', '.join(unknown)}"
        raise InvalidScheduleError(f"the schedule file {what} (fields of format {FORMAT!r})")
    for name, (types, nullable) in _FIELDS.items():
        value = fields[name]
        if value is None and nullable:
            continue
        number = not isinstance(value, bool) and isinstance(value, types)
        if not number or (isinstance(value, float) and not math.isfinite(value)):
            raise InvalidScheduleError(f"the schedule file's {name} is {value!r}")
        if isinstance(value, int | float) and value < 0:
            raise InvalidScheduleError(f"the schedule file's {name} is negative ({value!r})")
    if fields["objective"] not in ("cost", "memory"):
        raise InvalidScheduleError(f"unknown objective {fields['objective']!r} in the file")
    if fields["status"] not in ("OPTIMAL", "FEASIBLE"):
        raise InvalidScheduleError(f"unknown status {fields['status']!r} in the file")
    fields["ops"] = [_op(op, step) for step, op in enumerate(fields["ops"])]
    if fields["link"] is not None:
        try:
            fields["link"] = Link.from_json(fields["link"])
        except LinkError as exc:
            raise InvalidScheduleError(f"the schedule file's link: {exc}") from exc
    return fields


def _op(op: object, step: int) -> Op:
    """An op of the file: [kind, node] with a string kind and a scalar node id."""
    node_types = (str, int, float)
    if not (isinstance(op, list) and len(op) == 2 and isinstance(op[0], str)) or not isinstance(
        op[1], node_types
    ):
        raise InvalidScheduleError(f"op {step} of the file is {op!r}, not [kind, node id]")
    return (op[0], op[1])


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
    link: Link | None = None,
) -> Schedule:
    """Turn index ops into a Schedule, checked by the independent simulator (replaying the
    copies over `link`, where given: `extra` then records the stall, copies and host peak).

    Raises InternalError if the simulator rejects the ops or disagrees with the peak and cost
    the producer computed: a solver bug must never reach the user as a schedule.

    Exception to the 8-parameter rule: its keyword-only parameters are the `Schedule` fields
    it records as given.
    """
    index_ops = indexed.ops if isinstance(indexed, IndexedSchedule) else indexed
    ops = [(kind, problem.ids[i]) for kind, i in index_ops]
    checked = simulate(graph, ops, link)
    if not checked.valid:
        raise InternalError(f"{method}: the simulator rejects the schedule ({checked.error})")
    if isinstance(indexed, IndexedSchedule) and (
        checked.peak != indexed.peak
        or not math.isclose(checked.cost, indexed.cost, rel_tol=1e-9, abs_tol=1e-9)
    ):
        raise InternalError(
            f"{method}: its accounting (peak {indexed.peak}, cost {indexed.cost}) disagrees "
            f"with the simulator (peak {checked.peak}, cost {checked.cost})"
        )
    extra = dict(extra or {})
    if "threads" in graph.graph:  # bytes measured with this many intra-op threads
        extra.setdefault("threads", graph.graph["threads"])
    for key in ("target", "structure"):  # estimate mode: the device, what the ops refer to
        if key in graph.graph:
            extra.setdefault(key, graph.graph[key])
    if link is not None:
        extra.update(
            stall=checked.stall,
            offloads=checked.offloads,
            reloads=checked.reloads,
            host_peak=checked.host_peak,
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
        cost_fingerprint=problem.cost_fingerprint,
        recomputes=checked.recomputes,
        extra=extra,
        link=link,
    )
