"""The training workload a rank runs, and what the rank measures while it runs.

Here: the model (`models`, `model_shapes`), tokens and data (`tokenizer`, `data`), a run's flags
and config (`run_config`, `optimizer_choice`, `state_formula`), nodes, and where a rank is in its
loop (`step_phase`). Rooms beside it:
    log_contract/  the `[tag] key=value` lines a rank prints (docs/log-format.md): writer and tokenizer
    engines/       which engine a run uses: nano, official DeepSpeed and what its import needs, the
                   user's own
    meters/        the rank-side meters: memory, collectives and their wire bytes, a step's figures,
                   parameter norms, the flight record of the last collectives
    tracing/       `--trace` and `explain --measure` inside a rank: the timeline, the memory history,
                   the engines' moments
    faults/        named pauses for fault tests, restarts, and an out-of-memory told in one line
"""
