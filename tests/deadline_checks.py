"""The check that a call passes one deadline down: every solve it runs gets the call's own
`Deadline` (the first `Deadline.after` the call makes, the one holding its Ctrl-C `Stop`) or a
share of it, compared as instants, not timed."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from solver.deadline import Deadline


def assert_solves_share_the_calls_deadline(
    monkeypatch: pytest.MonkeyPatch, module: object, call: Callable[[], object]
) -> None:
    """Run `call()` with `module.solve` recording each solve's ``deadline`` and
    `Deadline.after` recording each deadline made; a solve ran, every solve's deadline holds
    the first deadline's `Stop` (one Ctrl-C) and none ends after it."""
    deadlines, made = [], []
    solve, after = module.solve, Deadline.after.__func__

    def recording(*args, **kwargs):
        deadlines.append(kwargs.get("deadline"))
        return solve(*args, **kwargs)

    def made_after(cls, seconds: float, stop=None) -> Deadline:
        made.append(after(cls, seconds, stop))
        return made[-1]

    monkeypatch.setattr(module, "solve", recording)
    monkeypatch.setattr(Deadline, "after", classmethod(made_after))
    call()
    assert deadlines and all(d is not None for d in deadlines), "a solve ran, given a deadline"
    first = made[0]
    assert first.stop is not None and all(d.stop is first.stop for d in deadlines)
    assert all(d.at <= first.at for d in deadlines)  # none gets time past the call's limit
