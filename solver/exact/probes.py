"""Step: close the gap between the floor and the incumbent on the stage model.

Two engines (docs/solver.md, "Probes"): HiGHS's branch and cut (`solver.milp.highs_mip`) where
the LP bound is close to the incumbent on a large model, climbing caps from the floor; CP-SAT
(`solver.milp.cpsat`) elsewhere, after the moment relaxation where the LP is weak. Every probe
is a statement about the schedules within its cap (NOTE [certificates] in `solver.exact.state`),
and the model holds the incumbent and every better schedule, so all of this is exact.
"""

from __future__ import annotations

from solver.core.simulate import simulate
from solver.core.stages import IndexedSchedule, Member, plan_to_ops
from solver.exact.infeasible import raise_infeasible
from solver.exact.moments import relax
from solver.exact.state import Search
from solver.milp.cpsat import CpSatModel
from solver.milp.highs_mip import HighsMip
from solver.milp.model import ModelResult
from solver.milp.plans import hint_values, plan_from_values


def probes(search: Search) -> Search:
    """Step: without an LP or an incumbent, one CP-SAT run over the whole model (`search_model`).
    Otherwise, where the gap is within `SolveOptions.mip_gap` of the incumbent's recompute cost
    on a model of at least `mip_min_variables` variables, HiGHS climbs (`climb`); elsewhere the
    LP is weak and the moment relaxation goes first (unless it ran already). CP-SAT from the
    incumbent gets whatever is still open (`minimise`)."""
    if search.model is None:
        return search
    if search.lp is None or search.incumbent is None:
        search_model(search)
        return search
    options, value = search.options, search.value
    assert value is not None
    close = value - search.floor <= options.mip_gap * value
    if close and len(search.model.names) >= options.mip_min_variables:
        climb(search)
    elif not search.moments_ran:
        relax(search, search.first_tight)
    if not search.closed and search.deadline.remaining() > 0.01:
        minimise(search)
    return search


def _member(search: Search, result: ModelResult, name: str) -> Member:
    """The schedule of a model solution."""
    assert search.model is not None and result.values is not None
    plan = plan_from_values(search.model, search.problem.n, result.values.__getitem__)
    return Member(name, plan, plan_to_ops(search.problem, plan))


def search_model(search: Search) -> None:
    """One CP-SAT run over the whole model, from the incumbent when there is one."""
    model, incumbent, limit = search.model, search.incumbent, search.model_limit
    assert model is not None
    result = CpSatModel(model).solve(
        deadline=search.deadline,
        workers=search.workers,
        hint=None if incumbent is None else hint_values(model, search.problem, incumbent.plan),
        progress=search.engine_progress(),
    )
    search.note(cpsat=result.status)
    if result.status == "INFEASIBLE" and limit is None:
        raise_infeasible(search)
    if result.values is not None:
        search.offer(_member(search, result, "CP-SAT"))
    search.conclude(result, limit)


def minimise(search: Search) -> None:
    """One CP-SAT run for the rest of the time: minimise under the incumbent's cost as a cap,
    with the LP's certified fixings at that cap, from the incumbent as a complete hint (which its
    local search improves: without a first solution it finds none on the op-level graphs).
    Where the LP is weaker than the floor and the lifetime search has run (`_weak_on_op_level`),
    only `TimeShares.minimise` of the time is CP-SAT's: the rest is
    `lifetime_polish`'s."""
    model, lp, incumbent, cap = search.model, search.lp, search.incumbent, search.value
    assert model is not None and lp is not None and incumbent is not None and cap is not None
    deadline = search.deadline
    if _weak_on_op_level(search):
        deadline = deadline.share(search.options.shares.minimise)
    result = CpSatModel(model).solve(
        deadline=deadline,
        workers=search.workers,
        hint=hint_values(model, search.problem, incumbent.plan),
        fixed=lp.fixings(cap),
        objective_cap=cap,
        progress=search.engine_progress(),
    )
    search.note(cpsat=result.status)
    if result.values is not None:
        search.offer(_member(search, result, "CP-SAT"))
    search.conclude(result, cap)  # infeasible: nothing cheaper than the incumbent's own cost


def _weak_on_op_level(search: Search) -> bool:
    """The stage model's LP bound is under the floor (the covers' bound is the stronger), and
    the lifetime search has run (op-level graphs). There CP-SAT from the incumbent rarely
    improves it, and the lifetime search, given the time, does: on GPT-2 with one layer at 70%
    of the checkpoint-all peak, a 300 s solve whose probes took 280 s ended 1.3% dearer than a
    60 s solve (docs/solver.md, "Probes")."""
    lp = search.lp
    return lp is not None and search.lifetime_best is not None and lp.bound < search.floor


def climb(search: Search) -> None:
    """HiGHS probes of objective caps climbing from the floor.

    Each probe asks for a schedule of recompute cost <= cap with every variable fixed that the
    LP's certified reduced costs fix at that cap (the lower the cap, the more are fixed). Infeasible
    raises the floor to cap + 1 and grows the step by `SolveOptions.climb_growth`
    (`climb_first_step` of the gap first); a schedule becomes the incumbent, optimal when HiGHS
    proves it optimal under the cap. A low cap is refuted quickly and the first cap at or above
    the optimum finds it with its proof. With `climb_pairs` two caps are probed at once, the
    next one and the one its refutation would lead to; every outcome is a statement about the
    schedules within its cap, so both are applied. Stops when a probe runs out of its share of
    the time or a schedule fails the exact check (HiGHS works in floating point): CP-SAT takes
    over from there.
    """
    options, model, lp = search.options, search.model, search.lp
    assert model is not None and lp is not None and search.value is not None
    mip = HighsMip(model, lp.scaled, presolve=False)  # presolve would overrun the deadline
    step = max(1, round((search.value - 1 - search.floor) * options.climb_first_step))
    outcomes = []
    while not search.closed and search.deadline.remaining() > 0.01:
        value, lower = search.value, search.floor
        assert value is not None
        caps = [min(value - 1, lower + step)]
        step = max(step + 1, round(options.climb_growth * step))
        if options.climb_pairs and caps[0] < value - 1:  # the cap that follows if caps[0] fails
            caps.append(min(value - 1, caps[0] + 1 + step))
            step = max(step + 1, round(options.climb_growth * step))
        share = 1.0 if caps[-1] == value - 1 else options.shares.probe
        questions = [(lp.fixings(cap), cap) for cap in caps]
        results = mip.solve_all(questions, deadline=search.deadline.share(share))
        go_on = True
        for cap, result in zip(caps, results, strict=True):
            outcomes.append((cap, result.status))
            if result.values is not None:
                found = _member(search, result, "HiGHS probe")
                if not _fits(search, found.schedule, cap):
                    go_on = False
                    continue
                search.offer(found)
            elif result.status != "INFEASIBLE":
                go_on = False  # out of time under this cap
            search.conclude(result, cap)
        if not go_on:
            break
    search.note(highs_probes=outcomes)


def _fits(search: Search, schedule: IndexedSchedule, cap: int) -> bool:
    """Whether the simulator accepts the schedule within the budget and its recompute cost is at
    most cap (a floating-point solver's answer is believed only after this)."""
    problem, budget = search.problem, search.goal.budget
    replay = simulate(search.graph, [(kind, problem.ids[i]) for kind, i in schedule.ops])
    fits = budget is None or replay.peak <= budget
    return replay.valid and fits and search.units.recompute(schedule) <= cap
