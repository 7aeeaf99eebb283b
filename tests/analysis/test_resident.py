"""A CPU rank's predicted resident memory (`analysis.memory.resident`): the tensors' predicted peak, less
what is allocated and never written, plus what the heap keeps (`analysis.memory.heap_kept`) and what the
process of its impl holds beside its tensors once its engine is built (the table bench/resident_base.py
measures, or the run's own reading); on CUDA the tensors alone. Held against real runs in
tests/analysis/test_resident_runs.py and tests/cli/test_compare_e2e.py."""

from zero_lab.analysis.memory.activation_memory import activation_bytes, decoder_shape
from zero_lab.analysis.memory.decoder_parameters import unit_parameters
from zero_lab.analysis.memory.heap_kept import MMAP_CEILING_BYTES
from zero_lab.analysis.memory.peak_memory import predict_peak
from zero_lab.analysis.memory.resident import base_resident_bytes, base_table, predicted_resident_bytes

MB = 2**20
BUCKET = 20_000_000


def test_the_table_holds_each_impl_a_process_worth_of_memory():
    assert set(base_table()) == {"nano", "official", "fsdp2"}
    # the interpreter, torch, transformers and the engine: hundreds of MB, not tens nor gigabytes
    assert all(200 < mb < 1000 for mb in base_table().values()), base_table()
    assert base_table()["official"] > base_table()["nano"]  # official imports DeepSpeed besides
    assert base_resident_bytes("mine") == base_resident_bytes("nano")  # an engine of your own: nano's


def test_on_a_cpu_the_heap_and_the_process_are_added_on_cuda_the_tensors_alone():
    prediction = predict_peak(decoder_shape("small"), 2, "fp32", 2, 128, 4, reduce_bucket_size=BUCKET)
    assert prediction.heap_kept > 0 and prediction.untouched == 0
    tensors_and_heap = prediction.peak + prediction.heap_kept
    assert predicted_resident_bytes(prediction, "nano", "cpu") == tensors_and_heap + base_resident_bytes("nano")
    assert predicted_resident_bytes(prediction, "nano", "cpu", 500 * MB) == tensors_and_heap + 500 * MB
    assert predicted_resident_bytes(prediction, "nano", "cuda") == prediction.peak


def test_the_heap_keeps_the_layers_activations_and_where_the_forward_gathers_their_parameters():
    """small, 512 tokens: the layers' saved activations at stages 0-2; at stage 3 (each module's parameters
    gathered) and with FSDP2 at stages 2 and 3 (a decoder layer gathered, its all-gather output freed)
    also the layers' parameters once."""
    small = decoder_shape("small")
    layers_activations = small.layers * activation_bytes(small, 128, 4, "fp32").per_layer
    layers_parameters = small.layers * unit_parameters(small)[0] * 4
    for stage in (0, 1, 2):
        for impl in ("nano", "official"):
            assert predict_peak(small, stage, "fp32", 2, 128, 4, reduce_bucket_size=BUCKET,
                                impl=impl).heap_kept == layers_activations
    for stage, impl in ((3, "nano"), (3, "official"), (2, "fsdp2"), (3, "fsdp2")):
        assert predict_peak(small, stage, "fp32", 2, 128, 4, reduce_bucket_size=BUCKET,
                            impl=impl).heap_kept == layers_activations + layers_parameters


def test_what_is_as_large_as_glibcs_mmap_ceiling_is_given_back_not_kept():
    """qwen3-0.6b: a decoder layer's parameters (60 MiB in fp32) are mapped on their own, so FSDP2's freed
    all-gather output is returned while nano's per-module units (12 MiB at most) stay on the heap; at
    16,384 tokens a layer's MLP activation (192 MiB) is mapped too."""
    model = decoder_shape("qwen3-0.6b")
    layer = unit_parameters(model)[0]
    assert layer * 4 >= MMAP_CEILING_BYTES > 1024 * 3072 * 4
    activations = model.layers * activation_bytes(model, 128, 4, "fp32").per_layer
    assert predict_peak(model, 3, "fp32", 2, 128, 4, impl="fsdp2").heap_kept == activations
    assert predict_peak(model, 3, "fp32", 2, 128, 4, impl="nano").heap_kept == activations + model.layers * layer * 4
    assert predict_peak(model, 2, "fp32", 2, 4096, 4, impl="nano").heap_kept == 0


def test_officials_buffer_beyond_a_small_models_gradients_is_not_resident():
    """tiny (854,400 parameters) under official's 20,000,000-element buffer: the peak counts the whole
    buffer, as the storage tracker does; what the gradients never write is left out of the resident
    figure. small (23.5M parameters) fills its buffer, and nano allocates none. Stage 3's reduce bucket
    exists once the engine is built, so a run's own reading then (resident less allocated) lacks it too."""
    tiny, small = decoder_shape("tiny"), decoder_shape("small")
    stage_1 = predict_peak(tiny, 1, "fp32", 2, 128, 4, reduce_bucket_size=BUCKET, impl="official")
    stage_2 = predict_peak(tiny, 2, "bf16", 2, 128, 4, reduce_bucket_size=BUCKET, impl="official")
    stage_3 = predict_peak(tiny, 3, "fp32", 2, 128, 4, reduce_bucket_size=BUCKET, impl="official")
    assert stage_1.untouched == (BUCKET - 854_400) * 4 and stage_2.untouched == (BUCKET - 854_400) * 2
    assert stage_3.untouched == stage_3.untouched_at_initialize == (BUCKET - 854_400) * 4
    assert stage_1.untouched_at_initialize == stage_2.untouched_at_initialize == 0
    assert predicted_resident_bytes(stage_3, "official", "cpu", 300 * MB) == (
        stage_3.peak + stage_3.heap_kept + 300 * MB)
    assert predict_peak(small, 2, "fp32", 2, 128, 4, reduce_bucket_size=BUCKET, impl="official").untouched == 0
    assert predict_peak(tiny, 2, "fp32", 2, 128, 4, reduce_bucket_size=BUCKET, impl="nano").untouched == 0
