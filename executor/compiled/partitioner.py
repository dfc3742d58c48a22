"""remat's schedule as torch.compile's partition of each compiled region's joint graph.

`RematPartitioner` is a `torch._inductor.custom_graph_pass.CustomPartitionerFn`: given the
joint graph (after inductor's joint passes), it builds the solver's DAG (`joint_dag`), solves it
under the byte budget it holds, and returns the forward and backward graphs of that schedule
(`emit.partition`). `backend` turns it into a ``torch.compile`` backend: inductor with the
partitioner patched into its config for that compile only (``options``), or ``aot_eager``'s
graphs run as they are with it as AOTAutograd's ``partition_fn``.
"""

from __future__ import annotations

import functools
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import networkx as nx
import torch
from torch._inductor.custom_graph_pass import CustomPartitionerFn

import solver
from executor.compiled import offload as transfer
from executor.compiled.emit import Partition, partition
from executor.compiled.joint_dag import joint_dag, tangent_bytes
from executor.errors import CompileError
from solver.deadline import Deadline
from solver.errors import RematError

__all__ = ["RegionPlan", "RematPartitioner", "backend"]

BACKENDS = ("inductor", "aot_eager")

LAYOUT = {"layout_optimization": False}
"""Inductor options remat's partition compiles with unless ``options`` say otherwise: the
solver's model holds the model's own layouts. With inductor's layout optimization (channels-
last convolutions on CPU) its layout copies are outside the model: on ResNet-18 the plain
compiled step peaks 80.25 MiB with it, 51.32 MiB without (docs/compile.md)."""


@dataclass
class RegionPlan:
    """What the partitioner did for one compiled region: its DAG, the schedule it solved, the
    graphs (``partition.saved``: what the forward saves; ``partition.recomputes``: DAG node ->
    extra computes), the schedule's cost with the ``once`` penalty taken out (seconds),
    ``member_ops``: DAG node -> the ops of its fx nodes, and ``inlined``: backward DAG node ->
    the forward fx nodes it computes again inside its kernel (`joint_dag.inline_reads`)."""

    dag: nx.DiGraph
    schedule: solver.Schedule
    partition: Partition
    cost: float
    member_ops: dict[str, list[str]]
    inlined: dict[str, list[str]]


class RematPartitioner(CustomPartitionerFn):
    """Partition each joint graph by remat's schedule at ``budget`` bytes (solver budget:
    activations and temporaries of the step) or, with ``budget="min"``, the least peak.

    ``replay_rng`` (the graphs run as they are, ``aot_eager``): a recomputed random op replays
    its draw (`emit.partition`). Ops that mutate, and random ops where draws do not replay
    (inductor: its own seeded random ops recompute deterministically, only the seed op is
    random), must not be recomputed: their cost carries a penalty larger than the whole
    graph's, so the solver recomputes one only where it finds no schedule without it that
    fits, and then the plan is refused: at a byte budget as `_RunsTwice`, on which
    `executor.compile` goes on to "min" (the least peak with such ops once), else as
    `CompileError`. ``fuse`` (inductor): the DAG models inductor's fusion
    (`joint_dag.fuse_groups`): values it computes inside a kernel hold no bytes.
    ``schedules`` (`CompiledModel.load`): graph fingerprint -> a saved schedule's JSON, taken
    instead of solving, checked on the joint graph's DAG (`solver.Schedule.from_json`); a
    joint graph without one is refused (`CompileError`). ``link``: a host link; the solver
    may then offload and reload values at a byte budget (docs/offload.md; "min" stays
    keep/recompute), emitted as torch's offload ops (`executor.compiled.offload`).
    """

    def __init__(
        self,
        budget: int | str,
        deadline: Deadline,
        replay_rng: bool,
        fuse: bool = False,
        schedules: Mapping[str, str] | None = None,
        link: solver.Link | None = None,
    ) -> None:
        self.budget = budget
        self.link = link
        self.replay_rng = replay_rng
        self.fuse = fuse
        self.deadline = deadline
        self.schedules = dict(schedules or {})
        self.regions: list[RegionPlan] = []
        # a recompile of the same joint graph (a guard on Python state the first step changed,
        # e.g. a Hugging Face config's problem_type) takes the schedule solved for it
        self._solved: dict[tuple[str, str, str], solver.Schedule] = {}
        self.solve_seconds = 0.0  # wall seconds in the solver, all regions
        self.cut_short = False  # a solve ended at its deadline before proving its schedule
        self._token = uuid.uuid4().hex  # one plan per instance: no compile cache is shared

    def uuid(self) -> str:
        return f"remat-{self._token}"

    def __deepcopy__(self, memo: dict) -> RematPartitioner:
        """Itself: inductor deep-copies its config (to print it), and this object is one
        compile's plan, recording what it solved and holding the call's deadline and stop."""
        return self

    def __call__(
        self, gm: torch.fx.GraphModule, joint_inputs: Any, **kwargs: Any
    ) -> tuple[torch.fx.GraphModule, torch.fx.GraphModule]:
        num_fwd_outputs = kwargs["num_fwd_outputs"]
        joint = joint_dag(gm, held_bytes=tangent_bytes(gm), fuse=self.fuse)
        dag = joint.dag
        penalty = 10.0 * sum(float(dag.nodes[v]["cost"]) for v in dag.nodes) + 1.0
        once = [v for v in dag.nodes if dag.nodes[v]["once"] and not self._replays(dag, v)]
        for v in once:
            dag.nodes[v]["cost"] = float(dag.nodes[v]["cost"]) + penalty
        total = sum(float(dag.nodes[v]["cost"]) for v in dag.nodes)
        problem = solver.prepare(dag)
        key = (problem.fingerprint, problem.cost_fingerprint, str(sorted(joint.members.items())))
        schedule = self._solved.get(key)
        if schedule is None and self.schedules:
            schedule = self._saved(dag, problem.fingerprint)
            self._solved[key] = schedule
        if schedule is None:
            schedule = self._solve(dag, (total + penalty / 2) / total if once else None)
            self._solved[key] = schedule
        computes: dict = {}
        for kind, v in schedule.ops:
            if kind == "compute":
                computes[v] = computes.get(v, 0) + 1
        again = [v for v in once if computes.get(v, 0) > 1]
        if again:
            self._refuse(dag, again[0], solved=not self.schedules)
        backward = {v for v in dag.nodes if dag.nodes[v]["backward"]}
        cut = partition(
            gm,
            schedule.ops,
            joint.members,
            backward,
            num_fwd_outputs,
            self.replay_rng,
            joint.inlined,
        )
        for module in (cut.forward, cut.backward):
            module.graph.eliminate_dead_code()
            module.recompile()
            transfer.pin_order(module)
        nodes = {n.name: n for n in gm.graph.nodes}
        ops = {v: [str(nodes[m].target) for m in names] for v, names in joint.members.items()}
        cost = schedule.cost - penalty * len(once)
        plan = RegionPlan(dag, schedule, cut, cost, ops, joint.inlined)
        self.regions = [r for r in self.regions if r.schedule is not schedule] + [plan]
        return cut.forward, cut.backward

    def _refuse(self, dag: nx.DiGraph, v: str, solved: bool) -> None:
        """Refuse the schedule that recomputes ``v``, which must run once: at a byte budget
        solved here, `_RunsTwice` (`executor.compile` goes on to "min", whose least-peak
        search keeps such ops once); "min" recomputing it is a defect; a saved schedule's
        budget is too low for it (`CompileError`)."""
        what = (
            f"at budget {self.budget} the schedule recomputes {dag.nodes[v]['op']} (fx node "
            f"'{v}'), which draws random numbers or mutates and must run once"
        )
        if self.budget == "min":
            raise CompileError(
                f"{what}: this is a defect in remat ('min' bounds the recompute): report it "
                "with the model"
            )
        if solved:
            raise _RunsTwice(CompileError(what), str(dag.nodes[v]["op"]))
        raise CompileError(f"{what}: raise the budget")

    def _saved(self, dag: nx.DiGraph, fingerprint: str) -> solver.Schedule:
        """The saved schedule of the joint graph whose DAG has `fingerprint`, replayed on it."""
        text = self.schedules.get(fingerprint)
        if text is None:
            raise CompileError(
                f"no saved schedule for this compiled region (graph {fingerprint}; the file "
                f"has {', '.join(sorted(self.schedules))}): the model's code, its inputs, torch "
                "or the compile options differ from the saved compile's; compile again"
            )
        try:
            return solver.Schedule.from_json(text, dag)
        except RematError as e:
            raise CompileError(f"the saved schedule of graph {fingerprint}: {e}") from e

    def _replays(self, dag: nx.DiGraph, v: str) -> bool:
        """True where ``v`` may recompute: it draws but does not mutate, and draws replay."""
        return self.replay_rng and not dag.nodes[v]["mutates"]

    def _solve(self, dag: nx.DiGraph, compute_budget: float | None) -> solver.Schedule:
        started = time.perf_counter()
        try:
            schedule = self._schedule(dag, compute_budget)
        except (solver.InfeasibleBudgetError, solver.SolverTimeoutError) as e:
            raise _Infeasible(e) from e
        finally:
            self.solve_seconds += time.perf_counter() - started
        self.cut_short |= schedule.status != "OPTIMAL"
        return schedule

    def _schedule(self, dag: nx.DiGraph, compute_budget: float | None) -> solver.Schedule:
        """`solver.solve` at the budget; "min" is the solver's (the least peak, then the least
        cost at it), ``compute_budget`` (a factor of computing every node once; None: none)
        bounding the least-peak search, which keeps the ops that must run once from
        recomputing."""
        least = self.budget == "min"
        limit = compute_budget if least else None
        link = None if least else self.link  # the solver offloads at a byte budget only
        schedule = solver.solve(
            dag, self.budget, compute_budget=limit, offload=link, **_within(self.deadline)
        )
        if least:
            self.cut_short |= schedule.extra["least_peak"]["status"] != "OPTIMAL"
        return schedule


def _within(deadline: Deadline) -> dict[str, Any]:
    """`solver.solve`'s arguments for a solve that ends by ``deadline``."""
    return {"time_limit": max(deadline.remaining(), 0.05), "deadline": deadline}


class _Infeasible(Exception):
    """The solver found no schedule within the budget (carries the solver's error)."""

    def __init__(self, error: Exception) -> None:
        super().__init__(str(error))
        self.error = error


class _RunsTwice(_Infeasible):
    """The schedule solved at a byte budget recomputes ``op``, which must run once: in the
    solver's model (or within its time) no schedule within the budget keeps it once. Carries
    the refusal (`CompileError`)."""

    def __init__(self, error: CompileError, op: str) -> None:
        super().__init__(error)
        self.op = op


def backend(name: str, partitioner: RematPartitioner, options: dict[str, Any]) -> Callable:
    """A ``torch.compile`` backend compiling with ``partitioner`` as the partition: ``name``
    is "inductor" (``options`` are inductor's, as ``torch.compile(options=...)``) or
    "aot_eager" (no options)."""
    if name == "inductor":
        from torch._inductor.compile_fx import compile_fx

        patches = {**LAYOUT, **options, "custom_partitioner_fn": partitioner}
        return functools.partial(compile_fx, config_patches=patches)
    if name == "aot_eager":
        if options:
            raise CompileError(f"backend 'aot_eager' takes no options, got {sorted(options)}")
        from torch._dynamo.backends.common import aot_autograd
        from torch._dynamo.backends.debugging import boxed_nop

        def partition_fn(gm: torch.fx.GraphModule, joint_inputs: Any, **kwargs: Any):
            return partitioner(gm, joint_inputs, **kwargs)

        return aot_autograd(
            fw_compiler=boxed_nop,
            bw_compiler=boxed_nop,
            partition_fn=partition_fn,
            keep_inference_input_mutations=True,
        )
    raise CompileError(
        f"backend {name!r} is not supported by executor.compile: use one of {BACKENDS}"
    )
