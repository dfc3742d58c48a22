"""Ctrl-C during a solve or a runtime's call: the first asks for the answer, the second aborts.

`first_sigint_stops(stop)` makes the first SIGINT request `stop` (every share of the solve's
deadline sees it, and the engines running then are cancelled through their `Deadline.on_stop`
callbacks), so that the solve returns its best schedule; the second raises KeyboardInterrupt as
Python does by default. The handler takes no lock (NOTE [lock-free handler]): it marks the stop
(`Stop.mark`), and the watcher thread below calls the callbacks and the notice.
`call_deadline(time_limit, error)` is the one deadline of a runtime's whole call (its
`time_limit` checked) with that stop: `rematerialize`, `checkpoint_plan`, `fit` and `compile`
take it.

Python runs signal handlers only in the main thread and only between bytecodes, so a handler
alone would wait for the engine call in progress (CP-SAT, HiGHS: minutes). The handler is
therefore paired with `signal.set_wakeup_fd`: the interpreter's C-level handler writes each
signal's number to a pipe at once, and a watcher thread reading it requests the stop, which
cancels the engines and so brings the main thread back to Python.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Callable, Iterator

from solver.deadline import Deadline, Stop, check_time_limit

_QUIT = 0
"""The byte that ends the watcher (no signal has number 0)."""


@contextlib.contextmanager
def first_sigint_stops(stop: Stop, notice: Callable[[], None] | None = None) -> Iterator[None]:
    """Within the block, the first SIGINT requests `stop` (and calls `notice`, from the watcher
    thread); any later one raises KeyboardInterrupt in the main thread, at once or, where two
    arrived during one engine call, when the block ends. Nothing changes when
    called outside the main thread or when SIGINT has a handler other than Python's default
    (the caller's own handling is left alone)."""
    if (
        threading.current_thread() is not threading.main_thread()
        or signal.getsignal(signal.SIGINT) is not signal.default_int_handler
    ):
        yield
        return
    read_fd, write_fd = os.pipe()
    os.set_blocking(write_fd, False)
    seen = [0]  # SIGINTs the handler has run for
    received = [0]  # SIGINTs the watcher has read: signals arriving while the main thread is in
    # an engine call run the handler once, however many there were

    def watch() -> None:
        while True:
            data = os.read(read_fd, 64)
            first = not received[0]
            received[0] += data.count(signal.SIGINT)
            if first and received[0]:  # the stop's callbacks and the notice, once
                stop.request()
                if notice is not None:
                    notice()
            if not data or _QUIT in data:
                return

    def handler(signum: int, frame: object) -> None:
        # NOTE [lock-free handler]: the main thread may be inside any lock here (the stop's,
        # a print's); the handler only counts and marks, and the watcher does the rest
        seen[0] += 1
        if seen[0] > 1:
            raise KeyboardInterrupt
        stop.mark()

    watcher = threading.Thread(target=watch, name="remat-sigint", daemon=True)
    watcher.start()
    previous_fd = signal.set_wakeup_fd(write_fd)
    signal.signal(signal.SIGINT, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.set_wakeup_fd(previous_fd)
        os.write(write_fd, bytes([_QUIT]))
        watcher.join()
        os.close(read_fd)
        os.close(write_fd)
    if received[0] > 1:  # a second SIGINT whose handler run merged with the first's
        raise KeyboardInterrupt


@contextlib.contextmanager
def call_deadline(
    time_limit: float, error: type[Exception], notice: Callable[[], None] | None = None
) -> Iterator[Deadline]:
    """The deadline of a whole call, `time_limit` seconds from now, whose stop the first
    SIGINT within the block requests (`first_sigint_stops`, with `notice`): the call then ends
    as at its time limit, with what it has, and a second SIGINT raises KeyboardInterrupt.
    `error`, the caller's class, refuses a `time_limit` that is not a positive number of
    seconds (`check_time_limit`: one message)."""
    check_time_limit(time_limit, error)
    stop = Stop()
    with first_sigint_stops(stop, notice):
        yield Deadline.after(time_limit, stop)
