"""A CPU rank's predicted resident memory (`analysis.memory.resident`): the tensors' predicted peak plus
what the process of its impl holds beside them, from the table bench/resident_base.py measures; on
CUDA the tensors alone. Held against real runs in tests/cli/test_compare_e2e.py."""

from zero_lab.analysis.memory.resident import (base_resident_bytes, base_table, predicted_resident_bytes,
                                               resident_table)

MB = 2**20


def test_the_table_holds_each_impl_a_process_worth_of_memory():
    assert set(base_table()) == {"nano", "official", "fsdp2"}
    # the interpreter, torch, transformers and the engine: hundreds of MB, not tens nor gigabytes
    assert all(200 < mb < 1000 for mb in base_table().values()), base_table()
    assert base_table()["official"] > base_table()["nano"]  # official imports DeepSpeed besides


def test_the_base_is_added_on_a_cpu_host_only():
    peak = 36 * MB
    assert predicted_resident_bytes(peak, "official", "cpu") == peak + base_resident_bytes("official")
    assert predicted_resident_bytes(peak, "official", "cuda") == peak
    assert base_resident_bytes("mine") == base_resident_bytes("nano")  # an engine of your own: nano's


def test_a_runs_own_reading_replaces_the_tables_start():
    """In a summary the rank's own reading after initialize (this machine's libraries) plus what the steps
    add beside the tensors; the steps add tens of MB, a small part of the whole."""
    peak, beside = 36 * MB, 500 * MB
    growth = resident_table()["growth_in_steps_mb"]
    assert set(growth) == set(base_table()) and all(0 < mb < 0.2 * base_table()[impl] for impl, mb in growth.items())
    assert predicted_resident_bytes(peak, "nano", "cpu", beside) == peak + beside + int(growth["nano"] * MB)
    assert predicted_resident_bytes(peak, "nano", "cuda", beside) == peak


def test_officials_staging_beyond_a_small_models_gradients_is_not_resident():
    """tiny (854,400 parameters) under official's 20,000,000-element staging buffer: the peak counts the
    whole buffer, as the storage tracker does; what the gradients never write is left out of the resident
    figure. small (23.5M parameters) fills its buffer, and nano allocates none."""
    from zero_lab.analysis.memory.activation_memory import decoder_shape
    from zero_lab.analysis.memory.peak_memory import predict_peak

    tiny, small = decoder_shape("tiny"), decoder_shape("small")
    stage_1 = predict_peak(tiny, 1, "fp32", 2, 128, 4, reduce_bucket_size=20_000_000, impl="official")
    stage_2 = predict_peak(tiny, 2, "bf16", 2, 128, 4, reduce_bucket_size=20_000_000, impl="official")
    assert stage_1.untouched == (20_000_000 - 854_400) * 4 and stage_2.untouched == (20_000_000 - 854_400) * 2
    assert predict_peak(small, 2, "fp32", 2, 128, 4, reduce_bucket_size=20_000_000, impl="official").untouched == 0
    assert predict_peak(tiny, 2, "fp32", 2, 128, 4, reduce_bucket_size=20_000_000, impl="nano").untouched == 0
