"""`python -m zero_lab.harness <flags>`: the harness entry, as `harness/train.py` runs it."""

from zero_lab.harness.train import run_as_script

run_as_script()
