"""ZeRO++ (docs/zeropp.md), off the stage path: stage 3 with fewer or smaller bytes on the wire.

Each module imports only those listed before it:

    quantization            the block-wise formats: int8 weights, int4 gradients, and their error bounds
    hierarchical_partition  hpZ: a secondary partition within each node, so re-gathers stay in the node
    quantized_weights       qwZ: the gathers for compute send int8 blocks and their scales
    quantized_gradients     qgZ: the gradient reduce-scatter as two int4 all-to-alls, in the node then across

Each idea is a subclass of stage 3's optimizer (or buffer, or reducer); `initialize` picks the class
for the keys that are on, so the stages never import ZeRO++. The three keys are the typed config's
(`config/zeropp.py`), which every run reads whether or not ZeRO++ is on.
"""
