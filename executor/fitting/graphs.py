"""A model's captured DAG as a function of the size (batch or sequence length).

`SizedGraphs` captures the model at a few sizes and checks, node by node, that every node's
`mem` and `transient` bytes are affine in the size: `mem(s) = mem(a) + slope * (s - a)` with a
whole slope, the same at every pair of captured sizes. Where they are, the graph at another size
is that affine function (`predicted`), until `capture` replaces it by a real capture. Where they
are not, every size asked for is captured (`affine` is False, `not_affine` names the nodes).
A graph whose nodes or edges change with the size is refused (`FitError`): the proof at size + 1
would be about another graph. Below the captured sizes, where a model's graph often differs (a
language model at sequence length 1), `stable_from` finds the least size with the captured shape.

Costs are the ones of the largest captured size at every size (NOTE [monotone sizes] in
`solver.fitting.search`: the schedules within a compute cap are then the same at every size).
"""

from __future__ import annotations

import time
import types
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import networkx as nx
import torch
from torch import nn

from executor.errors import FitError
from executor.loss import step_loss
from graph_capture import capture
from graph_capture.captured import CapturedGraph
from graph_capture.errors import CaptureError
from graph_capture.models.factories import Made, unpack_model
from solver.fitting.sizes import affine

BYTES = ("mem", "transient")
"""The node attributes that must be affine in the size."""


def with_loss(
    factory: Callable[[int], object], loss_fn: Callable[[object], torch.Tensor]
) -> Callable[[int], Made]:
    """`factory` whose models' forward returns `loss_fn` of their output (set on each model
    it builds, so that module names, and what capture attributes to them, stay the model's)."""

    def made(size: int) -> Made:
        model, inputs, kwargs = unpack_model(factory(size))
        model.remat_loss_fn = loss_fn
        model.forward = types.MethodType(_loss_forward, model)
        return model, inputs, kwargs

    return made


def _loss_forward(model: nn.Module, *args: object, **kwargs: object) -> torch.Tensor:
    return step_loss(model.remat_loss_fn, type(model).forward(model, *args, **kwargs), FitError)


def build(factory: Callable[[int], object], size: int, dim: str) -> Made:
    """`factory(size)` as ``(model, inputs, kwargs)``; FitError saying which size failed and
    why."""
    try:
        return unpack_model(factory(size))
    except CaptureError as error:
        raise FitError(f"the factory at {dim} {size}: {error}") from error
    except Exception as error:  # the user's code: any failure is reported with its size
        raise FitError(
            f"the factory failed at {dim} {size}: {type(error).__name__}: {error}"
        ) from error


@dataclass
class Captured:
    """One size, built and captured: the model, its inputs and the capture."""

    made: Made
    graph: CapturedGraph


class SizedGraphs:
    """The DAG at any size: captured, or affine between captures (module docstring)."""

    def __init__(
        self,
        factory: Callable[[int], object],
        sizes: Sequence[int],
        dim: str,
        capture_options: Mapping[str, object] | None = None,
    ) -> None:
        if len(sizes) < 3 or sorted(set(sizes)) != list(sizes) or sizes[0] < 1:
            raise FitError(f"capture sizes must be 3 or more increasing sizes >= 1: {sizes}")
        self.factory, self.dim = factory, dim
        # fit's budgets are bytes: no plain step's peak (a percentage's basis) to measure
        self.options = dict(capture_options or {})
        self.captures: dict[int, Captured] = {}
        self.seconds: dict[int, float] = {}  # each capture's wall time (build and capture)
        for size in sizes:
            self.capture(size)
        self.sizes = list(sizes)
        reference = self.captures[sizes[-1]].graph.dag
        self.costs = {v: a["cost"] for v, a in reference.nodes(data=True)}
        self.not_affine = _not_affine({s: self.captures[s].graph.dag for s in sizes})
        self.affine = not self.not_affine

    def flat(self) -> bool:
        """Whether no node's bytes change across the captured sizes (affine with slope 0
        everywhere): then nothing in the graph bounds the size."""
        first, *rest = (self.captures[s].graph.dag for s in self.sizes)
        return self.affine and all(
            g.nodes[v].get(key, 0) == a.get(key, 0)
            for g in rest
            for v, a in first.nodes(data=True)
            for key in BYTES
        )

    def capture(self, size: int) -> Captured:
        """The model built and captured at `size` (cached); FitError where its nodes or edges
        differ from the first capture's."""
        if size not in self.captures:
            captured = self._capture(size)
            if self.captures:
                first_size, first = next(iter(self.captures.items()))
                different = _shape_difference(first.graph.dag, first_size, captured.graph.dag, size)
                if different:
                    raise FitError(
                        f"the captured graph changes shape with the {self.dim}: {different}; "
                        "remat fit needs one graph at every size (fix the shapes that depend "
                        "on the size, or fit a range where the graph is fixed)"
                    )
            self.captures[size] = captured
        return self.captures[size]

    def _capture(self, size: int) -> Captured:
        started = time.perf_counter()
        model, inputs, kwargs = made = build(self.factory, size, self.dim)
        try:
            graph = capture(model, inputs, example_kwargs=kwargs, **self.options)
        except CaptureError as error:
            raise FitError(f"capture at {self.dim} {size}: {error}") from error
        self.seconds[size] = time.perf_counter() - started
        return Captured(made, graph)

    def stable_from(self, low: int) -> tuple[int, str | None]:
        """The least size from `low` whose graph has the captured sizes' nodes and edges,
        capturing upward from `low` to the first captured size, and a note naming the sizes
        skipped (None where none were)."""
        first = self.sizes[0]
        reference = self.captures[first].graph.dag
        skipped: list[str] = []
        for size in range(low, first):
            captured = self._capture(size)
            different = _shape_difference(reference, first, captured.graph.dag, size)
            if not different:
                self.captures[size] = captured
                break
            skipped.append(different)
        else:
            size = max(low, first)
        if not skipped:
            return size, None
        return size, (
            f"the graph changes shape below {self.dim} {size} ({'; '.join(skipped[:2])}): "
            f"the search starts at {size}"
        )

    def expected_seconds(self, size: int) -> float:
        """Seconds a capture at `size` is expected to take (0.0 where it is captured)."""
        return 0.0 if size in self.captures else expected_seconds(self.seconds)

    def __call__(self, size: int) -> nx.DiGraph:
        """The DAG at `size` with the reference costs: captured where it was (or where bytes
        are not affine), else the affine prediction."""
        if size in self.captures or not self.affine:
            graph = self.capture(size).graph.dag.copy()
        else:
            graph = self.predicted(size)
        nx.set_node_attributes(graph, self.costs, "cost")
        return graph

    def predicted(self, size: int) -> nx.DiGraph:
        """The affine prediction at `size` from the first two captured sizes (affine only)."""
        a, b = self.sizes[0], self.sizes[1]
        low, high = self.captures[a].graph.dag, self.captures[b].graph.dag
        graph = low.copy()
        for v, attrs in graph.nodes(data=True):
            for key in BYTES:
                if key in attrs:
                    attrs[key] = affine({a: attrs[key], b: high.nodes[v][key]})(size)
        return graph

    def refute(self, size: int) -> bool:
        """Capture at `size` and compare with the affine prediction; where they differ, every
        size is captured from now on (`affine` False, `not_affine` the differences). Whether
        the prediction was refuted."""
        wrong = self.mismatches(size)
        if wrong:
            self.affine = False
            self.not_affine = [f"at {self.dim} {size}: {m}" for m in wrong]
        return bool(wrong)

    def mismatches(self, size: int) -> list[str]:
        """Where the capture at `size` differs from the affine prediction: "node key: predicted
        != captured" (empty where they agree or where nothing is predicted)."""
        if not self.affine:
            return []
        captured, predicted = self.capture(size).graph.dag, self.predicted(size)
        return [
            f"{v} {key}: {predicted.nodes[v].get(key, 0)} != {attrs.get(key, 0)}"
            for v, attrs in captured.nodes(data=True)
            for key in BYTES
            if predicted.nodes[v].get(key, 0) != attrs.get(key, 0)
        ]


def expected_seconds(seconds: Mapping[int, float]) -> float:
    """Seconds the next piece of work is expected to take, from the `seconds` the same work
    took at other sizes: the longest of them (the first, slowed by warm-ups, among them). It
    underestimates only where the time grows with the size well beyond the sizes done, which
    on the models measured it does not: a capture's time is mostly tracing."""
    return max(seconds.values(), default=0.0)


def _shape_difference(a: nx.DiGraph, size_a: int, b: nx.DiGraph, size_b: int) -> str | None:
    """How the graphs at two sizes differ in nodes or edges (None: they do not)."""
    if set(a.nodes) == set(b.nodes) and set(a.edges) == set(b.edges):
        return None
    return (
        f"{a.number_of_nodes()} nodes and {a.number_of_edges()} edges at {size_a}, "
        f"{b.number_of_nodes()} and {b.number_of_edges()} at {size_b}"
    )


def _not_affine(graphs: dict[int, nx.DiGraph]) -> list[str]:
    """The nodes whose bytes are not affine with a whole slope across the captured sizes."""
    first = graphs[min(graphs)]
    return [
        f"{v}.{key}"
        for v in first.nodes
        for key in BYTES
        if affine({s: g.nodes[v].get(key, 0) for s, g in graphs.items()}) is None
    ]
