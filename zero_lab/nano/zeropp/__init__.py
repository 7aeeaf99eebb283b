"""ZeRO++ (docs/zeropp.md), off the stage path: stage 3 with fewer or smaller bytes on the wire.

Each module imports only those listed before it:

    config                  the three keys (DeepSpeed's names), read at stage 3 only
    quantization            the block-wise formats: int8 weights, int4 gradients, and their error bounds
    hierarchical_partition  hpZ: a secondary partition within each node, so re-gathers stay in the node
    quantized_weights       qwZ: the gathers for compute send int8 blocks and their scales
    quantized_gradients     qgZ: the gradient reduce-scatter as two int4 all-to-alls, in the node then across

Each idea is a subclass of stage 3's optimizer (or buffer, or reducer); `initialize` picks the class
for the keys that are on, so the stages never import ZeRO++.
"""
