"""One spelling per concept across remat's public entry points (README, "One interface"), and
one refusal for any other: `spelled` wraps an entry point so that a parameter spelled
otherwise (`OTHER_SPELLINGS`), or an argument passed by position where the entry point takes it
by keyword, raises `SpellingError` in one line naming remat's spelling, before the entry point
runs."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any, TypeVar

from solver.errors import SpellingError

F = TypeVar("F", bound=Callable[..., Any])

OTHER_SPELLINGS = {
    "memory": "budget",
    "max_overhead": "compute_budget",
    "deadline": "time_limit",
}
"""Each concept's other spelling -> remat's: the memory budget (bytes, units, a percentage or
"min"), the compute cap (a factor of computing every node once), the seconds a call may take.
An entry point that takes the other spelling as a parameter of its own (`solver.solve`'s
`deadline`, a caller's shared `Deadline`) keeps it."""

_POSITIONAL = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)


def spelled(function: F) -> F:
    """`function`, refusing as `SpellingError` a keyword of `OTHER_SPELLINGS` that it does not
    take where it takes remat's spelling instead, and more positional arguments than it takes
    by position (naming the keywords they would have been)."""
    signature = inspect.signature(function)
    parameters = signature.parameters
    bound_first = next(iter(parameters), None) in ("self", "cls")
    positional = [n for n, p in parameters.items() if p.kind in _POSITIONAL]
    keyword_only = [n for n, p in parameters.items() if p.kind is inspect.Parameter.KEYWORD_ONLY]
    takes_any_number = any(p.kind is inspect.Parameter.VAR_POSITIONAL for p in parameters.values())
    respelled = {
        old: new
        for old, new in OTHER_SPELLINGS.items()
        if old not in parameters and new in parameters
    }
    name = function.__qualname__
    shown = positional[1:] if bound_first else positional

    @functools.wraps(function)
    def checked(*args: Any, **kwargs: Any) -> Any:
        for old, new in respelled.items():
            if old in kwargs:
                raise SpellingError(f"{name}({old}=...) is spelled {name}({new}=...)")
        if len(args) > len(positional) and not takes_any_number:
            extra = keyword_only[: len(args) - len(positional)]
            raise SpellingError(
                f"{name} takes {len(shown)} arguments by position ({', '.join(shown)}); pass "
                f"{', '.join(f'{k}=' for k in extra) or 'the rest'} by keyword"
            )
        return function(*args, **kwargs)

    return checked  # type: ignore[return-value]
