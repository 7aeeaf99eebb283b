"""The DeepSpeed-shaped API on one process: entry points, accessors, refusals, comm and memory reports."""

import argparse

import pytest
import torch
import torch.distributed

import zero_lab.nano as nano
from tests.nano.reference import build_model, loss_of, micro_batch, parameter_groups
from tests.nano.workers import nano_config
from tests.ports import free_port


@pytest.fixture
def single_process(monkeypatch):
    for name, value in dict(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), RANK="0", WORLD_SIZE="1").items():
        monkeypatch.setenv(name, value)
    nano.init_distributed()
    nano.init_distributed()  # a second call is harmless
    try:
        yield
    finally:
        torch.distributed.destroy_process_group()


def test_accessors_follow_deepspeed(single_process):
    config = nano_config(2, accumulation=2, scheduler={"type": "WarmupLR", "params": {
        "warmup_min_lr": 0.0, "warmup_max_lr": 0.01, "warmup_num_steps": 4, "warmup_type": "linear"}})
    model = build_model()
    engine, optimizer, loader, scheduler = nano.initialize(model=model, model_parameters=parameter_groups(model, 0.1),
                                                           config=config)
    assert (engine.train_batch_size(), engine.train_micro_batch_size_per_gpu(), engine.gradient_accumulation_steps(),
            engine.zero_optimization_stage()) == (4, 2, 2, 2)
    assert loader is None and engine.module is model and optimizer is engine.optimizer
    assert engine.get_lr() == [0.0, 0.0] and engine.get_global_grad_norm() is None
    boundaries = []
    for micro in range(4):
        boundaries.append(engine.is_gradient_accumulation_boundary())
        engine.backward(loss_of(engine, micro_batch(0, micro, 0, 2)))
        engine.step()
    assert boundaries == [False, True, False, True]
    assert (engine.global_steps, engine.micro_steps, engine.global_samples) == (2, 4, 8)
    # DeepSpeed's WarmupLR: iteration -1 at construction, so after two steps lr = 0.01 * 1/4
    assert engine.get_lr() == pytest.approx([0.0025, 0.0025]) and engine.get_global_grad_norm() > 0
    assert engine.was_step_applied() and engine.current_loss_scale() == 1.0
    assert engine.comm_stats() == {}  # one rank: nothing is sent
    engine.eval()
    assert not model.training
    engine.train()
    assert model.training


def test_refusals_are_one_line(single_process):
    model = build_model()
    without_optimizer = {key: value for key, value in nano_config(1).items() if key != "optimizer"}
    with pytest.raises(nano.NanoConfigError, match="client optimizer SGD is not implemented by nano"):
        nano.initialize(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1), config=without_optimizer)
    with pytest.raises(nano.NanoConfigError, match="given both in the config"):
        nano.initialize(model=model, optimizer=torch.optim.AdamW(model.parameters()), config=nano_config(1))
    with pytest.raises(nano.NanoConfigError, match="no \"optimizer\" section"):
        nano.initialize(model=model, config={"train_micro_batch_size_per_gpu": 1})
    with pytest.raises(nano.NanoConfigError, match="ZeRO stage 4 does not exist"):
        nano.initialize(model=model, config=nano_config(4))
    nano.initialize(model=model, config=nano_config(2))
    with pytest.raises(nano.NanoConfigError, match="already belongs to another nano engine"):
        nano.initialize(model=model, config=nano_config(2))


def test_config_from_args_and_add_config_arguments(single_process, tmp_path):
    path = tmp_path / "ds_config.json"
    path.write_text(__import__("json").dumps(nano_config(1)))
    parser = nano.add_config_arguments(argparse.ArgumentParser())
    args = parser.parse_args(["--deepspeed", "--deepspeed_config", str(path)])
    assert args.deepspeed is True
    engine, *_ = nano.initialize(args=args, model=build_model())
    assert engine.zero_optimization_stage() == 1
    memory = engine.memory_breakdown()
    assert memory["total"] == sum(value for key, value in memory.items() if key != "total") > 0


def test_user_scheduler_callable_gets_the_torch_optimizer(single_process):
    engine, _, _, scheduler = nano.initialize(
        model=build_model(), config=nano_config(2),
        lr_scheduler=lambda optimizer: torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5))
    engine.backward(loss_of(engine, micro_batch(0, 0, 0, 2)))
    engine.step()
    assert isinstance(scheduler, torch.optim.lr_scheduler.StepLR) and engine.get_lr() == pytest.approx([0.005])


def test_no_sync_follows_deepspeed(single_process):
    """Stages 0/1 allow it (they reduce only at step()); step() inside, reentry and stage 2 are
    refused with DeepSpeed's AssertionError and wording."""
    for stage in (0, 1):
        engine, *_ = nano.initialize(model=build_model(), config=nano_config(stage))
        with engine.no_sync():
            engine.backward(loss_of(engine, micro_batch(0, 0, 0, 2)))
            with pytest.raises(AssertionError, match="illegal to call Engine.step"):
                engine.step()
            with pytest.raises(AssertionError, match="reentry is unsupported"):
                with engine.no_sync():
                    pass
        engine.step()  # outside again: allowed
        assert engine.global_steps == 1
    engine, *_ = nano.initialize(model=build_model(), config=nano_config(2))
    with pytest.raises(AssertionError, match="incompatible with gradient partitioning logic of ZeRO stage 2"):
        with engine.no_sync():
            pass


def test_destroy_lets_go_of_the_model(single_process):
    """After destroy() no nano hook fires (autograd keeps param.grad as usual) and the same model
    can join a new engine."""
    model = build_model()
    engine, *_ = nano.initialize(model=model, config=nano_config(2))
    engine.destroy()
    loss_of(model, micro_batch(0, 0, 0, 2)).backward()
    assert all(parameter.grad is not None for parameter in model.parameters())
    model.zero_grad(set_to_none=True)
    again, *_ = nano.initialize(model=model, config=nano_config(2))
    again.backward(loss_of(again, micro_batch(0, 0, 0, 2)))
    again.step()
    assert again.global_steps == 1 and all(parameter.grad is None for parameter in model.parameters())


def test_optimizer_reports_dynamic_loss_scaling(single_process):
    dynamic, *_ = nano.initialize(model=build_model(), config=nano_config(1, precision="fp16"))
    static, *_ = nano.initialize(model=build_model(), config=nano_config(1, precision="fp16", fp16={"loss_scale": 8.0}))
    plain, *_ = nano.initialize(model=build_model(), config=nano_config(1))
    assert (dynamic.optimizer.dynamic_loss_scale, static.optimizer.dynamic_loss_scale,
            plain.optimizer.dynamic_loss_scale) == (True, False, False)


def test_memory_breakdown_by_device_adds_up_to_the_totals(single_process):
    engine, *_ = nano.initialize(model=build_model(), config=nano_config(1, precision="bf16"))
    engine.backward(loss_of(engine, micro_batch(0, 0, 0, 2).bfloat16()))
    engine.step()
    totals, per_device = engine.memory_breakdown(), engine.memory_breakdown(by_device=True)
    assert set(per_device) == {"device"}  # no offload: nothing on the host
    assert per_device["device"] == totals and totals["fp32_master_partition"] > 0 and totals["optimizer_states"] > 0


def test_initialize_stays_the_function_after_its_module_is_imported():
    """Importing the facade's module (here, or first thing in a process that preloads nano's modules)
    binds it in `zero_lab.nano.facade`, so `nano.initialize` stays the function; `nano.zero` is the
    API's one module."""
    import importlib

    module = importlib.import_module("zero_lab.nano.facade.initialize")
    assert nano.initialize is module.initialize and callable(nano.initialize)
    assert nano.init_distributed is importlib.import_module("zero_lab.nano.facade.distributed").init_distributed
    assert nano.zero is importlib.import_module("zero_lab.nano.zero")
