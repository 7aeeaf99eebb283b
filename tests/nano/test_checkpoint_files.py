"""Checkpoints on one process: resharding arithmetic, and every bad checkpoint as one line that
names the problem and the fix, with the engine left as it was."""

import os

import pytest
import torch

from tests.nano.checkpoint_workers import checkpoint_config, snapshot, start, train
from tests.nano.test_engine_api import single_process  # noqa: F401 (the fixture)
from zero_lab.nano.checkpoint import files as checkpoint_files, reshard
from zero_lab.nano import stages
from zero_lab.nano.errors import CheckpointError
from zero_lab.nano.layout import FlatLayout

NUMELS = [91, 13, 1, 65, 7]


@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
@pytest.mark.parametrize("cut", [reshard.FLAT, reshard.PER_PARAMETER])
def test_partition_to_whole_to_partition_gives_every_element_back(world_size, cut):
    wholes = [torch.randn(numel) for numel in NUMELS]
    layout = FlatLayout.for_stage(tuple(NUMELS), 2, "fp32", world_size)
    if cut == reshard.FLAT:
        stored = [reshard.stored_flat(reshard.flat_partition(wholes, layout, rank), layout, rank, True)
                  for rank in range(world_size)]
        assert sum(tensor.numel() for tensor in stored) == sum(NUMELS)  # padding is not stored
    else:
        stored = [reshard.per_parameter_partition(wholes, world_size, rank) for rank in range(world_size)]
    back = reshard.whole_parameters(stored, NUMELS, cut)
    assert all(torch.equal(mine, theirs) for mine, theirs in zip(back, wholes))
    other = FlatLayout.for_stage(tuple(NUMELS), 1, "fp32", 3)
    joined = torch.cat([reshard.flat_partition(back, other, rank) for rank in range(3)])
    assert torch.equal(joined[:sum(NUMELS)], torch.cat(wholes)) and not joined[sum(NUMELS):].any()


def _saved(tmp_path) -> tuple[str, str]:
    engine = start(checkpoint_config(2))
    train(engine, range(2), 0)
    engine.save_checkpoint(str(tmp_path), client_state={"epoch": 3})
    engine.destroy()
    return str(tmp_path), os.path.join(str(tmp_path), "global_step2")


def _refused(directory: str, expected: str, tag=None) -> None:
    engine = start(checkpoint_config(2), seed=1)
    before = snapshot(engine)
    with pytest.raises(CheckpointError) as refusal:
        engine.load_checkpoint(directory, tag=tag)
    message = str(refusal.value)
    assert expected in message and "\n" not in message
    after = snapshot(engine)
    assert all(torch.equal(before[name], after[name]) for name in before), "a refused load changed the model"
    engine.destroy()


def test_round_trip_and_nothing_to_load(single_process, tmp_path):
    directory, _ = _saved(tmp_path)
    engine = start(checkpoint_config(2), seed=1)
    assert engine.load_checkpoint(str(tmp_path / "empty")) == (None, None)
    path, client_state = engine.load_checkpoint(directory)
    assert path.endswith("global_step2/mp_rank_00_model_states.pt") and client_state == {"epoch": 3}
    assert engine.global_steps == 2 and engine.global_samples == 8


def test_missing_truncated_and_corrupt_files_are_refused_in_one_line(single_process, tmp_path):
    directory, tag_directory = _saved(tmp_path)
    optimizer_file = os.path.join(tag_directory, checkpoint_files.optim_states_name("fp32", 0))
    whole = open(optimizer_file, "rb").read()
    with open(optimizer_file, "wb") as handle:
        handle.write(whole[:len(whole) // 2])
    _refused(directory, "truncated or corrupt")
    with open(optimizer_file, "wb") as handle:
        handle.write(b"\x00garbage" * 100)
    _refused(directory, "truncated or corrupt")
    with open(optimizer_file, "wb") as handle:
        handle.write(whole)
    os.remove(os.path.join(tag_directory, checkpoint_files.model_states_name(stages.FLAT_FILES, 0)))
    _refused(directory, "is missing")
    os.remove(optimizer_file)
    _refused(directory, "has no *_optim_states.pt files")


def test_missing_tags_and_other_shapes_are_refused_in_one_line(single_process, tmp_path):
    directory, _ = _saved(tmp_path)
    _refused(directory, "tag 'global_step9' does not exist", tag="global_step9")
    import tests.nano.stage3_reference as trap
    wider = trap.WIDTH
    trap.WIDTH = wider + 1
    try:
        _refused(directory, "has shape")
    finally:
        trap.WIDTH = wider
    with open(os.path.join(directory, checkpoint_files.LATEST), "w") as handle:
        handle.write("global_step7")
    _refused(directory, "names tag 'global_step7', which does not exist")


def test_a_checkpoint_loads_into_another_stage_and_precision(single_process, tmp_path):
    directory, _ = _saved(tmp_path)
    stage2 = start(checkpoint_config(2), seed=1)
    stage2.load_checkpoint(directory)
    expected = snapshot(stage2)
    engine = start(checkpoint_config(3, "bf16"), seed=1)
    engine.load_checkpoint(directory)
    loaded = snapshot(engine)
    assert engine.global_steps == 2
    assert all(torch.equal(loaded[name], expected[name].to(torch.bfloat16)) for name in expected)


def _fp16_stage3_saved(tmp_path) -> tuple[object, str]:
    """fp16 at stage 3 trained until the dynamic scaler has overflowed and moved; saved."""
    engine = start(checkpoint_config(3, "fp16"))
    train(engine, range(3), 0)
    assert engine.skipped_steps > 0, "no overflow: the scaler's state would go untested"
    engine.save_checkpoint(str(tmp_path))
    return engine, os.path.join(str(tmp_path), f"global_step{engine.global_steps}",
                                checkpoint_files.optim_states_name("fp16", 0))


def test_the_loss_scaler_is_written_as_officials_object_and_old_dict_files_still_load(single_process, tmp_path):
    from zero_lab.nano.checkpoint.contents import scaler_fields
    saver, optimizer_file = _fp16_stage3_saved(tmp_path)
    expected = scaler_fields(saver.optimizer.loss_scaler)
    stored = checkpoint_files.read_file(optimizer_file)["optimizer_state_dict"]["loss_scaler"]
    assert isinstance(stored, checkpoint_files.OfficialDynamicLossScaler)
    assert {key: value for key, value in vars(stored).items() if key in expected} == expected
    for old_format in (False, True):  # nano's files before this change held the scaler's fields as a dict
        if old_format:
            states = checkpoint_files.read_file(optimizer_file)
            states["optimizer_state_dict"]["loss_scaler"] = scaler_fields(stored)
            checkpoint_files.write_file(states, optimizer_file)
        engine = start(checkpoint_config(3, "fp16"), seed=1)
        engine.load_checkpoint(str(tmp_path))
        assert scaler_fields(engine.optimizer.loss_scaler) == expected, f"old format: {old_format}"
        engine.destroy()
    saver.destroy()


@pytest.mark.official
def test_official_unpickles_the_loss_scaler_as_its_own_class_and_can_call_it(single_process, tmp_path):
    """Official's load takes the scaler object as it is and calls it (a dict broke its first backward)."""
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    from deepspeed.runtime.fp16.loss_scaler import DynamicLossScaler, LossScaler
    saver, optimizer_file = _fp16_stage3_saved(tmp_path)
    scale = saver.current_loss_scale()
    stored = torch.load(optimizer_file, weights_only=False)["optimizer_state_dict"]["loss_scaler"]
    assert type(stored) is DynamicLossScaler and stored.loss_scale == scale
    assert stored.scale_loss(torch.tensor(3.0)).item() == 3.0 * scale
    stored.update_scale(False)  # every field its update reads is there
    saver.destroy()
    fp32 = start(checkpoint_config(3))
    train(fp32, range(1), 0)
    fp32.save_checkpoint(str(tmp_path / "fp32"))
    stored = torch.load(str(tmp_path / "fp32" / "global_step1" / checkpoint_files.optim_states_name("fp32", 0)),
                        weights_only=False)["optimizer_state_dict"]["loss_scaler"]
    assert type(stored) is LossScaler and stored.scale_loss(torch.tensor(3.0)).item() == 3.0
    fp32.destroy()


def _without_optimizer_files(directory: str) -> None:
    tag_directory = os.path.join(directory, open(os.path.join(directory, checkpoint_files.LATEST)).read())
    for name in os.listdir(tag_directory):
        if name.endswith("_optim_states.pt"):
            os.remove(os.path.join(tag_directory, name))


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_load_module_only_needs_no_optimizer_files_below_stage_3(single_process, tmp_path, precision):
    """As official's load_module_only: the parameters from the model states' `module` (in the model's
    dtype); a full load still needs the optimizer files, and says so in one line."""
    saver = start(checkpoint_config(2, precision))
    train(saver, range(2), 0)
    saver.save_checkpoint(str(tmp_path))
    expected = snapshot(saver)
    saver.destroy()
    _without_optimizer_files(str(tmp_path))
    for options in ({"load_module_only": True}, {"load_optimizer_states": False}):
        engine = start(checkpoint_config(2, precision), seed=1)
        path, _ = engine.load_checkpoint(str(tmp_path), **options)
        loaded = snapshot(engine)
        assert path is not None and all(torch.equal(loaded[name], expected[name]) for name in expected), options
        train(engine, range(2, 3), 0)  # and it trains on
        engine.destroy()
    _refused(str(tmp_path), "has no *_optim_states.pt files")


def test_load_module_only_of_a_stage3_checkpoint_without_optimizer_files_is_refused_in_one_line(single_process,
                                                                                             tmp_path):
    saver = start(checkpoint_config(3))
    train(saver, range(1), 0)
    saver.save_checkpoint(str(tmp_path))
    saver.destroy()
    _without_optimizer_files(str(tmp_path))
    engine = start(checkpoint_config(3), seed=1)
    with pytest.raises(CheckpointError) as refusal:
        engine.load_checkpoint(str(tmp_path), load_module_only=True)
    assert "holds no whole values" in str(refusal.value) and "\n" not in str(refusal.value)
    engine.destroy()


@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_a_range_copied_out_of_the_chunked_files_is_the_whole_parameters_range(world_size):
    """Stage 3's load at the saved world size copies each range of a parameter out of the chunks
    that hold it (`ChunkedFiles.copy_range`): every range equals that range of the whole values,
    across sub-groups and ranks, for the master and both moments."""
    from collections import OrderedDict

    from zero_lab.nano.checkpoint.contents import ChunkedFiles, optimizer_states

    generator = torch.Generator().manual_seed(world_size)
    shapes = OrderedDict([("a", torch.Size([5, 3])), ("b", torch.Size([7])), ("c", torch.Size([2, 4])),
                          ("d", torch.Size([1]))])
    keys = ("master", "exp_avg", "exp_avg_sq")
    whole = {key: {name: torch.randn(shape.numel(), generator=generator) for name, shape in shapes.items()}
             for key in keys}
    parts = [["a", "b"], ["c", "d"]]  # two sub-groups of one parameter group
    param_shapes = [OrderedDict((name, shapes[name]) for name in part) for part in parts]
    optimizer_files = []
    for rank in range(world_size):
        stored = {key: [reshard.per_parameter_partition([whole[key][name] for name in part], world_size, rank)
                        for part in parts] for key in keys}
        moments = [{"exp_avg": stored["exp_avg"][index], "exp_avg_sq": stored["exp_avg_sq"][index]}
                   for index in range(len(parts))]
        optimizer_files.append(optimizer_states(3, world_size, [{"lr": 1.0}], [0, 0], stored["master"], moments,
                                                [4, 4], {}))
    chunked = ChunkedFiles(optimizer_files, param_shapes)
    assert chunked.has_moments() and chunked.step() == 4
    for key in keys:
        for name, shape in shapes.items():
            for start in range(shape.numel()):
                for stop in range(start + 1, shape.numel() + 1):
                    out = torch.full((stop - start,), float("nan"))
                    chunked.copy_range(key, name, start, out)
                    assert torch.equal(out, whole[key][name][start:stop]), (key, name, start, stop)
