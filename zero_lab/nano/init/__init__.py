"""`zero.Init`'s partitions, off the stage path: parameters partitioned as they are built.

    partitions  each rank keeps a 1/N slice of each parameter from its module's __init__ on; a
                use before any engine gathers it for a while (`zero.GatheredParameters`), and
                `InitPartitions` is where an engine's flat buffers read such a parameter from

`zero.py` (DeepSpeed's `zero.Init`) partitions; `initialize` hands the engine `InitPartitions`
when a model was built so, instead of the flat buffer's plain `WholeParameters`.
"""
