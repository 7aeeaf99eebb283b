"""Stop signals deferred while a child starts: noted inside the block, raised as they would have
been once it is done, and a signal that was ignored stays ignored."""

import signal

import pytest

from zero_lab import signals


@pytest.fixture
def ctrl_c_raises():
    """SIGINT handled as Python handles it in a terminal. A pytest started in the background by a
    shell without job control (`pytest ... &` in a script) inherits SIGINT ignored, and Python keeps
    it ignored: `deferred` then rightly leaves it alone, and nothing would be raised."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


def test_a_ctrl_c_inside_the_block_is_raised_once_the_block_is_done(ctrl_c_raises):
    finished_inside = False
    with pytest.raises(KeyboardInterrupt):
        with signals.deferred():
            signal.raise_signal(signal.SIGINT)  # to this thread; Python runs the handler before it returns
            finished_inside = True
    assert finished_inside
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler, "the previous handler is back"


def test_sigterm_is_raised_as_stopped_with_its_number():
    with signals.stop_signals_raise():
        with pytest.raises(signals.Stopped) as stopped:
            with signals.deferred():
                signal.raise_signal(signal.SIGTERM)
        assert stopped.value.signal_number == signal.SIGTERM and signals.signal_name(stopped.value) == "SIGTERM"


def test_nothing_is_raised_without_a_signal_and_an_ignored_one_stays_ignored():
    previous = signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        with signals.deferred():
            signal.raise_signal(signal.SIGHUP)
        assert signal.getsignal(signal.SIGHUP) == signal.SIG_IGN
    finally:
        signal.signal(signal.SIGHUP, previous)
