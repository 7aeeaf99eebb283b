"""What a CPU rank's heap keeps at its peak beside its live tensors: memory the step has freed, which glibc's
allocator holds for reuse instead of giving it back to the machine.

glibc's `malloc` serves a request below its mmap threshold from its heap and keeps what is freed there;
only the heap's top is ever given back. The threshold rises with the sizes freed, up to 32 MiB on a
64-bit machine (`DEFAULT_MMAP_THRESHOLD_MAX`); a tensor at or above that size is mapped on its own and
returned when it is freed. Two kinds of a step's tensors are freed before the peak, between tensors that
stay alive, so their holes stay resident:
- a layer's temporaries in the forward, freed between the tensors it saves for the backward: about as
  many bytes as the layers save (`ActivationBytes.per_layer`);
- the parameters gathered for a layer and released after it (stage 3; FSDP2, whose all-gather output is
  freed once copied into its unsharded parameters): one layer's worth per layer, once.
Measured (bench/peak_vs_predicted.py: 2 CPU ranks, fp32, 3 and 4 steps; the heap's share grows over the
first three steps, then holds): a rank's resident high-water mark less its tensors' peak and what it held
once its engine was built is 0.7-1.2 x the layers' saved activations on tiny and small at stages 0-2
(nano and official), and at stage 3 about the layers' parameters more. Where one gather or one layer's
tensors pass the ceiling (qwen3-0.6b's prefetches), the heap keeps less than counted here.

Phase 1: the layers' saved activations, when a layer's largest (the MLP's, tokens x i) is a heap tensor.
Phase 2: the layers' gathered parameters, when the unit gathered is one (nano and official gather each
         module's own parameters; FSDP2 a whole decoder layer).
"""

from __future__ import annotations

from zero_lab.analysis.memory.activation_memory import ActivationBytes, DecoderShape
from zero_lab.analysis.memory.decoder_parameters import layer_parameter_sizes, unit_parameters
from zero_lab.nano.dtypes import BYTES_OF_PRECISION

MMAP_CEILING_BYTES = 32 * 2**20  # glibc's highest mmap threshold on 64-bit: from here a tensor is mapped alone


def on_the_heap(size_bytes: int) -> bool:
    return size_bytes < MMAP_CEILING_BYTES


def heap_kept_bytes(shape: DecoderShape, precision: str, tokens: int, activations: ActivationBytes,
                    gathered_unit: str | None) -> int:
    """Phases 1-2 for one rank. tokens: a micro-batch's (seq_len x micro_batch); gathered_unit: None when
    the forward gathers no parameters, "module" (nano's and official's stage 3) or "layer" (FSDP2)."""
    width = BYTES_OF_PRECISION[precision]
    kept = shape.layers * activations.per_layer if on_the_heap(width * tokens * shape.intermediate_size) else 0
    if gathered_unit is not None:
        layer, _ = unit_parameters(shape)
        unit = max(layer_parameter_sizes(shape)) if gathered_unit == "module" else layer
        kept += shape.layers * layer * width if on_the_heap(width * unit) else 0
    return kept
