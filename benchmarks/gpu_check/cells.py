"""The cells: each runtime's step on one model (`CELLS`), its setup and capture phases, each
under its own time limit (`guarded`), in order (`model_cells`)."""

from __future__ import annotations

import contextlib
import copy
import signal
import time
from collections.abc import Callable, Iterator

import torch

from benchmarks.gpu_check.spec import RUNTIMES, Cell, Mismatch, Run, _rng_devices
from benchmarks.running.breadth_report import _refusal


class CellTimeout(Exception):
    """A cell ran past its time limit."""


@contextlib.contextmanager
def time_limit(seconds: float, what: str) -> Iterator[None]:
    """Raise `CellTimeout` in the main thread once `seconds` have passed (SIGALRM; Python code
    only: a C++ call returns first)."""

    def expire(signum: int, frame: object) -> None:
        raise CellTimeout(f"{what} ran past its limit of {seconds:g} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def setup(run: Run) -> None:
    """The inputs on the device and the reference step (eager, from `.grad` None)."""
    run.inputs = tuple(t.to(run.device) for t in run.bench.inputs)
    model = run.fresh()
    with torch.random.fork_rng(devices=_rng_devices(run.device)):
        run.reference = run.state(model, run.step(model))


def capture_phase(run: Run) -> None:
    """Capture the model on the device (module granularity) and solve the least peak within a
    share of the limit: the own executor's midway budget."""
    import solver
    from graph_capture import capture

    model = run.fresh()
    repeats = 3 if run.device.type == "cuda" else 2
    captured = capture(model, run.inputs, granularity="module", repeats=repeats)
    problem = solver.prepare(captured.dag)
    full = solver.checkpoint_all_peak(problem)
    least = solver.solve(captured.dag, objective="memory", time_limit=run.limit("capture") / 4)
    run.shared.update(
        captured=captured,
        model=model,
        budget=(least.peak + full) // 2,
        plain_s=problem.total_cost,
    )


def eager_cell(run: Run, cell: Cell) -> None:
    model = run.fresh()
    cell.predicted_s = run.shared.get("plain_s")
    cell.grads = run.check(model, model, exact=True)
    run.measure(cell, model, model, grads_before=True)


def remat_cell(run: Run, cell: Cell, offload: bool) -> None:
    import solver
    from executor import Rematerialized
    from executor.traced.offload import link_on
    from solver.target.devices import named_link

    if "captured" not in run.shared:
        raise RuntimeError("no capture (see the capture's failure)")
    captured, model = run.shared["captured"], run.shared["model"]
    cell.budget = run.shared["budget"]
    # the link's host rounding is the pool's on the device the copies run on
    device = next(model.parameters()).device
    link = link_on(named_link(run.link_name), device) if offload else None
    schedule = solver.solve(
        captured.dag, cell.budget, time_limit=run.limit(cell.runtime) / 2, offload=link
    )
    rm = Rematerialized(model, captured, schedule)
    cell.status = schedule.status
    cell.predicted_peak, cell.predicted_s = schedule.peak, schedule.cost
    if offload:
        cell.host_predicted = schedule.extra.get("host_peak", 0)
        cell.copies = f"{sum(kind == 'offload' for kind, _ in schedule.ops)} offloads"
    cell.grads = run.check(rm, model, exact=True)
    if rm.host_pool is not None:
        rm.host_pool.reset_peak()
    run.measure(cell, rm, model, grads_before=True)
    if rm.host_pool is not None:
        cell.host_measured = rm.host_pool.peak_bytes


def sac_cell(run: Run, cell: Cell, offload: bool) -> None:
    import executor

    planned = copy.deepcopy(run.bench.model)  # recorded on the CPU, or estimated for a target

    def plan_at(budget: str | int, link: str | None, share: float) -> executor.CheckpointPlan:
        return executor.checkpoint_plan(
            planned,
            run.bench.inputs,
            budget,
            time_limit=run.limit(cell.runtime) * share,
            target=run.target,
            offload=link,
        )

    if "sac_budget" not in run.shared:
        least = plan_at("min", None, 0.4)
        run.shared["sac_budget"] = (least.peak + least.plain_peak) // 2
    cell.budget = run.shared["sac_budget"]
    plan = plan_at(cell.budget, run.link_name if offload else None, 0.4)
    cell.status, cell.predicted_peak = plan.status, plan.peak
    plain_s = run.shared.get("plain_s")
    cell.predicted_s = None if plain_s is None else plain_s + plan.cost
    if offload:
        cell.host_predicted = plan.host
        ops, parked = sum(len(o) for o in plan.offloads()), sum(plan.plain_offloads())
        cell.copies = f"{ops} ops, {parked} regions parked"
    model = plan.apply(run.fresh())
    cell.grads = run.check(model, model, exact=True)
    run.measure(cell, model, model, grads_before=False)
    if offload and run.device.type == "cpu":
        from executor.sac.offload import measure_split

        model.zero_grad(set_to_none=True)
        with torch.random.fork_rng(devices=[]):
            split = measure_split(lambda: run.step(model))
        model.zero_grad(set_to_none=True)
        cell.measured_peak, cell.host_measured = split.device, split.host


def compile_cell(run: Run, cell: Cell, offload: bool) -> None:
    import executor
    from solver.target.devices import named_link

    model = run.fresh()
    cell.budget = run.shared.get("budget")
    if cell.budget is None:
        raise RuntimeError("no budget: the capture failed (see its cell)")
    extra = {"offload": named_link(run.link_name)} if offload else {}
    cm = executor.compile(
        model,
        run.inputs,
        cell.budget,
        time_limit=run.limit(cell.runtime) * 0.8,
        max_compiles=2,
        backend=run.backend,
        **extra,
    )
    regions = cm.remat.regions
    if offload:
        ops = [kind for r in regions for kind, _ in r.schedule.ops]
        cell.copies = f"{ops.count('offload')} offloads, {ops.count('reload')} reloads"
    cell.predicted_peak = max(r.schedule.peak for r in regions)
    cell.predicted_s = sum(r.cost for r in regions)
    cell.status = ", ".join(sorted({r.schedule.status for r in regions}))
    cell.grads = run.check(cm, model, exact=run.backend == "aot_eager")
    run.measure(cell, cm, model, grads_before=False)


CELLS: dict[str, Callable[[Run, Cell], None]] = {
    "eager": eager_cell,
    "remat": lambda run, cell: remat_cell(run, cell, offload=False),
    "remat+offload": lambda run, cell: remat_cell(run, cell, offload=True),
    "sac": lambda run, cell: sac_cell(run, cell, offload=False),
    "sac+offload": lambda run, cell: sac_cell(run, cell, offload=True),
    "compile": lambda run, cell: compile_cell(run, cell, offload=False),
    "compile+offload": lambda run, cell: compile_cell(run, cell, offload=True),
}


def guarded(run: Run, cell: Cell, phase: str, work: Callable[[], None]) -> Cell:
    """Run `work` under the phase's time limit; any failure becomes the cell's result."""
    start = time.perf_counter()
    try:
        with time_limit(run.limit(phase), f"{run.name} {phase}"):
            work()
        cell.result = "ok"
    except Mismatch as wrong:
        cell.result = f"WRONG: {wrong}"
    except Exception as error:
        cell.result = _refusal(error)
    cell.seconds = time.perf_counter() - start
    if run.device.type == "cuda":
        torch.cuda.empty_cache()
    return cell


def model_cells(run: Run) -> Iterator[Cell]:
    """The setup and capture phases (reported as cells only where they fail), then each
    runtime's cell, in order."""
    for phase, work in (("setup", setup), ("capture", capture_phase)):
        done = guarded(run, Cell(run.name, phase), phase, lambda w=work: w(run))
        if done.result != "ok":
            yield done
            if phase == "setup":
                return
    for runtime in RUNTIMES:
        cell = Cell(run.name, runtime)
        yield guarded(run, cell, runtime, lambda c=cell: CELLS[c.runtime](run, c))
