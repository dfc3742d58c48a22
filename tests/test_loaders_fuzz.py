"""Malformed graph and schedule files: the loaders raise their one error type with a message,
never anything else, and `remat` turns each into one line on stderr and exit status 2.

Hypothesis draws arbitrary JSON documents and single mutations of valid files (a value replaced
anywhere in the document, a key dropped); deterministic under the CI profile."""

from __future__ import annotations

import copy
import json

import networkx as nx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import solver
from cli.main import main
from solver.examples import residual_demo
from solver.io import graph_from_node_link, save_graph

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**40), max_value=2**40),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=6),
)
json_values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=6), inner, max_size=4)
    ),
    max_leaves=12,
)


def _graph() -> nx.DiGraph:
    return residual_demo(blocks=1)


def _graph_data() -> dict:
    data = nx.node_link_data(_graph(), edges="links")
    data["graph"] = {"order": _graph().graph["order"], "name": "residual", "threads": 1}
    return data


def _schedule_data() -> dict:
    schedule = solver.baseline(_graph(), "checkpoint_all")
    assert schedule is not None
    return json.loads(schedule.to_json())


def _paths(value, prefix=()):
    """Every path into a JSON document (keys and list positions)."""
    yield prefix
    if isinstance(value, dict):
        for key, item in value.items():
            yield from _paths(item, (*prefix, key))
    elif isinstance(value, list):
        for position, item in enumerate(value):
            yield from _paths(item, (*prefix, position))


@st.composite
def mutated(draw, document: dict):
    """`document` with one value replaced by an arbitrary one, or one key or item dropped."""
    data = copy.deepcopy(document)
    paths = [p for p in _paths(data) if p]
    path = draw(st.sampled_from(paths))
    parent = data
    for step in path[:-1]:
        parent = parent[step]
    if draw(st.booleans()):
        parent[path[-1]] = draw(json_values)
    elif isinstance(parent, dict):
        del parent[path[-1]]
    else:
        parent.pop(path[-1])
    return data


def _load_graph(data) -> None:
    """Load and validate; only GraphError may come out."""
    try:
        solver.prepare(graph_from_node_link(data))
    except solver.GraphError as exc:
        assert str(exc)


def _load_schedule(data, graph) -> None:
    """Parse and check against `graph`; only the schedule errors may come out, and a schedule
    that loads is what the simulator says it is."""
    try:
        schedule = solver.Schedule.from_json(json.dumps(data), graph)
    except (solver.InvalidScheduleError, solver.ScheduleMismatchError) as exc:
        assert str(exc)
        return
    replay = solver.simulate(graph, schedule.ops)
    assert replay.valid and replay.peak == schedule.peak and replay.cost == schedule.cost


@settings(max_examples=150)
@given(json_values)
def test_any_json_is_a_graph_or_a_graph_error(data):
    _load_graph(data)


@settings(max_examples=200)
@given(mutated(_graph_data()))
def test_a_mutated_graph_file_loads_or_is_refused_with_a_graph_error(data):
    _load_graph(data)


@settings(max_examples=150)
@given(json_values)
def test_any_json_is_a_schedule_or_a_schedule_error(data):
    _load_schedule(data, _graph())


@settings(max_examples=200)
@given(mutated(_schedule_data()))
def test_a_mutated_schedule_file_loads_consistently_or_is_refused(data):
    _load_schedule(data, _graph())


@pytest.mark.parametrize(
    ("field", "forged"),
    [
        ("cost", 1.0),
        ("peak", 1),
        ("recomputes", 3),
        ("status", "OPTIMAL"),  # a heuristic's schedule, no bound
        ("bound", 1e12),
        ("budget", 1),
    ],
)
def test_a_schedule_file_with_a_forged_claim_is_refused(field, forged):
    data = _schedule_data()
    data[field] = forged
    with pytest.raises(solver.InvalidScheduleError, match="claims"):
        solver.Schedule.from_json(json.dumps(data), _graph())


def test_a_schedule_loaded_on_other_costs_keeps_no_claim_about_its_cost():
    """A new capture measures other times: the schedule is valid there, but its cost and an
    OPTIMAL claim were about the old costs, so the loaded schedule has the replay's cost and
    no status or bound it cannot back."""
    graph = _graph()
    text = solver.solve(graph, "90%", time_limit=10).to_json()
    assert json.loads(text)["status"] == "OPTIMAL"
    for v in graph.nodes:
        graph.nodes[v]["cost"] *= 3
    loaded = solver.Schedule.from_json(text, graph)
    assert loaded.status == "FEASIBLE" and loaded.bound is None
    assert loaded.cost == solver.simulate(graph, loaded.ops).cost
    assert loaded.extra["costs_changed"]


MALFORMED_GRAPHS = {
    "nodes_not_objects": {"nodes": [1, 2], "links": []},
    "links_as_lists": {"nodes": [{"id": 0, "mem": 1, "cost": 1}], "links": [[0, 0]]},
    "order_not_a_list": {"nodes": [{"id": 0, "mem": 1, "cost": 1}], "graph": {"order": 5}},
    "threads_not_positive": {"nodes": [{"id": 0, "mem": 1, "cost": 1}], "graph": {"threads": 0}},
    "unhashable_id": {"nodes": [{"id": [1], "mem": 1, "cost": 1}], "links": []},
    "not_json": "{nodes: ",
}


@pytest.mark.parametrize("name", MALFORMED_GRAPHS)
def test_remat_solve_on_a_malformed_graph_file_is_one_line_and_exit_2(tmp_path, capsys, name):
    path = tmp_path / "g.json"
    content = MALFORMED_GRAPHS[name]
    path.write_text(content if isinstance(content, str) else json.dumps(content))
    assert main(["solve", str(path), "--quiet", "--time-limit", "1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("remat: error:") and err.count("\n") == 1


def test_remat_run_on_a_malformed_schedule_file_is_one_line_and_exit_2(tmp_path, capsys):
    data = _schedule_data()
    del data["peak"]
    path = tmp_path / "s.json"
    path.write_text(json.dumps(data))
    save_graph(_graph(), tmp_path / "g.json")
    with pytest.raises(solver.InvalidScheduleError, match="lacks peak"):
        solver.Schedule.load(path, _graph())
    assert main(["run", "--demo", "gpt", "--schedule", str(path), "--steps", "2"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("remat: error:") and err.count("\n") == 1
