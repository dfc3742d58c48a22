"""`paused_collection`: Python's cyclic garbage collector paused around allocation-heavy
searches.

The lifetime search (`solver.heuristics.lifetimes`) builds and drops millions of small acyclic
objects (a plan's copies per evaluation). Each of them counts towards the collector's
thresholds, and the full collections they trigger walk every object alive in the process (the
graph, the models, the members found): on op-level graphs of 1,800+ nodes those walks took a
quarter of the search's time. Acyclic objects are freed by reference counting whatever the
collector does, so pausing it changes nothing but when cycles made meanwhile are collected.
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator
from contextlib import contextmanager

_lock = threading.Lock()
_holders = 0
_was_enabled = False


@contextmanager
def paused_collection() -> Iterator[None]:
    """Automatic collection off while any holder (on any thread) is inside; the collector's
    state from before the first holder entered is restored when the last one leaves."""
    global _holders, _was_enabled
    with _lock:
        if _holders == 0:
            _was_enabled = gc.isenabled()
            gc.disable()
        _holders += 1
    try:
        yield
    finally:
        with _lock:
            _holders -= 1
            if _holders == 0 and _was_enabled:
                gc.enable()
