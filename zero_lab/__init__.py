"""zero-lab: nano, a readable ZeRO engine, and a harness that measures it against official DeepSpeed.

Layers, each importing only the ones below it:
    zero_lab.nano       the engine (collectives -> flat buffers -> per-stage optimizers -> initialize)
    zero_lab.workload   the training workload: models, data, memory and communication meters, log lines
    zero_lab.harness    the torchrun entry that runs the workload under nano or official DeepSpeed
                        (the checkout's harness/train.py is its documented script)
    zero_lab.analysis   pure functions on finished runs: log parsing, metrics, verdicts, reports, estimates
    zero_lab.launch     starting, watching and stopping one torchrun job (command, port, stall, signals)
    zero_lab.cli        the `zero-lab` command: run, compare, parse, report, estimate, explain, doctor
"""

__version__ = "0.1.0"
