"""Launching: everything that starts, watches and stops a torchrun job.

    torchrun.py       what one launch is (LaunchSpec) and its exact argv and environment: pure
    torchrun_job.py   run one LaunchSpec to completion in a run directory, with progress and a clean stop
    stall.py          stop a run whose steps stopped arriving (--stall-timeout)
    memory_watch.py   sample every rank's memory; say when a rank killed by SIGKILL ran out of it
    workers.py        torchrun's worker processes by rank (what both watches look at)
    moments.py        named moments where a fault test can pause a command and interrupt it

It sits above `analysis` (a finished run is parsed and summarised) and below `cli`. The stop signals
(Ctrl-C, SIGTERM and SIGHUP as one exception, deferred while a child starts, held off while
cleaning up) are `zero_lab.signals`, below every layer: a comparison's verdict reports their exit code.
"""
