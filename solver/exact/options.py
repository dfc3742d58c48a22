"""`SolveOptions`: the tuning of the exact search, a frozen parameter of `solver.solve`.

How the solve's seconds are shared out among its steps is one field, `shares`
(`TimeShares`). Every share is a fraction of seconds: "of the limit" counts from the start of
the solve (the step ends by that instant, or earlier where the solve's own deadline comes
first); "of the time left" counts from when the step begins. The defaults are the settings
`python -m benchmarks.solving.solver_scale` and `python -m benchmarks.solving.time_limits` were
run with; docs/solver.md says what each trades.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any


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
        command_keep_recompute: with --offload, the keep/recompute solve, of the exact solves'
            time; the offload solve, which starts from its schedule, has the rest.
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
class SolveOptions:
    """Tuning of `solver.solve`; the defaults suit graphs of up to a few thousand nodes.

    Warm starts (`solver.exact.warm_start`):
        warm_starts: the heuristics of `solver.heuristics.registry.HEURISTICS` the search starts
            from, among "eviction", "backward" and "policies" (every checkpoint policy).
    Bounds:
        cover: solve the read-gap cover (`solver.exact.cover`).
        cover_workers: CP-SAT workers for the cover (one is deterministic: the same plan on
            every run).
        cascade: solve the cascade cover and run the lifetime search from its solution
            (`solver.exact.cascade`), where recomputes need dead inputs (op-level graphs).
        cascade_small_model: the stage model is small (`TimeShares.cascade_small` and
            `peak_search_small`) where it has at most this many variables.
        cascade_stall: once the cascade bound is final, the lifetime search stops when it has
            not improved for this share of the limit (`lifetime_polish` takes it up again with
            the time the later steps leave).
        mirror_moves: the lifetime search also tries each move in every copy of a repeated
            block at once, and the eviction search changes a node's priority with its
            mirrors' (`solver.core.repeats`).
        eviction_behind: where the lifetime search's best plan, once its starts are repaired
            and improved, recomputes more than 1 + this times the incumbent's recomputation,
            the eviction search takes the rest of the cascade step (at per-block memory on
            Llama-12 the lifetime search ends its starts 2.8% behind an eviction run and goes
            on to pass it; at the least peak + 10% it is far behind or has no plan yet).
        eviction_first: where the incumbent recomputes at least this share of the cost of
            computing every node once (tight budgets: on `benchmarks.zoo` transformers
            eviction's runs recompute 0.6-1.2 at the least peak + 10%, 0.16-0.29 at per-block
            checkpoint's memory), the eviction search takes the lifetime search's place in
            the cascade step and in the lifetime polish.
        lifetime_quiet: where the lifetime search, its starts done, is not behind and has not
            improved for this share of the limit, the eviction search from the rule's runs
            and the lifetime search from its best take the rest of the cascade step (at
            per-block memory on BERT-12 and GPT-2-12 that start ends cheaper than the
            lifetime search's own).
    The moment relaxation (`solver.exact.moments`):
        moment_late_share: it runs before the stage model when the first stage over the budget
            in checkpoint-all comes after this share of the stages...
        moment_max_variables: ...and it has at most this many variables (each round).
    The stage model (`solver.exact.stage_model`):
        max_model_variables: largest stage model built; above it the best heuristic comes back
            with the bounds known without the model.
        model_variables_per_second: ...nor is a model with more variables than this many per
            second left: its LP would not end in the time left (docs/solver.md, "The stage
            model"), and building it would take that time from the lifetime polish.
        rounding: round the LP's keep fractions into schedules.
    Probes (`solver.exact.probes`):
        mip_gap, mip_min_variables: HiGHS's branch and cut probes caps when the LP bound is
            within mip_gap of the incumbent's recompute cost and the model has at least
            mip_min_variables variables; CP-SAT searches otherwise.
        climb_first_step: the first cap is this share of the gap above the floor...
        climb_growth: ...and the step grows by this factor after each refuted cap.
        climb_pairs: probe two caps at once on two threads (the next and the one its refutation
            would lead to).
    steps: the pipeline's steps in order (None: `solver.exact.pipeline.COST_STEPS` for objective
        "cost", `solver.exact.least_peak.STEPS` for "memory"); a step is a function of the
        search state that returns it (`solver.exact.state.SearchStep`).
    shares: the seconds of the solve each step may take (`TimeShares`).
    """

    warm_starts: Sequence[str] = ("eviction", "backward", "policies")
    cover: bool = True
    cover_workers: int = 1
    cascade: bool = True
    cascade_small_model: int = 50_000
    cascade_stall: float = 0.05
    mirror_moves: bool = True
    eviction_behind: float = 0.1
    eviction_first: float = 0.5
    lifetime_quiet: float = 0.1
    moment_late_share: float = 0.5
    moment_max_variables: int = 160_000
    max_model_variables: int = 1_500_000
    model_variables_per_second: int = 10_000
    rounding: bool = True
    mip_gap: float = 0.5
    mip_min_variables: int = 20_000
    climb_first_step: float = 1 / 8
    climb_growth: float = 1.5
    climb_pairs: bool = True
    steps: Sequence[Callable[[Any], Any]] | None = None
    shares: TimeShares = field(default_factory=TimeShares)


DEFAULT = SolveOptions()
"""The default tuning."""
