"""DeepSpeed's own optimizer timers, told to a timeline while it watches, against DeepSpeed's timer classes."""

import sys

from zero_lab.workload.tracing import deepspeed_moments


def test_without_deepspeed_loaded_nothing_is_watched(monkeypatch):
    monkeypatch.delitem(sys.modules, deepspeed_moments.TIMER_MODULE, raising=False)
    heard = []
    deepspeed_moments.watch(lambda *said: heard.append(said))()
    assert heard == []


def test_both_timer_groups_tell_each_start_and_stop_and_are_restored():
    from deepspeed.utils.timer import NoopTimer, SynchronizedWallClockTimer

    originals = (NoopTimer.__call__, SynchronizedWallClockTimer.__call__)
    heard = []
    unwatch = deepspeed_moments.watch(lambda *said: heard.append(said))
    try:
        noop, wall_clock = NoopTimer(), SynchronizedWallClockTimer()
        noop("optimizer_gradients").start()
        noop("optimizer_gradients").stop()
        timer = wall_clock("optimizer_step")
        timer.start()
        timer.stop(record=False)
        assert wall_clock("optimizer_step").elapsed(reset=False) > 0  # DeepSpeed's own measurement still works
        assert noop("optimizer_allgather").elapsed() == 0
    finally:
        unwatch()
    assert heard == [("deepspeed", "optimizer_gradients", True), ("deepspeed", "optimizer_gradients", False),
                     ("deepspeed", "optimizer_step", True), ("deepspeed", "optimizer_step", False)]
    assert (NoopTimer.__call__, SynchronizedWallClockTimer.__call__) == originals
    heard.clear()
    NoopTimer()("optimizer_step").start()
    assert heard == []
