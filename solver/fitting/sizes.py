"""Arithmetic over sizes (batch, sequence length), torch-free: the one bisection every search
for a largest size runs, and the one affine fit of bytes against the size.

    largest_between(decide, fits, fails)  bisection between a size that fits and one that does
                                          not, around sizes left undecided
    largest_size(decide, guess, most)     the largest size from 1 that fits, with no size known
                                          not to: a guess, doubling, then the bisection
    affine({size: bytes, ...})            bytes = base + slope * size with a whole slope
                                          through every point, or None
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from itertools import pairwise

from solver.errors import ArgumentError

FITS, DOES_NOT_FIT, OPEN = "fits", "does not fit", "open"

GUESS_REACH = 16
"""How far `largest_size` trusts a guess: at most this many times the largest size known to fit
then (a fit through small sizes can miss far where the peak moves to another part of the
step as the size grows)."""


@dataclass
class _Known:
    """What a search knows: the largest size known to fit (`fits`), the least known not to
    (`fails`, None: none), the sizes `decide` left open (`undecided`)."""

    fits: int
    fails: int | None
    undecided: set[int]

    def ask(self, decide: Callable[[int], str | None], size: int) -> bool:
        """`decide(size)` noted; False where it answers None (no time left)."""
        verdict = decide(size)
        if verdict is None:
            return False
        if verdict == FITS:
            self.fits = size
        elif verdict == DOES_NOT_FIT:
            self.fails = size
        elif verdict == OPEN:
            self.undecided.add(size)
        else:
            raise ArgumentError(
                f"decide returned {verdict!r}: give FITS, DOES_NOT_FIT, OPEN or None"
            )
        return True


def largest_between(
    decide: Callable[[int], str | None],
    fits: int,
    fails: int,
    undecided: Iterable[int] = (),
) -> tuple[int, int, bool]:
    """Bisection for the largest size that fits, where whether a size fits never changes from
    "does not fit" back to "fits" as the size grows.

    `fits` is a size known to fit (or the size below the range: none known), `fails` a larger
    size known not to. Each step calls `decide` on the middle of the widest gap between `fits`,
    the sizes left undecided (`undecided`, and those `decide` answers OPEN) and `fails`:
    FITS and DOES_NOT_FIT move `fits` and `fails`, OPEN leaves the size undecided and the search
    goes on both sides of it, None (no time left) ends the search. Ends where every gap is one
    size wide. Returns ``(fits, fails, closed)``: `closed` where they are adjacent, so that
    `fits` is the largest size that fits."""
    known = _Known(fits, fails, set(undecided))
    while True:
        fails = known.fails
        assert fails is not None  # given, and only ever lowered
        between = sorted(s for s in known.undecided if known.fits < s < fails)
        marks = [known.fits, *between, fails]
        a, b = max(pairwise(marks), key=lambda pair: pair[1] - pair[0])
        if b - a < 2 or not known.ask(decide, (a + b) // 2):
            break
    return known.fits, fails, fails - known.fits == 1


@dataclass(frozen=True)
class SizeSearch:
    """The answer of `largest_size`: `fits`, the largest size known to fit (0: size 1 does not);
    `fails`, the least size known not to (None: none up to the search's `most`); `closed`
    where they are adjacent, so that `fits` is proven the largest."""

    fits: int
    fails: int | None
    closed: bool


def largest_size(
    decide: Callable[[int], str | None],
    guess: Callable[[], int | None],
    most: int,
) -> SizeSearch:
    """The largest size from 1 to `most` that fits, where whether a size fits never changes from
    "does not fit" back to "fits" as the size grows (`decide` as `largest_between`'s).

    Sizes 1 and 2 first; then `guess()` (asked once they are decided: the size predicted to be
    the largest that fits, or None; at most `GUESS_REACH` times the largest that fits) and the
    size above it; then doubling from the largest size decided (the last step `most` itself)
    until one does not fit; then `largest_between`. A None from `decide` ends the search where
    it stands. Where the doubling reaches a size that `decide` leaves open, no larger one is
    tried (larger sizes are no easier to decide): the bisection runs below it, and the answer
    is proven only where it finds a size that does not fit next to one that does."""
    known = _Known(0, None, set())

    def take(size: int) -> bool:
        """Decide `size` where it is still in question; False where `decide` has no time."""
        settled = size <= known.fits or (known.fails is not None and size >= known.fails)
        if settled or size > most or size in known.undecided:
            return True
        return known.ask(decide, size)

    def answer() -> SizeSearch:
        fails = known.fails
        return SizeSearch(known.fits, fails, fails is not None and fails - known.fits == 1)

    if not (take(1) and take(2)):
        return answer()
    predicted = guess() if known.fails is None else None
    if predicted is not None:
        predicted = min(predicted, GUESS_REACH * max(known.fits, 1), most)
        if not (take(predicted) and take(predicted + 1)):
            return answer()
    while known.fails is None:
        reached = max(known.fits, *known.undecided, 1)
        size = min(2 * reached, most)
        if size <= reached or not take(size):
            return answer()  # `most` reached, or no time
        if size in known.undecided:  # larger sizes are no easier: search below it
            others = known.undecided - {size}
            fits, above, _ = largest_between(decide, known.fits, size, others)
            if above == size:
                return SizeSearch(fits, None, False)
            return SizeSearch(fits, above, above - fits == 1)
    fits, fails, closed = largest_between(decide, known.fits, known.fails, known.undecided)
    return SizeSearch(fits, fails, closed)


@dataclass(frozen=True)
class Affine:
    """Bytes at any size: ``base + slope * size`` (bytes, bytes per unit of size)."""

    base: int
    slope: int

    def __call__(self, size: int) -> int:
        return self.base + self.slope * size


def affine(values: Mapping[int, int]) -> Affine | None:
    """The affine function of the size, with a whole slope, through every ``size: bytes`` of
    `values` (two sizes or more); None where there is none."""
    if len(values) < 2:
        raise ArgumentError(f"an affine fit needs two sizes or more, got {sorted(values)}")
    sizes = sorted(values)
    a, b = sizes[0], sizes[1]
    slope, rest = divmod(values[b] - values[a], b - a)
    fitted = Affine(values[a] - slope * a, slope)
    if rest or any(values[s] != fitted(s) for s in sizes[2:]):
        return None
    return fitted
