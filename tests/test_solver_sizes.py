"""`solver.fitting.sizes`: the one bisection and the one affine fit over sizes, each against a
brute-force reference on small cases (hypothesis, derandomized in conftest)."""

from __future__ import annotations

from itertools import pairwise

import pytest
from hypothesis import given
from hypothesis import strategies as st

from solver.fitting.sizes import DOES_NOT_FIT, FITS, OPEN, affine, largest_between, largest_size


@given(
    low=st.integers(0, 5),
    width=st.integers(1, 40),
    data=st.data(),
)
def test_bisection_finds_the_largest_size_that_fits(low: int, width: int, data) -> None:
    """Against a linear scan: with every size decided, the bisection returns the largest size
    in range that fits, closed; each size is asked at most once."""
    high = low + width - 1
    threshold = data.draw(st.integers(low - 1, high))  # the largest size that fits
    asked: list[int] = []

    def decide(size: int) -> str:
        asked.append(size)
        return FITS if size <= threshold else DOES_NOT_FIT

    fits, fails, closed = largest_between(decide, low - 1, high + 1)
    reference = max((s for s in range(low, high + 1) if s <= threshold), default=low - 1)
    assert (fits, fails, closed) == (reference, reference + 1, True)
    assert len(asked) == len(set(asked)) and all(low <= s <= high for s in asked)


@given(
    width=st.integers(2, 30),
    data=st.data(),
)
def test_open_sizes_and_a_stop_never_give_a_wrong_answer(width: int, data) -> None:
    """With sizes left open and the search stopped after a number of answers: `fits` fits and
    `fails` does not (brute force over every size), closed only where they are adjacent, and
    a search that was not stopped ends with every gap between decided or open sizes closed."""
    threshold = data.draw(st.integers(0, width))
    left_open = data.draw(st.sets(st.integers(1, width)))
    answers = data.draw(st.integers(0, width))
    asked: list[int] = []

    def decide(size: int) -> str | None:
        if len(asked) == answers:
            return None
        asked.append(size)
        if size in left_open:
            return OPEN
        return FITS if size <= threshold else DOES_NOT_FIT

    fits, fails, closed = largest_between(decide, 0, width + 1)
    assert fits <= threshold < fails
    assert fits == 0 or (fits not in left_open and fits <= threshold)
    assert closed == (fails - fits == 1)
    if len(asked) < answers:  # not stopped
        marks = sorted({fits, fails, *(s for s in asked if s in left_open and fits < s < fails)})
        assert all(b - a < 2 for a, b in pairwise(marks))
    if not left_open and len(asked) < answers:
        assert (fits, closed) == (threshold, True)


@given(
    threshold=st.integers(0, 300),
    guess=st.none() | st.integers(-5, 400),
    most=st.integers(1, 500),
    data=st.data(),
)
def test_the_search_from_one_finds_the_largest_size_whatever_the_guess(
    threshold: int, guess: int | None, most: int, data
) -> None:
    """Against brute force, with any guess (right, wrong, none) and sizes left open: `fits`
    fits, `fails` does not, closed only where adjacent; without open sizes, the answer is the
    largest size up to `most` that fits, proven unless `most` fits; each size asked once."""
    left_open = data.draw(st.sets(st.integers(1, 400), max_size=5))
    asked: list[int] = []

    def decide(size: int) -> str:
        asked.append(size)
        if size in left_open:
            return OPEN
        return FITS if size <= threshold else DOES_NOT_FIT

    found = largest_size(decide, lambda: guess, most)
    assert len(asked) == len(set(asked)) and all(1 <= s <= most for s in asked)
    assert found.fits <= threshold and found.fits not in left_open
    assert found.fails is None or threshold < found.fails <= most
    assert found.closed == (found.fails is not None and found.fails - found.fits == 1)
    if not left_open:
        assert found.fits == min(threshold, most)
        assert found.closed == (threshold < most)


def test_the_search_stops_where_decide_has_no_time() -> None:
    answers = iter([FITS, FITS, None])
    found = largest_size(lambda size: next(answers), lambda: 10, 100)
    assert (found.fits, found.fails, found.closed) == (2, None, False)


def test_a_verdict_outside_the_three_is_refused() -> None:
    with pytest.raises(ValueError, match="FITS, DOES_NOT_FIT, OPEN or None"):
        largest_between(lambda size: "maybe", 0, 10)


def _reference_affine(values: dict[int, int]) -> tuple[int, int] | None:
    """(base, slope) of the one whole-slope line through every point, by trying every slope
    the values allow."""
    sizes = sorted(values)
    span = max(abs(v) for v in values.values()) + 1
    for slope in range(-span, span + 1):
        bases = {values[s] - slope * s for s in sizes}
        if len(bases) == 1:
            return bases.pop(), slope
    return None


@given(
    sizes=st.lists(st.integers(1, 12), min_size=2, max_size=5, unique=True),
    base=st.integers(-50, 50),
    slope=st.integers(-8, 8),
    noise=st.lists(st.integers(-2, 2), min_size=5, max_size=5),
)
def test_affine_fit_matches_brute_force(sizes, base, slope, noise) -> None:
    """Lines, and lines with noise added: `affine` finds a whole-slope line exactly where the
    brute-force search does, and it gives every point's value and any other size's."""
    values = {s: base + slope * s + n for s, n in zip(sizes, noise, strict=False)}
    fitted = affine(values)
    reference = _reference_affine(values)
    if reference is None:
        assert fitted is None
    else:
        assert (fitted.base, fitted.slope) == reference
        assert all(fitted(s) == v for s, v in values.items())
        assert fitted(20) == reference[0] + reference[1] * 20


def test_affine_needs_two_sizes() -> None:
    with pytest.raises(ValueError, match="two sizes or more"):
        affine({3: 10})
