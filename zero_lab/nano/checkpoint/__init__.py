"""DeepSpeed's checkpoints, off the step's path: `engine.save_checkpoint`/`load_checkpoint` and the
CLI's offline tools (docs/checkpoints.md). Each module imports only those listed before it:

    reshard     partition -> whole parameter -> partition, pure tensor arithmetic
    files       the files' names on disk, a safe write, a checked read
    contents    what the files hold, in official DeepSpeed's keys; `SavedTraining` reads them back
    save        the engine's save_checkpoint (every rank, collectives)
    load        the engine's load_checkpoint (every rank, collectives)
    offline     inspect, consolidate and reshard on one process, without an engine

The stage decides the layout on disk (`stages.Stage.checkpoint`); nothing here compares stage numbers.
"""
