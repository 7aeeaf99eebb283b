"""The harness's documented script: `torchrun --nproc_per_node=2 harness/train.py --impl nano ...`.

The training entry lives in the package (zero_lab/harness/train.py: its docstring lists the
commands and flags), so that an installed zero-lab has it too; this script and
`python -m zero_lab.harness` both run its `main`.
"""

from zero_lab.harness.train import run_as_script

if __name__ == "__main__":
    run_as_script()
