"""SIGTERM and SIGHUP stop a command as Ctrl-C does, so one clean-up path serves all three.

Python turns Ctrl-C (SIGINT) into KeyboardInterrupt in the main thread; `stop_signals_raise`
makes SIGTERM (`timeout`, a cancelled CI job, a SLURM preemption) and SIGHUP (the terminal went
away) raise `Stopped` there the same way. The launcher catches either (`INTERRUPTS`), stops the
process groups, keeps the logs and writes summary.json; the command exits 128 + the signal's
number, as a shell reports a process that signal ended: 130, 143 or 129.
"""

from __future__ import annotations

import contextlib
import signal

STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)


class Stopped(BaseException):
    """A stop signal other than Ctrl-C; a BaseException, as KeyboardInterrupt is, so that no
    `except Exception` swallows it."""

    def __init__(self, signal_number: int):
        super().__init__(signal.Signals(signal_number).name)
        self.signal_number = signal_number


INTERRUPTS = (KeyboardInterrupt, Stopped)


def signal_name(interrupt: BaseException) -> str:
    """'SIGINT' for Ctrl-C's KeyboardInterrupt, else the name of the signal that raised Stopped."""
    return signal.Signals(getattr(interrupt, "signal_number", signal.SIGINT)).name


@contextlib.contextmanager
def stop_signals_raise():
    """While the command runs, SIGTERM and SIGHUP raise Stopped in the main thread."""

    def raise_stopped(signal_number, frame):
        raise Stopped(signal_number)

    previous = {number: signal.signal(number, raise_stopped) for number in STOP_SIGNALS}
    try:
        yield
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)


@contextlib.contextmanager
def held():
    """Ctrl-C, SIGTERM and SIGHUP ignored: a second one must not cut a clean-up short and leave
    workers running or a summary half written."""
    previous = {number: signal.signal(number, signal.SIG_IGN) for number in (signal.SIGINT, *STOP_SIGNALS)}
    try:
        yield
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)
