"""Labs: a learner writes each ZeRO stage in a small engine of their own, checked byte by byte.

    catalog.py   the labs in course order: stage, functions to write, formula, hints
    skeleton/    the engine package `start` writes (given; runs stage 0); todo/ holds each lab's lab.py
    start.py     writes a lab's package and README into a directory
    check.py     the four checks over finished runs (runs, losses, bytes, wire), pure
The command is zero_lab/cli/lab_cmd.py; the learner's guide docs/labs.md.
"""
