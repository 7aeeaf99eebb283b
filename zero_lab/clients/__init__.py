"""A user's own DeepSpeed script, run by zero-lab: `zero-lab exec` and `zero-lab compare --script`.

    site/sitecustomize.py  run by every Python process zero-lab starts for a script (its directory
                           is first on PYTHONPATH, `zero_lab.launch.engine_switch`): calls `startup`
    startup.py             prepares official DeepSpeed as the harness does and, when asked
                           (ZERO_LAB_LOG_CONTRACT=1), installs the log contract; loads no torch itself
    post_import.py         run a function right after a module is imported
    contract.py            the log contract of a script's engine: meters started when torch is
                           imported, `deepspeed.initialize` wrapped, `[zero]`, `[model]`, `[comm]`
    step_hook.py           an engine's forward, backward and step wrapped: `[opt_step k]`, `[phase]`

The same hook serves both impls: it wraps whatever `deepspeed` the script imports (nano's drop-in
or official DeepSpeed), and measures with the built-in workload's meters (`zero_lab.workload`).
It sits above `workload` and `nano`, which know nothing of it.
"""
