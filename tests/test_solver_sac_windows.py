"""`solver.sac.windows.cut_windows` against a direct replay of the events: live bytes at each
mark and the peak of each stretch, for random event streams over two blocks."""

import itertools
import random

import pytest

from solver.sac.windows import WindowError, cut_windows

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
