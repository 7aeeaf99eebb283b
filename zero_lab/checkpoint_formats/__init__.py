"""One training state, four checkpoint formats: DeepSpeed's ZeRO files, DeepSpeed's universal
checkpoint, FSDP2's distributed checkpoint (DCP) and Hugging Face weights, read and written one
tensor at a time (`zero-lab checkpoint convert|inspect`).

Vocabulary:
    source       one checkpoint opened for reading (`<format>.open_source`): its facts, and
                 `read(name, key)`, one parameter's whole fp32 values of one key, made on demand
    key          "master" (the fp32 parameter), "exp_avg", "exp_avg_sq" (Adam's moments)
    facts        everything that is not a parameter's values (`common.Facts`): names, shapes,
                 parameter groups, Adam's step, the counters, the schedule, the loss scaler
    target       a format's `write(source, out, options)`: it asks the source for one key of one
                 parameter at a time and puts it where the format keeps it
    scratch      where a DeepSpeed target assembles each rank's partitions: files mapped into
                 memory (`common.Scratch`), so the rank files are built on disk, not in RAM

What each format holds (the docs' table, docs/checkpoints.md "Moving between engines"):
    deepspeed    masters, moments, step, groups, schedule, counters, loss scaler, config
    universal    the same, one directory per parameter (official loads it at any world size)
    dcp          masters, moments, step, groups, schedule, counters (no loss scaler, no config)
    hf           the weights only
"""
