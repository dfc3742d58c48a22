"""The fit on its one deadline (`fit_sizes`): the step's bytes at any size (`step_bytes`), the
largest size proven to fit and the least proven not to, confirmed on captures
(`solver.fitting.search`, `solver.fitting.confirmation`), one real step at that size, eager's
and per-block checkpointing's sizes beside it, all as one `Fit`.

NOTE [one deadline]: `time_limit` bounds the whole call, captures and steps included, as
`solver.solve`'s does: one `Deadline` (with the first Ctrl-C's `Stop`) is made at the call and
passed down; the search and its second run take shares of it, the solves inside take it whole,
and each capture and real step starts only where the time left holds it (`expected_seconds`).
When it passes, the call returns what is proven by then and names what is open or not done.
"""

from __future__ import annotations

import time

import networkx as nx

from executor.errors import FitError
from executor.fitting.baselines import eager, per_block, run_step
from executor.fitting.graphs import SizedGraphs
from executor.fitting.step_bytes import Sizes, StepBytes, StepSetup, step_bytes
from solver.core.schedule import Schedule
from solver.deadline import Deadline
from solver.fitting.confirmation import confirmed
from solver.fitting.result import Fit, cut_short, eager_above
from solver.fitting.search import FitResult, largest_fitting
from solver.time_shares import FIT_SHARES, FitShares


def fit_sizes(
    sizes: Sizes, step: StepSetup, deadline: Deadline, shares: FitShares = FIT_SHARES
) -> Fit:
    """`executor.fitting.api.fit` below its argument checks, on its one deadline (NOTE [one
    deadline]) shared out as `shares` says, in order:

    1. `step_bytes`: the graph at any size and what exists before a step (measured, predicted,
       or per rank under FSDP2), affine in the size
    2. `_search`: the largest size proven to fit and the least proven not to, confirmed on
       captures
    3. `_real_step`: one real step at that size under remat's executor, its measured peak
    4. `_eager`: eager's largest size, measured
    5. `_per_block`: per-block checkpointing's largest size within the cap, predicted

    then the `Fit` of it all, with the notes and warnings each step left.
    """
    begun = time.perf_counter()
    notes = [step.memory_note] if step.memory_note else []
    at = step_bytes(sizes, step, notes)
    found = _search(at, sizes, step, deadline, notes, begun, shares)
    size = found.size
    measured = measured_host = None
    if step.run and size is not None:
        ran = _real_step(at, size, found.schedule, sizes.dim, deadline, notes)
        measured, measured_host = (None, None) if ran is None else ran
    warnings: list[str] = []
    eager_size = eager_over = None
    if step.run:
        eager_size, eager_over = _eager(at, size, found.upper, sizes.dim, deadline, notes, warnings)
    block_size = _per_block(at, step.cap, sizes.high, size, deadline, notes)
    stopped = "interrupted" if deadline.stopped() else "time limit" if deadline.passed() else None
    return Fit(
        dim=sizes.dim,
        memory=step.memory,
        size=size,
        proven=found.proven,
        upper=found.upper,
        budget=None if size is None else at.left(size),
        schedule=found.schedule,
        static=None if size is None else at.static_at(size),
        optimizer_temporaries=at.optimizer_temporaries,
        measured_peak=measured,
        eager_size=eager_size,
        eager_over=eager_over,
        per_block_size=block_size,
        bytes_model=_bytes_model(at.graphs),
        low=at.low,
        max_overhead=step.cap,
        stopped=stopped,
        seconds=time.perf_counter() - begun,
        notes=notes,
        warnings=warnings,
        probes=found.probes,
        fsdp=at.sharded,
        link=step.link,
        measured_host_peak=measured_host,
    )


def _search(
    at: StepBytes,
    sizes: Sizes,
    step: StepSetup,
    deadline: Deadline,
    notes: list[str],
    begun: float,
    shares: FitShares,
) -> FitResult:
    """The largest size whose least peak within the step's cap fits the bytes left to the step
    (`largest_fitting`, on `shares.search` of the time left, offloading over the step's link
    where it has one), confirmed on captures
    (`confirmed`: a second search where a capture refutes the prediction); a capture starts
    only where the deadline leaves it time. FitError where the deadline passed before any size
    was decided (`begun`: the fit's start, `time.perf_counter` seconds)."""

    def graph_at(size: int) -> nx.DiGraph | None:
        captures = size not in at.graphs.captures and not at.graphs.affine
        if captures and not deadline.leaves(at.graphs.expected_seconds(size)):
            return None  # no time for the capture: the search ends as at its deadline
        return at.graphs(size)

    def search() -> FitResult:
        share = deadline.share(shares.search)
        return largest_fitting(
            graph_at,
            at.left,
            compute_budget=step.cap,
            low=at.low,
            high=sizes.high,
            deadline=share,
            offload=step.link,
            shares=shares,
        )

    found = confirmed(search, at.graphs, sizes.dim, at.low, deadline, notes)
    if found.size is None and found.upper is None and deadline.passed():
        why = "interrupted" if deadline.stopped() else "the time limit passed"
        raise FitError(
            f"{why} before any {sizes.dim} was decided on a capture "
            f"({time.perf_counter() - begun:.1f} s); "
            "nothing is known yet: raise the time limit (--time-limit)"
        )
    return found


def _real_step(
    at: StepBytes,
    size: int,
    schedule: Schedule | None,
    dim: str,
    deadline: Deadline,
    notes: list[str],
) -> tuple[int, int | None] | None:
    """One real step at `size` under `schedule` (`run_step`): its measured whole-step peak and
    host copies' peak in bytes; None (noted) where the deadline leaves no time for it."""
    needs = at.graphs.expected_seconds(size) + at.steps.expected_seconds()
    if deadline.leaves(needs):
        return run_step(at.steps, size, schedule)
    notes.append(f"one real step at {dim} {size}: not run by the deadline")
    return None


def _eager(
    at: StepBytes,
    size: int | None,
    upper: int | None,
    dim: str,
    deadline: Deadline,
    notes: list[str],
    warnings: list[str],
) -> tuple[int | None, int | None]:
    """Eager's largest size up to one above the fit's `size` (`eager`, measured steps) and its
    measured whole-step peak one size above that (bytes); a bisection cut short goes to `notes`,
    an eager step that fits above `size` to `notes` or `warnings` (`eager_above`; `upper`: the
    least size proven not to fit)."""
    above = (size or at.low - 1) + 1
    found = eager(at.steps, at.memory, at.low, above, deadline)
    if not found.complete and found.size != above:
        notes.append(cut_short("eager's bisection", found.size))
    if found.size is not None and found.size > above - 1:
        eager_above(dim, found.size, found.peak, at.memory, upper, notes, warnings)
    return found.size, found.over


def _per_block(
    at: StepBytes,
    cap: str | None,
    high: int | None,
    size: int | None,
    deadline: Deadline,
    notes: list[str],
) -> int | None:
    """Per-block checkpointing's largest size within `cap` in the bytes left to the step
    (`per_block`, predicted), searched up to `high` (None: twice the fit's `size`); a bisection
    cut short goes to `notes`."""
    block_size, complete = per_block(
        at.graphs, at.left, cap, at.low, high or 2 * (size or at.low), deadline
    )
    if not complete:
        notes.append(cut_short("per-block checkpointing's bisection", block_size))
    return block_size


def _bytes_model(graphs: SizedGraphs) -> str:
    sizes = ", ".join(map(str, graphs.sizes))
    if graphs.affine:
        return (
            f"affine in the {graphs.dim}, checked node by node at {sizes}; "
            "captured at the answer and the answer + 1, where they match the prediction"
        )
    shown = "; ".join(graphs.not_affine[:3])
    return f"not affine ({shown}; ...): captured at every size probed"
