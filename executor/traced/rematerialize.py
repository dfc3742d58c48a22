"""`rematerialize`: capture a model, solve for a budget within one time limit, wrap the
schedule (`Rematerialized`) and hand it over checked against eager (`check_against_eager`).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence

import torch
from torch import nn

from executor.errors import RematerializeError
from executor.traced.module import Rematerialized, check_against_eager
from executor.traced.offload import link_on
from graph_capture.captured import CapturedGraph
from solver.core.budget import PERCENT, Budget
from solver.core.link import Link
from solver.deadline import Deadline
from solver.errors import SolverTimeoutError
from solver.interrupt import call_deadline
from solver.spelling import spelled
from solver.target.devices import host_link
from solver.time_shares import REMATERIALIZE_SHARES, RematerializeShares

__all__ = ["rematerialize"]


@spelled
def rematerialize(
    model: nn.Module,
    example_inputs: Sequence[torch.Tensor] | torch.Tensor,
    budget: int | float | str,
    *,
    example_kwargs: Mapping[str, torch.Tensor] | None = None,
    time_limit: float = 60.0,
    capture_options: Mapping[str, object] | None = None,
    offload: Link | str | None = None,
    **solve_options: object,
) -> Rematerialized:
    """Capture `model`, solve for `budget` and wrap: the one call for the common case.

    `budget` (`solver.core.budget.Budget`): bytes, "512MiB", "50%" of the measured peak of the
    plain training step (capture measures it for a percentage: graph attribute
    ``plain_peak``), or "min" (the least peak, then the least cost at it). The model is
    captured as called with ``model(*example_inputs, **example_kwargs)`` (`example_inputs`: a
    tuple or list, or one tensor), under the autocast state in force (train under the same
    one); the wrapped model returns the model's outputs, the loss is the caller's.
    `time_limit`: seconds for the whole call, capture and solve: the solve gets what the
    capture leaves (`solver.solve`'s bound); `RematerializeError` where it is not a positive
    number of seconds. `capture_options` go to `graph_capture.capture` (``granularity``,
    ``cost_model``, ...), `solve_options` to `solver.solve` (``workers``, ...). `offload`: a
    host link (`solver.Link`, bytes per second each way on a captured graph, whose costs are
    seconds), or the name of one (``"pcie5"``, `solver.target.devices.HOST_LINKS`) or of a
    built-in target (``"h100"``, its link): values may also be offloaded to host memory and
    reloaded (docs/offload.md), the step runs the copies (`Rematerialized.host_pool`); a
    budget in bytes or percent. Ctrl-C (from
    the main thread, where SIGINT has Python's default handler): the first ends the call as
    the time limit does (the capture runs to its end, then the solve returns the best
    schedule it has), a second raises KeyboardInterrupt.
    """
    import solver
    from graph_capture import capture

    wanted = Budget.of(budget)  # an unreadable budget fails before the capture
    link = _link(offload)
    options = {"plain_peak": wanted.kind == PERCENT, **(capture_options or {})}
    with call_deadline(time_limit, RematerializeError) as deadline:
        captured = capture(model, example_inputs, example_kwargs=example_kwargs, **options)
        if deadline.passed() and not deadline.stopped():
            took = time.perf_counter() - (deadline.at - time_limit)
            raise SolverTimeoutError(
                f"the capture took all of time_limit={time_limit:g} s ({took:.1f} s): raise "
                "time_limit to leave the solve some"
            )
        schedule = solver.solve(
            captured.dag,
            wanted,
            time_limit=time_limit,
            deadline=_leave_for_check(deadline, captured),
            offload=link_on(link, _device_of(model)),
            **solve_options,
        )
    remat = Rematerialized(model, captured, schedule)
    check_against_eager(remat, example_inputs, example_kwargs)
    return remat


def _device_of(model: nn.Module) -> torch.device:
    """Where the model's parameters are (the CPU for a model without any)."""
    first = next(model.parameters(), None)
    return torch.device("cpu") if first is None else first.device


def _leave_for_check(
    deadline: Deadline,
    captured: CapturedGraph,
    shares: RematerializeShares = REMATERIALIZE_SHARES,
) -> Deadline:
    """The solve's deadline: ``deadline`` less what the check after it takes (one eager and
    one rematerialized step: three times the plain step's seconds measured at capture, graph
    attribute ``step_cost``), but never less than ``shares.solve_at_least`` of the time left."""
    check_seconds = 3.0 * float(captured.dag.graph.get("step_cost", 0.0))
    least = deadline.share(shares.solve_at_least).at
    return deadline.until(max(least, deadline.at - check_seconds))


def _link(offload: Link | str | None) -> Link | None:
    """The host link `rematerialize`'s ``offload`` names; RematerializeError for what is none."""
    if offload is None:
        return None
    if isinstance(offload, Link | str):
        return host_link(offload)
    raise RematerializeError(
        f"offload must be a solver.Link, the name of a host link or target ('pcie5', 'h100'), "
        f"or None, not {offload!r}"
    )
