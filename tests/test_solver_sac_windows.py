"""`solver.sac.windows.cut_windows` against a direct replay of the events: live bytes at each
mark and the peak of each stretch, for random event streams over two blocks."""

import itertools
import random

import pytest

from solver.sac.windows import Allocation, WindowError, cut_windows, largest_at_peaks

MARKS = ["fs0", "fe0", "fs1", "fe1", "bs1", "bs0"]


def _replay(events, times):
    """Live bytes just after each time and the peak between consecutive mark times, by brute
    force over every event (marks at distinct times, no event at a mark's time)."""

    def live_at(t):
        return sum(b for s, b in events if s < t)

    bounds = [-1, *times, max(s for s, _ in events) + 1]
    peaks = []
    for lo, hi in itertools.pairwise(bounds):
        inside = [s for s, _ in events if lo < s < hi]
        peaks.append(max([live_at(lo + 0.5)] + [live_at(s + 0.5) for s in inside]))
    return [live_at(t) for t in times], peaks


@pytest.mark.parametrize("seed", range(20))
def test_windows_are_the_replayed_live_bytes_and_stretch_peaks(seed):
    rng = random.Random(seed)
    stamps = sorted(rng.sample(range(1, 200), 40))
    live, events = 0, []
    for s in stamps:
        size = rng.randint(1, 100) if live == 0 or rng.random() < 0.6 else -rng.randint(1, live)
        live += size
        events.append((2 * s, size))  # even stamps: marks sit on odd times
    times = sorted(2 * t + 1 for t in rng.sample(range(0, 200), len(MARKS)))
    w = cut_windows(times, events, list(MARKS), [None, None])
    starts, peaks = _replay(events, times)
    at = {m: k for k, m in enumerate(MARKS)}
    assert w.f_start == [starts[at["fs0"]], starts[at["fs1"]]]
    assert w.b_start == [starts[at["bs0"]], starts[at["bs1"]]]
    assert w.f_peak == [peaks[at["fs0"] + 1], peaks[at["fs1"] + 1]]
    assert w.b_peak == [peaks[at["bs0"] + 1], peaks[at["bs1"] + 1]]
    assert w.peak == max(peaks)


def test_a_block_run_twice_is_refused():
    with pytest.raises(WindowError, match="once per step"):
        cut_windows([1, 2, 3, 4], [(0, 8)], ["fs0", "fe0", "fs0", "fe0"], [None])


def _largest_by_replay(allocations, stretches):
    """Per stretch, by brute force: live bytes after every time in it, the first time of the
    most, and the largest allocation made in the stretch by then and live then."""
    out = []
    for name, begin, end in stretches:
        stop = end if end is not None else 10**9

        def live(t):
            return sum(
                a.nbytes for a in allocations if a.start <= t and (a.end is None or a.end > t)
            )

        times = [
            begin,
            *sorted(
                {
                    x
                    for a in allocations
                    for x in (a.start, a.end)
                    if x is not None and begin < x < stop
                }
                | {a.start for a in allocations if a.start == begin}
            ),
        ]
        at = max(times, key=lambda t: (live(t), -t))
        held = [a for a in allocations if begin <= a.start <= at and (a.end is None or a.end > at)]
        if held:
            top = max(held, key=lambda a: (a.nbytes, -a.start))
            out.append((name, top.nbytes))
    return out


@pytest.mark.parametrize("seed", range(40))
def test_largest_at_peaks_is_the_replayed_largest_live_allocation(seed):
    """`largest_at_peaks` against a replay: per stretch, the bytes of the largest allocation
    made in it and live at its first peak (distinct event times, as a fake step's clock)."""
    rng = random.Random(seed)
    clock = iter(rng.sample(range(1, 400), 120))
    allocations = []
    for k in range(rng.randint(1, 40)):
        start, end = sorted((next(clock), next(clock)))
        live = rng.random() < 0.1
        allocations.append(
            Allocation(start, None if live else end, rng.randint(1, 64) * 8, f"t{k}")
        )
    cuts = sorted(rng.sample(range(1, 400), 5))
    stretches = [(f"w{k}", a, b) for k, (a, b) in enumerate(itertools.pairwise([-1, *cuts]))]
    stretches.append(("last", cuts[-1], None))
    found = largest_at_peaks(allocations, stretches)
    assert [(n, b) for n, _, b in found] == _largest_by_replay(allocations, stretches)
