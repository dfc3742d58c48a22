"""Exceptions raised by the solver; each message says what went wrong and what to do."""


class RematError(Exception):
    """Base class of every error remat raises on purpose."""


class GraphError(RematError, ValueError):
    """The graph does not meet the solver contract (acyclic, `mem` and `cost` on every node)."""


class BudgetError(RematError, ValueError):
    """A memory budget that cannot be read, or that has no bytes where bytes are needed
    (`solver.core.budget.Budget`)."""


class InfeasibleBudgetError(RematError):
    """No schedule fits the memory budget.

    `minimum_bytes` is the smallest budget (bytes) for which a schedule exists in the solver's
    schedule space, when it is known, else None; `lower_bound_bytes` is a proven lower bound.
    """

    def __init__(self, message: str, minimum_bytes: int | None, lower_bound_bytes: int) -> None:
        super().__init__(message)
        self.minimum_bytes = minimum_bytes
        self.lower_bound_bytes = lower_bound_bytes


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
