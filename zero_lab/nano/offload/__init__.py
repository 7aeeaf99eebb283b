"""CPU offload, off the stage path: where a partition lives when the config moves it to the host.

    placement   `OffloadPlacement`: fp32 master, optimizer-state and gradient partitions on the
                host with `offload_optimizer`, stage 3's parameter partitions with `offload_param`

`initialize` hands it to the engine instead of the on-device `placement.Placement` (FSDP2's
`CPUOffloadPolicy` beside its `OffloadPolicy`); the mechanism asks either the same questions.
"""
