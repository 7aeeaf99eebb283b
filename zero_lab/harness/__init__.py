"""The harness: the torchrun entry that trains one workload under nano or official DeepSpeed.

    train.py     the entry: checks, meters, engine, steps; rank 0 prints the log contract
    configs/     the default DeepSpeed JSON config per stage (zero<stage>.json)

It ships inside the package, so a non-editable install (`pip install .`) can run
`zero-lab run` and `python -m zero_lab.harness`; the checkout's `harness/train.py` is the
documented script and runs the same `main`.
"""
