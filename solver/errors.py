"""Exceptions raised by the solver; each message says what went wrong and what to do."""


class RematError(Exception):
    """Base class of every error remat raises on purpose."""


class GraphError(RematError, ValueError):
    """The graph does not meet the solver contract (acyclic, `mem` and `cost` on every node)."""


class ArgumentError(RematError, ValueError):
    """An argument (or command-line option) that the function or command cannot take, or
    arguments that do not go together; the message names them and what to give instead."""


class SpellingError(RematError, TypeError):
    """A function, method or parameter spelled other than remat spells it; the message names
    remat's spelling."""


class BudgetError(RematError, ValueError):
    """A budget that cannot be read: a memory budget (`solver.core.budget.Budget`), or one
    without bytes where bytes are needed; a compute budget or overhead cap that is not a
    factor of at least 1."""


class InfeasibleBudgetError(RematError):
    """No schedule fits the memory budget.

    `minimum_bytes` is the smallest budget (bytes) for which a schedule exists in the solver's
    schedule space, when it is known, else None; `lower_bound_bytes` is a proven lower bound;
    `least_plan`, where the solver found it, the plan (or schedule) of the least peak found.
    """

    def __init__(
        self,
        message: str,
        minimum_bytes: int | None,
        lower_bound_bytes: int,
        least_plan: object | None = None,
    ) -> None:
        super().__init__(message)
        self.minimum_bytes = minimum_bytes
        self.lower_bound_bytes = lower_bound_bytes
        self.least_plan = least_plan


class ComputeBudgetError(RematError):
    """No schedule fits the compute budget (objective="memory")."""


class SolverTimeoutError(RematError):
    """The time limit passed before any schedule within the budget was found.

    `cost_bound` is a proven lower bound on the cost (graph units) of every schedule within the
    budget, in the solver's schedule space (the cost of computing every node once where nothing
    more was proven)."""

    def __init__(self, message: str, cost_bound: float | None = None) -> None:
        super().__init__(message)
        self.cost_bound = cost_bound


class ScheduleMismatchError(RematError):
    """A schedule was used with a graph other than the one it was solved for."""


class InvalidScheduleError(RematError):
    """A schedule violates the execution semantics (see `solver.core.simulate`)."""


class InvalidPlanError(RematError, ValueError):
    """A SAC plan that its problem cannot run: another number of blocks or child plans, an op
    saved or offloaded that cannot be, an offload without the link it was solved with
    (`solver.sac.memory.check_plan`)."""


class DeadlineError(RematError, TimeoutError):
    """The deadline passed before a piece of a solve was built (an exact model, a heuristic's
    table); the solve catches it and goes on with what it has."""


class InternalError(RematError, RuntimeError):
    """A state remat's own code must never reach: remat's bug, never the caller's. The message
    asks for a report."""

    def __init__(self, message: str) -> None:
        super().__init__(
            f"internal error: {message}; this is remat's bug: please report it with the call "
            "that raised it"
        )
