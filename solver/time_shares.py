"""How a call's seconds are shared out among its steps: one frozen object per kind of call,
each field a fraction of named seconds, with the defaults every call runs with.

- `TimeShares`: `solver.solve` (`SolveOptions.shares`) and `remat solve`.
- `FitShares`: the fit search (`solver.fitting.search.largest_fitting`, `executor.fit`).
- `SacShares`: `executor.checkpoint_plan`'s recording and its SAC solve
  (`solver.sac.solve.solve_sac`).
- `RematerializeShares`: `executor.rematerialize`'s solve after its capture.
- `CompileShares`: `executor.compile`'s solves within its compiles.
- `EstimateShares`: `executor.estimate`'s search for the largest sizes.

"Of the limit" counts from the start of the call or step named (the step ends by that instant,
or earlier where the call's own deadline comes first); "of the time left" counts from when the
step begins (`solver.deadline.Deadline.share`).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TimeShares:
    """Fractions of a solve's seconds, one per step that takes a share.

    Warm starts (`solver.exact.warm_start`, `solver.exact.least_peak`), of the limit:
        warm_start: the backward searches; also the eviction search for lower peaks after the
            least-peak search (objective "cost" where no heuristic fits the budget).
        heuristic: the least-peak search (objective "memory"; objective "cost" where no
            heuristic fits the budget).
        peak_search_small: the eviction search for lower peaks where the stage model is small
            (`SolveOptions.cascade_small_model`), in `warm_start`'s place. The steps after the
            cascade cover wait for it, and on such graphs they find the schedules (BERT-1 at
            the least peak + 10%: it found none in 30 s; at 0.2 the solve is OPTIMAL in 60 s,
            at 0.5 it ends at 1.50 of the node costs recomputed against the optimum's 0.298).
        policy: objective "memory": the checkpoint policies, counted from when they start (on
            the 24-layer transformers they take 40-70 s and peak 3-5x above eviction; the time
            goes to the eviction search for lower peaks).
    Bounds, of the limit:
        cover: the read-gap cover (`solver.exact.cover`).
        cascade_first: the cascade cover's first bound (LP rounds until no row is broken, then
            one CP-SAT round), counted from the step's start (where the warm starts take half
            the limit, on 10,000-node graphs, it still gets its time)...
        cascade: ...and the cascade step as a whole (`solver.exact.cascade`: the bound rising
            on one thread, the lifetime search on the other)...
        cascade_small: ...or this share where the stage model has at most
            `SolveOptions.cascade_small_model` variables, leaving the rest to the steps that
            search it.
        cascade_eviction: once the lifetime search is quiet (`SolveOptions.lifetime_quiet`),
            the eviction search from the rule's runs, of the time left to the cascade step's
            end (the lifetime search from its best takes the rest).
    The stage model and its probes (`solver.exact.stage_model`, `solver.exact.probes`), of the
    time left:
        lp: one LP relaxation.
        lp_repeat: after a rounding beats the incumbent, the model is rebuilt at its cost and its
            LP solved again while an LP takes less than this share.
        probe: one climbing HiGHS probe (the last cap below the incumbent takes all).
        minimise: where the stage model's LP bound is under the floor the covers proved and the
            lifetime search has run (op-level graphs), CP-SAT's run from the incumbent; the
            rest is `lifetime_polish`'s.
    Budget "min" (`solver.exact.pipeline`), of the time left:
        least_peak: the least-peak search; the least cost at that peak has the rest.
    With offload (`solver.exact.offload`), of the time left:
        offload_keep_recompute: the keep/recompute solve, for the incumbent, where the offload
            model is built...
        offload_keep_recompute_alone: ...and where the model is too large for the time left
            (`offload_model_room`): the incumbent is then the result.
        offload_heuristics: the offload heuristics from each base plan (a few dozen replays by
            the simulator).
    `remat solve` (`cli.solve`):
        command_exact: the exact solves, of --time-limit counted from the command's start; the
            table's heuristic rows have the rest (with --no-baselines the solves get all).
            `python -m benchmarks.solving.time_limits --cli` measures that the command returns
            within the limit.
        command_keep_recompute: with --offload, the keep/recompute solve that
            `solve_with_offload` runs first (`keep_recompute_first`), of the exact solves' time
            left; the offload solve, which starts from its schedule, has the rest.
    """

    warm_start: float = 0.5
    heuristic: float = 0.1
    peak_search_small: float = 0.2
    policy: float = 0.1
    cover: float = 0.1
    cascade_first: float = 0.15
    cascade: float = 0.8
    cascade_small: float = 0.3
    cascade_eviction: float = 0.5
    lp: float = 0.5
    lp_repeat: float = 0.1
    probe: float = 0.5
    minimise: float = 0.5
    least_peak: float = 0.5
    offload_keep_recompute: float = 0.3
    offload_keep_recompute_alone: float = 0.9
    offload_heuristics: float = 0.5
    command_exact: float = 0.8
    command_keep_recompute: float = 0.5


@dataclass(frozen=True)
class FitShares:
    """Fractions of a fit's seconds, each of the time left when its step begins.

    search: each search for the largest size that fits (`executor.fitting.search`); the rest is
        for the confirming captures, the real steps, the baselines and, where a capture refutes
        the prediction, the second search.
    keep_recompute: with offload, the keep/recompute search (`largest_fitting`), before the
        search with offload goes on from its answer.
    probe: one size's probe (`solver.fitting.search.probe`)...
    probe_least_peak: ...and within it, the least peak within the compute cap (no offload);
        the least cost within the memory has the rest.
    """

    search: float = 0.6
    keep_recompute: float = 0.5
    probe: float = 0.25
    probe_least_peak: float = 0.25


@dataclass(frozen=True)
class SacShares:
    """Fractions of a `checkpoint_plan`'s seconds.

    recording: of the call's time limit, the recording's repeated measurements (the first run
        of each is taken whatever the time); the solve has what is left
        (`executor.sac.step.RecordingTime.spare`).
    block_streams: of the recording's spare time left, the repeats of the blocks' op streams...
    child_streams: ...and of what is left after them, the repeats of the kept children's.
    least_peak: of the time left, budget "min": the least peak any plan reaches
        (`solver.sac.solve.solve_sac`); the least cost at it has the rest.
    """

    recording: float = 0.5
    block_streams: float = 1 / 3
    child_streams: float = 1 / 2
    least_peak: float = 0.5


@dataclass(frozen=True)
class RematerializeShares:
    """Fractions of a `rematerialize`'s seconds.

    solve_at_least: of the time left after the capture, the least the solve gets: it ends
        early enough for the check after it (one eager and one rematerialized step), but never
        before this share has passed (`executor.traced.rematerialize`).
    """

    solve_at_least: float = 0.5


@dataclass(frozen=True)
class CompileShares:
    """Fractions of an `executor.compile`'s seconds (`executor.compiled.budget_loop`). Each
    compile left has an equal share of the time left; its solves have that share less what the
    rest of a compile and its measurement are expected to take, once a compile has been timed.

    first_solves: before any compile has been timed, the solves' part of a compile's equal
        share; the compile and its measurement, whose seconds are not known yet, have the
        rest.
    """

    first_solves: float = 0.5


@dataclass(frozen=True)
class EstimateShares:
    """Fractions of an `executor.estimate`'s seconds where it searches the largest sizes
    (`factories`).

    first: of the limit, the estimate at the example inputs' size, and the most any later
        size's estimate or re-plan may take (a size is not started where less time is left
        than the longest estimate so far took).
    search: of the time left after the first estimate, the search for the largest sizes; the
        re-plans of what would move remat's limits have the rest.
    deciding: in the search, remat's solve at a size where no fixed policy fits, in times the
        size's recording seconds: it decides whether a plan fits (found: fits; proven absent:
        does not; neither: the size stays open), not the plan's cost.
    """

    first: float = 0.4
    search: float = 0.6
    deciding: float = 1.0


FIT_SHARES = FitShares()
"""The fit's default shares (a frozen default parameter)."""
SAC_SHARES = SacShares()
"""`checkpoint_plan`'s default shares (a frozen default parameter)."""
REMATERIALIZE_SHARES = RematerializeShares()
"""`rematerialize`'s default shares (a frozen default parameter)."""
COMPILE_SHARES = CompileShares()
"""`executor.compile`'s default shares (a frozen default parameter)."""
ESTIMATE_SHARES = EstimateShares()
"""`executor.estimate`'s default shares (a frozen default parameter)."""
