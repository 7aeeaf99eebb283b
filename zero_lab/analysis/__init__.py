"""Pure functions behind the CLI on what runs wrote. Nothing here starts a process (that is
zero_lab.launch). One room per verb, each importing only the rooms listed before it:

    memory/     predict memory: model states (`estimate`), a step's peak (`peak_memory`), activations,
                whether a run fits (`memory_fit`)
    runs/       read what a run wrote: the rank-0 log (`logparse`), pandas tables (`tables`), the run
                directory (`rundir`), restarts (`restart_history`), timelines (`traces`), and `frames`,
                the notebook API that `zero_lab.load_steps` and its siblings expose; in `speed/`, how
                fast it trained: step times with their noise, tokens/s, TFLOP/s and MFU
    compare/    judge runs against each other: deltas and loss gaps (`comparison`), the verdict's
                rules (`metrics`), where runs part (`divergence`)
    report/     draw and report: markdown and text tables (`markdown`), plots and pictures, the
                versions a report names (`version_lock`)
    explain/    one optimizer step on paper: the walk-through (`explain`), its tables and picture,
                its check against a measured step, what stage 3 keeps gathered layer by layer
                (`gathered_over_step`), and the reading path of a stage
    diagnosis/  the doctor's findings from a run's files

pandas and matplotlib load only where a command uses them, never at the CLI's start-up."""
