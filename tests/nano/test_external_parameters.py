"""Stage 3's external parameters (a parameter a module uses but does not own): nano beside the
single-process AdamW reference and official DeepSpeed 0.19.8 at 2 and 3 gloo ranks, DeepSpeed's
`register_external_parameter` API, and the watch on parameter reads that finds them."""

import copy
import pickle

import pytest
import torch

from tests.nano import external_parameter_workers
from tests.spawn import run_distributed
from zero_lab.nano.external_parameters import WatchedParameters, unwatch, watch


@pytest.mark.slow
@pytest.mark.official
@pytest.mark.parametrize("world_size", [2, 3])
def test_external_parameters_train_as_the_reference_and_gather_as_official(world_size):
    assert run_distributed(external_parameter_workers.side_by_side_worker, world_size) == []


@pytest.mark.slow
@pytest.mark.official
def test_register_and_unregister_do_what_officials_do():
    assert run_distributed(external_parameter_workers.api_worker, 1) == []


@pytest.mark.slow
@pytest.mark.official
def test_gathered_parameters_fwd_module_registers_and_trains_where_official_refuses():
    assert run_distributed(external_parameter_workers.fwd_module_worker, 2) == []


@pytest.mark.slow
def test_a_leaf_modules_inner_module_gathers_inside_the_forward_and_raises_outside():
    assert run_distributed(external_parameter_workers.leaf_module_worker, 2) == []


def test_set_z3_leaf_modules_marks_the_units_the_configs_leaf_module_names():
    assert run_distributed(external_parameter_workers.marked_leaf_worker, 2) == []


@pytest.mark.slow
@pytest.mark.official
def test_official_gathers_nothing_for_a_call_outside_the_forward():
    assert run_distributed(external_parameter_workers.official_outside_forward_worker, 1) == []


def test_a_read_by_name_is_seen_and_a_copy_of_the_module_is_not_watched():
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 1))
    expected = [model[0].weight, model[1].bias]
    seen = []
    watch(model, seen.append)
    model[0].weight, model[1].bias  # noqa: B018 - a read by name is what is watched
    assert [name for name, _ in model.named_parameters()] == ["0.weight", "0.bias", "1.weight", "1.bias"]
    assert len(model.state_dict()) == 4
    assert [id(parameter) for parameter in seen] == [id(parameter) for parameter in expected]  # listing reads none
    for copied in (copy.deepcopy(model), pickle.loads(pickle.dumps(model))):
        assert all(type(module._parameters) is dict for module in copied.modules())
        assert torch.equal(copied[0].weight, model[0].weight)
    unwatch(model)
    assert all(type(module._parameters) is dict for module in model.modules())
    assert not isinstance(model[0]._parameters, WatchedParameters)
