"""Ctrl-C during a solve: the first returns the best schedule found, the second aborts.

Each test sends SIGINT on an event of the solve (a progress report, a line on stderr), never
after a fixed sleep, and checks how soon the answer comes after it."""

from __future__ import annotations

import os
import random
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import networkx as nx
import pytest
from solver_checks import GRAPHS

import solver
from cli.main import main
from solver.deadline import Deadline, Stop
from solver.exact.offload.search import OffloadProblem, solve_with_offload
from solver.examples import training_graph
from solver.interrupt import first_sigint_stops
from solver.io import load_graph, save_graph

RANDOM_1000 = GRAPHS / "random_layered_n1000_w0.31_nlv0.75_ed0.2_scd0.14.json"
needs_random_1000 = pytest.mark.skipif(not RANDOM_1000.exists(), reason="published graphs absent")


@pytest.fixture(autouse=True)
def python_handles_sigint():
    """SIGINT with Python's default handler for the test, as in a terminal (a shell starts
    background jobs with SIGINT ignored, and the solver then leaves it so)."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


def _sigint_as_in_a_terminal() -> None:
    """In the child before exec: SIGINT's default action, so that Python installs its handler."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


LIMIT = 120
"""Seconds: the time limit of the solves below, which the SIGINT, not the limit, must end."""

PROMPT = LIMIT / 2
"""Seconds from the SIGINT to the answer at most: a solve that ignored the stop would run to
its limit, while the stop itself takes well under one second (the rest is the replay). Half
the limit separates the two whatever the load on the machine."""


def test_first_sigint_requests_the_stop_and_the_second_raises():
    stop, notices = Stop(), []
    with pytest.raises(KeyboardInterrupt), first_sigint_stops(stop, lambda: notices.append(1)):
        signal.raise_signal(signal.SIGINT)
        assert stop.requested()
        signal.raise_signal(signal.SIGINT)
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    assert notices == [1]  # from the watcher thread, joined when the block ends


def test_sigint_while_the_main_thread_holds_the_stops_lock_requests_the_stop():
    # The handler runs in the main thread between two bytecodes, here inside the stop's own
    # lock (as in `Stop.calling`): a handler taking that lock would wait for itself forever.
    # A watchdog releases the lock if the handler has not returned after WATCHDOG seconds.
    stop, returned, stuck = Stop(), threading.Event(), []

    def watchdog() -> None:
        if not returned.wait(WATCHDOG):
            stuck.append(True)
            stop._lock.release()

    with first_sigint_stops(stop):
        stop._lock.acquire()
        threading.Thread(target=watchdog, daemon=True).start()
        signal.raise_signal(signal.SIGINT)
        returned.set()
        assert stop.requested()
        if not stuck:
            stop._lock.release()
    assert not stuck, "the SIGINT handler waited for a lock the main thread held"


WATCHDOG = 20.0
"""Seconds after which a handler that has not returned is taken as deadlocked (it returns in
microseconds when it takes no lock)."""


def test_two_sigints_during_one_engine_call_still_abort():
    # Both arrive while the main thread runs no Python (it joins a thread that signals itself
    # twice), so Python runs the handler once; the block still ends in KeyboardInterrupt.
    stop = Stop()

    def signal_twice() -> None:
        for _ in range(2):
            signal.pthread_kill(threading.get_ident(), signal.SIGINT)

    with pytest.raises(KeyboardInterrupt), first_sigint_stops(stop):
        thread = threading.Thread(target=signal_twice)
        thread.start()
        thread.join()
        assert stop.requested()


def test_outside_the_main_thread_sigint_is_left_alone():
    seen = []

    def run() -> None:
        with first_sigint_stops(Stop()):
            seen.append(signal.getsignal(signal.SIGINT))

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    assert seen == [signal.default_int_handler]


@needs_random_1000
def test_sigint_during_an_engine_returns_the_best_schedule_with_its_bound():
    graph = load_graph(RANDOM_1000)
    sent: list[float] = []
    bounds: list[float] = []

    def progress(seconds: float, objective: float, bound: float) -> None:
        bounds.append(bound)
        if not sent and bound > bounds[0]:  # an engine raised the bound: one is running
            sent.append(time.perf_counter())
            os.kill(os.getpid(), signal.SIGINT)

    schedule = solver.solve(graph, "90%", time_limit=LIMIT, progress=progress)
    returned = time.perf_counter()
    assert sent, "no engine reported a bound"
    assert returned - sent[0] < PROMPT
    assert schedule.extra["interrupted"] is True
    assert schedule.status == "FEASIBLE" and schedule.bound <= schedule.cost
    assert schedule.bound >= max(bounds) - 1e-6 * schedule.cost  # the proven bound comes back
    solver.simulate(graph, schedule.ops).raise_if_invalid()
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


class _SigintOn:
    """A stderr that sends SIGINT to this process on the first line containing each of
    `triggers`, in order (the CLI's progress, then its notice)."""

    def __init__(self, *triggers: str) -> None:
        self.triggers, self.text = list(triggers), ""

    def write(self, text: str) -> int:
        self.text += text
        line = self.text.rstrip("\n").rpartition("\n")[2]
        if text.endswith("\n") and self.triggers and self.triggers[0] in line:
            self.triggers.pop(0)
            os.kill(os.getpid(), signal.SIGINT)
        return len(text)

    def flush(self) -> None:
        pass


@needs_random_1000
def test_a_second_sigint_aborts_the_command_with_one_line(monkeypatch, capsys):
    err = _SigintOn("incumbent", "interrupted")
    monkeypatch.setattr(sys, "stderr", err)
    assert main(["solve", str(RANDOM_1000), "--budget", "90%", "--time-limit", str(LIMIT)]) == 130
    assert err.text.splitlines()[-1] == "remat: interrupted: aborted"
    assert "exact" not in capsys.readouterr().out


@needs_random_1000
def test_remat_solve_prints_its_table_after_the_first_sigint(tmp_path):
    out = tmp_path / "s.json"
    command = [sys.executable, "-m", "cli.main", "solve", str(RANDOM_1000)]
    command += ["--budget", "90%", "--time-limit", str(LIMIT), "--out", str(out)]
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    process = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        preexec_fn=_sigint_as_in_a_terminal,
    )
    assert process.stderr is not None
    for line in process.stderr:  # the search is running once it reports
        if "incumbent" in line:
            break
    sent = time.perf_counter()
    process.send_signal(signal.SIGINT)
    stdout, stderr = process.communicate(timeout=LIMIT)
    assert time.perf_counter() - sent < PROMPT
    assert process.returncode == 0, stderr
    exact = next(line for line in stdout.splitlines() if line.startswith("exact"))
    assert "FEASIBLE" in exact
    assert "(interrupted: no heuristic rows)" in stdout
    assert "interrupted: returning the best schedule found" in stderr
    assert solver.Schedule.load(out, load_graph(RANDOM_1000)).extra["interrupted"] is True


def _hard_training_graph(n: int = 60, seed: int = 0) -> nx.DiGraph:
    """The training graph of a random forward DAG of `n` nodes (a chain with skips, random
    bytes and costs) whose solves at 50% run to their time limit, keep/recompute and offload
    alike (40 s each on two cores), reporting incumbents as they go."""
    rng = random.Random(seed)
    forward = nx.DiGraph()
    for i in range(n):
        forward.add_node(i, mem=rng.randint(1, 100), cost=rng.uniform(1, 10))
        if i:
            forward.add_edge(i - 1, i)
        if i > 3 and rng.random() < 0.3:
            forward.add_edge(rng.randrange(i - 3), i)
    return training_graph(forward)


SLOW_LINK = solver.Link(5, 5)
"""5 bytes per cost unit each way: copies that cost, so that offload has a search to do."""


def test_an_offload_solve_stopped_returns_its_incumbent_marked_interrupted():
    # the stop of the first Ctrl-C, requested before the offload solve begins (as when it
    # came during the keep/recompute solve before it): the incumbent comes back at once
    graph = _hard_training_graph()
    problem = solver.prepare(graph)
    budget = solver.checkpoint_all_peak(problem) // 2
    start = solver.solve(graph, budget, time_limit=2)
    stop = Stop()
    stop.request()
    began = time.perf_counter()
    schedule = solve_with_offload(
        OffloadProblem(graph, problem, budget, SLOW_LINK), Deadline.after(LIMIT, stop), start=start
    ).schedule
    assert time.perf_counter() - began < PROMPT
    assert schedule.extra["interrupted"] is True and schedule.cost <= start.cost
    assert schedule.extra["offload_model"] == "interrupted before the exact offload model was built"
    assert [step["step"] for step in schedule.extra["steps"]] == [
        "checkpoint-all",
        "offload heuristics from checkpoint-all",
        "offload heuristics from keep/recompute",
        "offload model",
    ]
    solver.simulate(graph, schedule.ops, SLOW_LINK).raise_if_invalid()


def _offload_command(tmp_path: Path) -> list[str]:
    """`remat solve` of `_hard_training_graph` with --offload over `SLOW_LINK`, --out s.json."""
    save_graph(_hard_training_graph(), tmp_path / "g.json")
    link = f"{SLOW_LINK.d2h / 1e9:g},{SLOW_LINK.h2d / 1e9:g}"
    command = ["solve", str(tmp_path / "g.json"), "--budget", "50%", "--offload", link]
    return [*command, "--time-limit", str(LIMIT), "--out", str(tmp_path / "s.json")]


def test_one_sigint_ends_remat_solve_offload_with_its_table(tmp_path, monkeypatch, capsys):
    # the SIGINT comes during the keep/recompute solve: the offload solve after it and the
    # heuristic rows are ended by the same stop, and the table is printed at once
    err = _SigintOn("incumbent")
    monkeypatch.setattr(sys, "stderr", err)
    sent = time.perf_counter()
    assert main(_offload_command(tmp_path)) == 0
    assert time.perf_counter() - sent < PROMPT
    out = capsys.readouterr().out
    assert re.search(r"^exact \+ offload .* FEASIBLE", out, re.MULTILINE)
    assert "(interrupted: no heuristic rows)" in out
    assert err.text.count("interrupted: returning the best schedule found") == 1
    saved = solver.Schedule.load(tmp_path / "s.json", load_graph(tmp_path / "g.json"))
    assert saved.extra["interrupted"] is True and saved.link == SLOW_LINK


def test_a_second_sigint_aborts_remat_solve_offload(tmp_path, monkeypatch, capsys):
    err = _SigintOn("incumbent", "interrupted")
    monkeypatch.setattr(sys, "stderr", err)
    assert main(_offload_command(tmp_path)) == 130
    assert err.text.splitlines()[-1] == "remat: interrupted: aborted"
    assert "exact" not in capsys.readouterr().out
