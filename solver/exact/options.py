"""`SolveOptions`: the tuning of the exact search, a frozen parameter of `solver.solve`.

How the solve's seconds are shared out among its steps is one field, `shares`
(`solver.time_shares.TimeShares`, with the shares of every other call's seconds). The defaults
are the settings `python -m benchmarks.solving.solver_scale` and `python -m
benchmarks.solving.time_limits` were run with; docs/solver.md says what each trades.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from solver.time_shares import TimeShares


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
