"""Lessons 1-7, whose commands compute without launching (`zero-lab explain`, `zero-lab estimate`):
each lesson's commands run once, as written, from a copy of the repository root (a module fixture
per lesson); then its excerpts, its picture and every number its text states are checked against
what they print, and each claim the lesson makes is asserted on the same numbers (as data: the same
command with --format json) against the formula it states."""

from __future__ import annotations

import json
import shlex

import pytest

from tests.docs.test_stated_figures import demo_cell
from tests.learn.course import (as_json, command_problems, excerpts_problems, lesson, mb, moment, number_problems,
                                picture_problems, read, run_lesson, shown_commands, wire)

LESSONS = (1, 2, 3, 4, 5, 6, 7)


@pytest.fixture(scope="module", params=LESSONS, ids=lambda number: f"lesson {number}")
def ran(request, tmp_path_factory):
    number = request.param
    return number, run_lesson(number, tmp_path_factory.mktemp(f"lesson-{number}"))


def commands(number: int, section: str) -> list[str]:
    return [shown.command for shown in shown_commands(read(lesson(number))) if shown.section == section]


def explained(ran, command: str) -> dict:
    return as_json(command, ran.workdir)


def sibling(command: str, **changes: str) -> str:
    """The same command with some options changed (a comparison the lesson states, run by its test)."""
    argv = shlex.split(command)
    for option, value in changes.items():
        flag = "--" + option.replace("_", "-")
        argv[argv.index(flag) + 1] = value
    if "--plot" in argv:
        index = argv.index("--plot")
        del argv[index:index + 2]
    return shlex.join(argv)


def bucket_payloads(walk: dict, phase: str) -> list[int]:
    return [item["payload_bytes"] for item in walk["collectives"] if item["phase"] == phase
            and item["op"] in ("all_reduce", "reduce_scatter") and "bucket" in item["what"]]


def category(walk: dict, name: str, moment_name: str) -> int:
    return moment(walk, moment_name)["bytes"][name]


def lesson_1(ran) -> tuple[dict, tuple]:
    run, tried = commands(1, "Run it")[0], commands(1, "Try it")[0]
    two, four = explained(ran, run), explained(ran, tried)
    parameters = two["parameters"]
    # 16 bytes per parameter at the end of the backward, 18 in the step; the all-reduce 2 (N-1)/N x 2P
    assert moment(two, "end_of_backward")["total_bytes"] == 16 * parameters
    assert moment(two, "optimizer_step")["total_bytes"] == 18 * parameters
    assert wire(two) == 2 * (2 - 1) * 2 * parameters // 2 and wire(four) == 2 * (4 - 1) * 2 * parameters // 4
    assert [moment(four, name)["total_bytes"] for name in ("end_of_backward", "optimizer_step")] == \
        [moment(two, name)["total_bytes"] for name in ("end_of_backward", "optimizer_step")]
    buckets = bucket_payloads(two, "reduce_gradients")
    assert buckets[0] == 20_000_000 * 2 and len(buckets) == 31
    return {
        "P": f"{parameters:,}", "end of backward": mb(16 * parameters), "step": mb(18 * parameters),
        "between steps": mb(moment(two, "between_steps")["total_bytes"]),
        "parameters": mb(category(two, "parameters", "between_steps")),
        "master": mb(category(two, "fp32_master_partition", "between_steps")),
        "Adam": mb(category(two, "optimizer_states", "between_steps")),
        "bucket": mb(buckets[0]), "last bucket": mb(buckets[-2]), "no-decay bucket": mb(buckets[-1]),
        "wire at 2": mb(wire(two)), "wire at 4": mb(wire(four)), "2(N-1)/N at 4": f"{2 * 3 / 4:g}",
    }, ()


def lesson_2(ran) -> tuple[dict, tuple]:
    run, tried = commands(2, "Run it")[0], commands(2, "Try it")[0]
    one, eight = explained(ran, run), explained(ran, tried)
    zero = explained(ran, sibling(run, stage="0"))
    # a reduce-scatter plus an all-gather: data parallelism's all-reduce, to the MB, at 2 and at 8 ranks
    assert mb(wire(one)) == mb(wire(zero))
    assert mb(wire(eight)) == mb(wire(explained(ran, sibling(tried, stage="0"))))
    scatter, gather = wire(one, "reduce_gradients"), wire(one, "all_gather")
    cell = demo_cell(2)["wire MB / step"]
    return {
        "master": mb(category(one, "fp32_master_partition", "between_steps")),
        "Adam": mb(category(one, "optimizer_states", "between_steps")),
        "between": mb(moment(one, "between_steps")["total_bytes"]),
        "stage 0 between": mb(moment(zero, "between_steps")["total_bytes"]),
        "stage 0 master": mb(category(zero, "fp32_master_partition", "between_steps")),
        "stage 0 Adam": mb(category(zero, "optimizer_states", "between_steps")),
        "reduce-scatter": mb(scatter), "all-gather": mb(gather), "wire": mb(wire(one)),
        "payload": mb(sum(item["payload_bytes"] for item in one["collectives"])),
        "gradients at the end of the backward": mb(category(one, "gradients", "end_of_backward")),
        "Adam at 8": mb(category(eight, "optimizer_states", "between_steps")),
        "master at 8": mb(category(eight, "fp32_master_partition", "between_steps")),
        "between at 8": mb(moment(eight, "between_steps")["total_bytes"]), "wire at 8": mb(wire(eight)),
        "demo official wire": cell[1], "demo nano wire": cell[0], "demo ratio": cell[3].split()[1],
    }, ()


def lesson_3(ran) -> tuple[dict, tuple]:
    from zero_lab.analysis.memory.activation_memory import decoder_shape
    from zero_lab.analysis.memory.peak_memory import first_bucket_bytes
    from zero_lab.nano.memory.memory_formula import model_state_bytes

    run, estimated = commands(3, "Run it")
    tried = commands(3, "Try it")[0]
    two, eight = explained(ran, run), explained(ran, tried)
    stage_1 = explained(ran, sibling(run, stage="1"))
    stage_1_at_8 = explained(ran, sibling(tried, stage="1"))
    rows = {row["stage"]: row for row in explained(ran, estimated)["rows"]}
    # no whole gradient, ever; the same wire bytes; the same end of backward as stage 1 at 2 ranks
    assert all(item["bytes"]["gradients"] == 0 for item in two["moments"])
    assert mb(wire(two)) == mb(wire(stage_1))
    assert mb(moment(two, "end_of_backward")["total_bytes"]) == mb(moment(stage_1, "end_of_backward")["total_bytes"])
    # stage 2's peak is at the turn with its first bucket; stage 1's at the step's boundary, later
    assert rows[2]["peak_moment"] == "turn" and rows[1]["peak_moment"] == "boundary"
    shape = decoder_shape("small")
    bucket = first_bucket_bytes(shape, 2, 20_000_000, "fp32")
    numel = int(estimated_parameters(ran, estimated))
    turn_states = sum(model_state_bytes(2, "fp32", numel, 2, "forward").values())
    assert rows[2]["predicted_peak_mb"] > rows[1]["predicted_peak_mb"]
    buckets = bucket_payloads(two, "backward")
    return {
        "bucket": mb(buckets[0]), "last bucket": mb(buckets[-2]), "no-decay bucket": mb(buckets[-1]),
        "gradients": mb(0), "wire": mb(wire(two)), "end of backward": mb(moment(two, "end_of_backward")["total_bytes"]),
        "demo stage 2 peak": demo_cell(2)["peak alloc MB"][0], "demo stage 1 peak": demo_cell(1)["peak alloc MB"][0],
        "small P": f"{numel:,}",
        "stage 1 states": f"{rows[1]['nano_mb']:.1f}", "stage 2 states": f"{rows[2]['nano_mb']:.1f}",
        "activations": f"{rows[2]['activations_mb']:.1f}", "bucket fp32": mb(bucket),
        "stage 2 peak": f"{rows[2]['predicted_peak_mb']:.1f}", "stage 1 peak": f"{rows[1]['predicted_peak_mb']:.1f}",
        "states at the turn": mb(turn_states, 1),
        "end of backward at 8": mb(moment(eight, "end_of_backward")["total_bytes"]),
        "stage 1 at 8": mb(moment(stage_1_at_8, "end_of_backward")["total_bytes"]),
        "parameters": mb(category(eight, "parameters", "end_of_backward")), "wire at 8": mb(wire(eight)),
    }, ()


def estimated_parameters(ran, command: str) -> int:
    return explained(ran, command)["params"]


def lesson_4(ran) -> tuple[dict, tuple]:
    run, estimated, layered = commands(4, "Run it")
    tried, capped, reused = commands(4, "Try it")
    three, prefetch_0, max_live = explained(ran, run), explained(ran, tried), explained(ran, capped)
    two = explained(ran, sibling(run, stage="2"))
    rows = {row["stage"]: row for row in explained(ran, estimated)["rows"]}
    parameters = three["parameters"]
    sharded = sum(buffer["padded_numel"] for buffer in three["buffers"] if buffer["sharded"]) * 2
    forward = sum(item["payload_bytes"] for item in three["collectives"] if item["phase"] == "forward")
    gathered = category(three, "gathered_parameters", "end_of_forward")
    # the whole model (but its persistent parameters) gathered by the end of the forward; nothing
    # gathered again in the backward; stage 3 peaks above stage 2
    assert gathered == sharded
    assert not [item for item in three["collectives"] if item["phase"] == "backward" and item["op"] == "all_gather"]
    assert rows[3]["predicted_peak_mb"] > rows[2]["predicted_peak_mb"]
    # stage 3 at the turn; stage 2 when its first bucket is reduced, its fp32 gradient partition beside the activations
    assert (rows[3]["peak_moment"], rows[2]["peak_moment"]) == ("turn", "first_reduce")
    assert category(two, "gradient_partition", "end_of_backward") == category(three, "gradient_partition",
                                                                              "end_of_backward")
    assert rows[2]["nano_mb"] - rows[2]["paper_mb"] == (4 - 2) * parameters / 2 / 2**20  # fp32, not 2 bytes, over N
    textbook = 3 * (2 - 1) * 2 * parameters // 2  # 3 (N-1)/N x 2P at N = 2
    root = next(item for item in three["collectives"] if item["what"] == "root")
    assert abs(wire(prefetch_0) - (textbook - root["wire_bytes"])) < 2**20 / 10
    # the prefetch of 0 releases the model only at the harness's reuse distance of 0; at DeepSpeed's default most stays
    assert explained(ran, tried.replace(" --config", " --gathered --config"))["rules"]["stage3_max_reuse_distance"] == 0
    kept = category(explained(ran, sibling(reused.replace(" --gathered", ""))), "gathered_parameters", "end_of_forward")
    assert category(prefetch_0, "gathered_parameters", "end_of_forward") < kept < gathered
    # layer by layer: every unit gathered from layer 0's forward on, each released by its own backward use; at
    # prefetch 0 the root alone; at the default reuse distance the layers whose backward comes back in time
    layers = explained(ran, layered)["layers"]
    unit = layers[1]["after_backward_bytes"] - layers[0]["after_backward_bytes"]
    assert all(row["after_forward_bytes"] == gathered for row in layers)
    assert [row["after_backward_bytes"] for row in layers] == [root["payload_bytes"] + unit * index
                                                              for index in range(len(layers))]
    alone = explained(ran, tried.replace(" --config", " --gathered --config"))["layers"]
    assert {value for row in alone for value in (row["after_forward_bytes"], row["after_backward_bytes"])} == \
        {root["payload_bytes"]}
    reuse_layers = explained(ran, reused)["layers"]
    first_kept = next(row["layer"] for row in reuse_layers if row["after_forward_bytes"] > root["payload_bytes"])
    assert (first_kept, reuse_layers[-1]["after_forward_bytes"]) == (6, kept)
    twice = forward - sharded  # one unit the prefetch gathers twice: its second gather sends (N-1)/N of it
    # the demo's small model: stage 3 below stage 2, whose first bucket (the harness's 2e7 fp32 elements) is its peak
    small = {row["stage"]: row for row in explained(ran, "zero-lab estimate --model small --gpus 2 --stages 2,3 "
                                                         "--dtype float32")["rows"]}
    bucket_mb = 2e7 * 4 / 2**20
    without_bucket = small[2]["predicted_peak_mb"] - bucket_mb
    assert without_bucket < small[3]["predicted_peak_mb"] < small[2]["predicted_peak_mb"]
    own_half = small[3]["params"] * 4 / 2 / 2**20  # a rank's fp32 half of the parameters, beside the gathered whole
    assert abs(small[3]["predicted_peak_mb"] - without_bucket - own_half) < 2
    assert float(demo_cell(3)["peak alloc MB"][0]) < float(demo_cell(2)["peak alloc MB"][0])
    assert wire(three) - wire(two) == twice // 2
    return {
        "between": mb(moment(three, "between_steps")["total_bytes"]),
        "stage 2 between": mb(moment(two, "between_steps")["total_bytes"]),
        "parameters": mb(category(three, "parameters", "between_steps")), "gathered": mb(gathered),
        "end of forward": mb(moment(three, "end_of_forward")["total_bytes"]), "root": mb(root["payload_bytes"]),
        "wire": mb(wire(three)), "stage 2 wire": mb(wire(two)), "gathered twice": mb(twice),
        "gathered twice on the wire": mb(wire(three) - wire(two)),
        "end of backward": mb(moment(three, "end_of_backward")["total_bytes"]),
        "gradient partition": mb(category(three, "gradient_partition", "end_of_backward")),
        "default reuse kept": mb(kept), "layer unit": mb(unit),
        "demo stage 3 peak": demo_cell(3)["peak alloc MB"][0], "demo stage 2 peak": demo_cell(2)["peak alloc MB"][0],
        "small stage 3": f"{small[3]['predicted_peak_mb']:.1f}", "small stage 2": f"{small[2]['predicted_peak_mb']:.1f}",
        "bucket": f"{bucket_mb:.2f}", "stage 2 without its bucket": f"{without_bucket:.1f}",
        "stage 3 above that": f"{small[3]['predicted_peak_mb'] - without_bucket:.1f}",
        "stage 2 peak": f"{rows[2]['predicted_peak_mb']:.1f}", "stage 3 peak": f"{rows[3]['predicted_peak_mb']:.1f}",
        "fp32 gradient partition over the paper's": f"{rows[2]['nano_mb'] - rows[2]['paper_mb']:.1f}",
        "stage 2 nano states": f"{rows[2]['nano_mb']:.1f}", "stage 2 paper": f"{rows[2]['paper_mb']:.1f}",
        "activations": f"{rows[3]['activations_mb']:.1f}", "tokens": shlex.split(estimated)[shlex.split(estimated).index("--seq-len") + 1],
        "prefetch 0 gathered": mb(category(prefetch_0, "gathered_parameters", "end_of_forward")),
        "prefetch 0 end of forward": mb(moment(prefetch_0, "end_of_forward")["total_bytes"]),
        "prefetch 0 wire": mb(wire(prefetch_0)), "against stage 2": f"{wire(prefetch_0) / wire(two):.2f}",
        "textbook": mb(textbook),
        "max live gathered": mb(category(max_live, "gathered_parameters", "end_of_forward")),
        "max live wire": mb(wire(max_live)),
    }, ("1.5", "1e9")


def lesson_5(ran) -> tuple[dict, tuple]:
    import torch

    from zero_lab.nano.config.schema import Fp16Config
    from deepspeed.runtime import constants

    run, tried = commands(5, "Run it")[0], commands(5, "Try it")[0]
    fp32, bf16 = explained(ran, run), explained(ran, tried)
    fp16 = explained(ran, sibling(tried, dtype="float16"))
    assert fp16["moments"] == bf16["moments"] and fp16["collectives"] == bf16["collectives"]
    assert mb(wire(fp32)) == mb(2 * wire(bf16)) or abs(wire(fp32) - 2 * wire(bf16)) < 16
    assert category(fp32, "fp32_master_partition", "end_of_backward") == 0
    # loss scaling as DeepSpeed defines it, and as nano's typed config defaults to it
    scale = Fp16Config()
    assert (scale.initial_scale_power, scale.loss_scale_window, scale.hysteresis) == (
        constants.FP16_INITIAL_SCALE_POWER_DEFAULT, constants.FP16_LOSS_SCALE_WINDOW_DEFAULT, constants.FP16_HYSTERESIS_DEFAULT)
    assert scale.hysteresis == 2
    step = 0.001
    assert float(torch.tensor(1.0, dtype=torch.bfloat16) + step) == 1.0  # the lost update
    return {
        "parameters": mb(category(fp32, "parameters", "between_steps")), "no master": mb(0),
        "end of backward": mb(moment(fp32, "end_of_backward")["total_bytes"]),
        "between": mb(moment(fp32, "between_steps")["total_bytes"]), "wire": mb(wire(fp32)),
        "fp32 bucket": mb(bucket_payloads(fp32, "backward")[0]), "bf16 bucket": mb(bucket_payloads(bf16, "backward")[0]),
        "bf16 between": mb(moment(bf16, "between_steps")["total_bytes"]),
        "bf16 end of backward": mb(moment(bf16, "end_of_backward")["total_bytes"]),
        "bf16 parameters": mb(category(bf16, "parameters", "between_steps")),
        "bf16 master": mb(category(bf16, "fp32_master_partition", "between_steps")), "bf16 wire": mb(wire(bf16)),
        "bf16 gap at 1": f"{torch.finfo(torch.bfloat16).eps:g}", "fp16 largest": f"{torch.finfo(torch.float16).max:g}",
        "initial scale": str(2 ** scale.initial_scale_power), "window": str(scale.loss_scale_window),
        "a step": f"{step:g}",
    }, ()


def lesson_6(ran) -> tuple[dict, tuple]:
    run, tried = commands(6, "Run it")[0], commands(6, "Try it")[0]
    optimizer, both = explained(ran, run), explained(ran, tried)
    plain = explained(ran, sibling(run, offload="none"))
    # offload moves bytes, it does not remove them
    assert [item["total_bytes"] for item in optimizer["moments"]] == [item["total_bytes"] for item in plain["moments"]]
    assert all(item["host_bytes"] == 0 for item in plain["moments"])
    master = category(optimizer, "fp32_master_partition", "between_steps")
    down = category(optimizer, "gradient_partition", "end_of_backward")
    assert moment(optimizer, "end_of_backward")["host_bytes"] - moment(optimizer, "between_steps")["host_bytes"] == down
    forward = moment(optimizer, "end_of_forward")
    return {
        "parameters": mb(category(optimizer, "parameters", "between_steps")),
        "gathered": mb(category(optimizer, "gathered_parameters", "end_of_forward")),
        "master": mb(master), "Adam": mb(category(optimizer, "optimizer_states", "between_steps")),
        "end of forward": mb(forward["total_bytes"]), "host at the end of forward": mb(forward["host_bytes"]),
        "device at the end of forward": mb(forward["device_bytes"]),
        "between": mb(moment(optimizer, "between_steps")["total_bytes"]),
        "end of backward": mb(moment(optimizer, "end_of_backward")["total_bytes"]),
        "host at the end of backward": mb(moment(optimizer, "end_of_backward")["host_bytes"]),
        "to the host": mb(down), "back to the device": mb(master // 2),
        "param: host between": mb(moment(both, "between_steps")["host_bytes"]),
        "param: device between": mb(moment(both, "between_steps")["device_bytes"]),
        "param: device at the end of forward": mb(moment(both, "end_of_forward")["device_bytes"]),
    }, ()


def node_split(output: str) -> tuple[int, int]:
    line = next(line for line in output.splitlines() if line.startswith("wire bytes per step, nodes of"))
    intra, inter = [int(word) for word in line.replace(",", " ").split() if word.isdigit()][1:3]
    return intra, inter


def lesson_7(ran) -> tuple[dict, tuple]:
    run = commands(7, "Run it")[0]
    hpz, everything = commands(7, "Try it")
    (plain_intra, plain_inter), (hpz_intra, hpz_inter), (_, all_inter) = (
        node_split(ran.outputs[command]) for command in (run, hpz, everything))
    plain, with_hpz = explained(ran, run), explained(ran, hpz)
    model_bytes = plain["parameters"] * 4
    world, per_node = 4, 2
    # across nodes: (N-K)/N of each of the three arrays, every unit gathered twice
    assert sum(item["wire_inter_bytes"] for item in plain["collectives"]) == plain_inter
    assert round(plain_inter / model_bytes, 2) == round(3 * (world - per_node) / world, 2)
    return {
        "P": f"{plain['parameters']:,}", "M": f"{model_bytes:,}", "inter": f"{plain_inter:,}",
        "intra": f"{plain_intra:,}", "inter / M": f"{plain_inter / model_bytes:.2f}",
        "(N-K)/N": f"{(world - per_node) / world:g}",
        "hpZ inter": f"{hpz_inter:,}", "hpZ inter / M": f"{hpz_inter / model_bytes:.2f}", "hpZ intra": f"{hpz_intra:,}",
        "hpZ end of forward": mb(moment(with_hpz, "end_of_forward")["total_bytes"]),
        "end of forward": mb(moment(plain, "end_of_forward")["total_bytes"]),
        "all three inter": f"{all_inter:,}", "all three / M": f"{all_inter / model_bytes:.2f}",
        "less": f"{plain_inter / all_inter:.1f}",
    }, ()


FACTS = {1: lesson_1, 2: lesson_2, 3: lesson_3, 4: lesson_4, 5: lesson_5, 6: lesson_6, 7: lesson_7}


def test_every_command_runs_as_written_in_under_a_minute_of_2_cores(ran):
    number, result = ran
    assert result.outputs, f"lesson {number} shows no zero-lab command"
    assert not command_problems(result)


def test_every_excerpt_is_what_the_command_prints(ran):
    number, result = ran
    assert not excerpts_problems(read(lesson(number)), result)


def test_the_picture_is_what_its_command_draws(ran):
    number, result = ran
    assert not picture_problems(read(lesson(number)), result)


def test_every_number_the_lesson_states_is_computed_and_every_claim_holds(ran):
    number, result = ran
    facts, constants = FACTS[number](result)
    assert not number_problems(read(lesson(number)), facts, constants)
