"""The engine facade: DeepSpeed's entry points (`initialize`, `init_distributed`), the engine's calls,
the learning-rate schedules and a client's own optimizer, and the config official DeepSpeed gets.
Off the stage path: what a stage computes is the top of the package; this is how a client reaches it.
"""
