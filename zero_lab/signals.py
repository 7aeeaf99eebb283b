"""SIGTERM and SIGHUP stop a command as Ctrl-C does, so one clean-up path serves all three.

Python turns Ctrl-C (SIGINT) into KeyboardInterrupt in the main thread; `stop_signals_raise`
makes SIGTERM (`timeout`, a cancelled CI job, a SLURM preemption) and SIGHUP (the terminal went
away) raise `Stopped` there the same way. The launcher catches either (`INTERRUPTS`), stops the
process groups, keeps the logs and writes summary.json; the command exits 128 + the signal's
number, as a shell reports a process that signal ended: 130, 143 or 129 (`interrupted_exit_code`,
which a comparison's verdict reports too).

Below every layer of zero_lab (it imports nothing of it): `analysis` reads the exit code of a
stop, `launch` defers and holds the signals around a child, `cli` turns them into an exit.
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


def interrupted_exit_code(signal_name: str) -> int:
    """128 + the signal's number, as a shell reports a process it ended: SIGINT 130, SIGTERM 143, SIGHUP 129."""
    return 128 + signal.Signals[signal_name].value


def signal_name(interrupt: BaseException) -> str:
    """'SIGINT' for Ctrl-C's KeyboardInterrupt, else the name of the signal that raised Stopped."""
    return signal.Signals(getattr(interrupt, "signal_number", signal.SIGINT)).name


@contextlib.contextmanager
def handled_by(handler, numbers):
    """`handler` for each of the signals `numbers` while the block runs; their previous handlers after."""
    previous = {number: signal.signal(number, handler) for number in numbers}
    try:
        yield
    finally:
        for number, earlier in previous.items():
            signal.signal(number, earlier)


def stop_signals_raise():
    """While the command runs, SIGTERM and SIGHUP raise Stopped in the main thread."""

    def raise_stopped(signal_number, frame):
        raise Stopped(signal_number)

    return handled_by(raise_stopped, STOP_SIGNALS)


@contextlib.contextmanager
def deferred():
    """Ctrl-C, SIGTERM and SIGHUP noted while the block runs, and raised as they would have been
    once it is done. Starting a child goes inside one: a stop that lands half-way through would
    otherwise leave a process running that nothing knows of, and so nothing stops. (A child's
    handlers reset to the default when it executes its program, so it inherits none of this.)
    A signal that was ignored before stays ignored."""
    noted: list[int] = []
    watched = [number for number in (signal.SIGINT, *STOP_SIGNALS) if signal.getsignal(number) != signal.SIG_IGN]
    with handled_by(lambda signal_number, frame: noted.append(signal_number), watched):
        yield
    if noted:
        raise KeyboardInterrupt() if noted[0] == signal.SIGINT else Stopped(noted[0])


def held():
    """Ctrl-C, SIGTERM and SIGHUP ignored: a second one must not cut a clean-up short and leave
    workers running or a summary half written."""
    return handled_by(signal.SIG_IGN, (signal.SIGINT, *STOP_SIGNALS))
