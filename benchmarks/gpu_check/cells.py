"""The cells: each runtime's step on one model (`CELLS`), its setup and capture phases, each
under its own time limit (`guarded`), in order (`model_cells`)."""

from __future__ import annotations

import contextlib
import signal
import time
from collections.abc import Callable, Iterator

import torch

from benchmarks.gpu_check.spec import RUNTIMES, Cell, Mismatch, NoCopy, Run, Unsure
from benchmarks.running.breadth_report import _refusal


class CellTimeout(Exception):
    """A cell ran past its time limit."""


class Skipped(Exception):
    """A cell the run leaves out (why, in one line)."""


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
    """The reference step and eager's repeat."""
    run.reference_and_repeat()


def capture_phase(run: Run) -> None:
    """Capture the model on the device (module granularity) and solve the least peak within a
    share of the limit: the own executor's midway budget, and its offload budget, below that
    least peak and above the one-op floor (`offload_budget`)."""
    import solver
    from graph_capture import capture

    model = run.fresh()
    repeats = 3 if run.device.type == "cuda" else 2
    captured = capture(model, run.inputs, granularity="module", repeats=repeats)
    problem = solver.prepare(captured.dag)
    full = solver.checkpoint_all_peak(problem)
    least = solver.solve(captured.dag, objective="memory", time_limit=run.limit("capture") / 5)
    run.shared.update(
        captured=captured,
        model=model,
        buffers=[b.detach().clone() for b in model.buffers()],
        grad_bytes=sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad),
        budget=(least.peak + full) // 2,
        offload_budget=offload_budget(least.peak, problem.one_line_floor),
        least=least.peak,
        plain_s=problem.total_cost,
    )


def offload_budget(least: int, floor: int) -> int | None:
    """A budget that only offload meets: an eighth of the way from keep/recompute's least peak
    found (`least`) down to the one-op floor (bytes no schedule goes below, with offload too),
    at least a byte below `least`; None where no byte lies between."""
    if least - 1 <= floor:
        return None
    return max(floor, least - max(1, (least - floor) // 8))


def eager_cell(run: Run, cell: Cell) -> None:
    model = run.fresh()
    cell.predicted_s = run.shared.get("plain_s")
    cell.grads = "repeats bit for bit" if run.repeats is None else f"does not repeat: {run.repeats}"
    run.measure(cell, model, model, grads_before=True)


def remat_cell(run: Run, cell: Cell, offload: bool) -> None:
    import solver
    from executor import Rematerialized
    from executor.traced.offload import link_on
    from solver.target.devices import named_link

    if "captured" not in run.shared:
        raise RuntimeError("no capture (see the capture's failure)")
    captured, model = run.shared["captured"], run.shared["model"]
    with torch.no_grad():  # the cells before advanced them (BatchNorm's running statistics)
        for buffer, pristine in zip(model.buffers(), run.shared["buffers"], strict=True):
            buffer.copy_(pristine)
    cell.budget = run.shared["offload_budget" if offload else "budget"]
    if cell.budget is None:
        raise NoCopy(
            f"keep/recompute's least peak found ({run.shared['least']} B) is the one-op floor: "
            "no budget below it leaves room for a copy"
        )
    # the link's host rounding is the pool's on the device the copies run on
    device = next(model.parameters()).device
    link = link_on(named_link(run.link_name), device) if offload else None
    # a fifth of the limit: near the one-op floor the offload model's solve runs to its time
    # limit (FEASIBLE), its schedule at the floor
    schedule = solver.solve(
        captured.dag, cell.budget, time_limit=run.limit(cell.runtime) / 5, offload=link
    )
    rm = Rematerialized(model, captured, schedule)
    cell.status = schedule.status
    cell.predicted_peak, cell.predicted_s = schedule.peak, schedule.cost
    if offload:
        cell.predicted_host_peak = schedule.extra.get("host_peak", 0)
        cell.copies = sum(kind == "offload" for kind, _ in schedule.ops)
        cell.moved = f"{cell.copies} offloads"
    cell.grads = run.check(rm, model, exact=True)
    if rm.host_pool is not None:
        rm.host_pool.reset_peak()
    run.measure(cell, rm, model, grads_before=True)
    if rm.host_pool is not None:
        cell.measured_host_peak = rm.host_pool.host_peak
    if offload:
        moves(cell, f"at {cell.budget} B, below keep/recompute's least peak found")


def moves(cell: Cell, where: str) -> None:
    """`NoCopy` where the offload cell's plan moves no copy (the cell's other figures stand)."""
    if not cell.copies:
        raise NoCopy(f"the plan {where} moves nothing to the host: not an offload check")


def sac_cell(run: Run, cell: Cell, offload: bool) -> None:
    """The model planned on the device (`checkpoint_plan` measured there: the device's op
    stream, its allocation events, seconds synchronized) and the plan applied to a fresh
    copy. ``sac``: at the midway budget between the least plan and the plain step;
    ``sac+offload``: the least plan with the link, below keep/recompute's least where a parked
    region is what gets there; its per-copy overhead is measured on the device too."""
    import executor

    planned = run.fresh()

    def plan_at(budget: str | int, link: str | None, share: float) -> executor.CheckpointPlan:
        return executor.checkpoint_plan(
            planned,
            run.inputs,
            budget,
            time_limit=run.limit(cell.runtime) * share,
            offload=link,
        )

    if offload:
        plan = plan_at("min", run.link_name, 0.6)
    else:
        least = plan_at("min", None, 0.4)
        run.shared["sac_least"] = least.peak
        plan = plan_at((least.peak + least.plain_peak) // 2, None, 0.4)
    cell.budget, cell.status, cell.predicted_peak = plan.budget, plan.status, plan.peak
    plain_s = run.shared.get("plain_s")
    cell.predicted_s = None if plain_s is None else plain_s + plan.cost
    if offload:
        cell.predicted_host_peak = plan.host_peak
        ops, parked = sum(len(o) for o in plan.offloads()), sum(plan.plain_offloads())
        cell.copies = ops + parked
        seconds = plan.problem.blocks.offload_seconds
        cell.moved = (
            f"{ops} ops offloaded, {parked} regions parked; {seconds * 1e6:.0f} us overhead "
            f"per copy, measured on the device ({run.device})"
        )
    model = plan.apply(run.fresh())
    cell.grads = run.check(model, model, exact=True)
    run.measure(cell, model, model, grads_before=False)
    if offload and run.device.type == "cpu":
        from executor.sac.runtime.offload import measure_split

        model.zero_grad(set_to_none=True)
        with torch.random.fork_rng(devices=[]):
            split = measure_split(lambda: run.step(model))
        model.zero_grad(set_to_none=True)
        cell.measured_peak, cell.measured_host_peak = split.device_peak, split.host_peak
    if offload:
        least = run.shared.get("sac_least")
        below = "" if least is None else f" (keep/recompute's least: {least} B)"
        moves(cell, f"at its least peak {plan.peak} B{below}")


def compile_cell(run: Run, cell: Cell, offload: bool) -> None:
    import executor
    from solver.target.devices import named_link

    if not run.compiles:
        raise Skipped(
            f"{run.name} is not in --compile-models: inductor compiles take up to "
            f"{run.limit(cell.runtime):g} s per cell, and the 10 minutes hold one model's"
        )
    model = run.fresh()
    if "captured" not in run.shared:
        raise RuntimeError("no budget: the capture failed (see its cell)")
    own = run.shared["offload_budget" if offload else "budget"]
    if own is None:
        raise NoCopy("keep/recompute's least peak found is the one-op floor: no room for a copy")
    # the own executor's budget has `.grad` allocated before the step; compile's peak holds the
    # gradients the step creates
    cell.budget = own + run.shared["grad_bytes"]
    extra = {"offload": named_link(run.link_name)} if offload else {}
    cm = executor.compile(
        model,
        run.inputs,
        cell.budget,
        time_limit=run.limit(cell.runtime) * 0.9,
        max_compiles=2,
        backend=run.backend,
        **extra,
    )
    regions = cm.remat.regions
    if offload:
        ops = [kind for r in regions for kind, _ in r.schedule.ops]
        cell.copies = ops.count("offload")
        cell.moved = f"{cell.copies} offloads, {ops.count('reload')} reloads"
    cell.predicted_peak = max(r.schedule.peak for r in regions)
    cell.predicted_s = sum(r.cost for r in regions)
    cell.status = ", ".join(sorted({r.schedule.status for r in regions}))
    cell.grads = run.check(cm, model, exact=run.backend == "aot_eager")
    run.measure(cell, cm, model, grads_before=False)
    if offload:
        moves(cell, f"at {cell.budget} B, below keep/recompute's least peak found")


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
    except Unsure as unsure:
        cell.result = f"UNSURE: {unsure}"
    except NoCopy as none:
        cell.result = f"no copy: {none}"
    except Skipped as skipped:
        cell.result = f"skipped: {skipped}"
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
