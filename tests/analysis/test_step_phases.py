"""The samples behind the memory-through-a-step figure: the last complete step, in phase order, and
nano's categories folded into the figure's six, which add up to the live bytes."""

from zero_lab.analysis.runs.speed.step_phases import ACTIVATIONS, STACKED, has_categories, last_step_phases, stacked_categories
from zero_lab.workload.meters.phase_memory import PHASES, PhaseSample, visible_categories

NANO_CATEGORIES = [name for names in STACKED.values() for name in names]


def sample(step: int, phase: str, live: int, **categories: int) -> dict:
    figures = {name: categories.get(name, 0) for name in NANO_CATEGORIES}
    return PhaseSample(phase, live, live + 5, figures).fields(step)


def test_the_last_step_with_every_boundary_in_phase_order():
    rows = [sample(1, phase, 100) for phase in PHASES]
    rows += [sample(2, "after_step", 300), sample(2, "after_forward", 200), sample(2, "after_backward", 250)]
    rows.append(sample(3, "after_forward", 400))  # cut off: the run stopped inside step 3
    chosen = last_step_phases(rows)
    assert [(row["step"], row["phase"]) for row in chosen] == [(2, phase) for phase in PHASES]
    assert last_step_phases(rows[-1:]) == []


def test_categories_fold_and_add_up_to_the_live_bytes():
    phases = [sample(1, "after_forward", 1000, parameters=100, gathered_parameters=50, optimizer_states=200),
              sample(1, "after_backward", 900, parameters=100, gradients=300, gradient_partition=40,
                     communication_buckets=60, fp32_master_partition=70, optimizer_states=200),
              sample(1, "after_step", 400, parameters=100, fp32_master_partition=70, optimizer_states=200)]
    stacked = stacked_categories(phases)
    assert list(stacked) == [*STACKED, ACTIVATIONS]
    assert stacked["parameters"] == [150, 100, 100] and stacked["gradients"] == [0, 340, 0]
    assert stacked["buckets"] == [0, 60, 0] and stacked["master"] == [0, 70, 70]
    assert stacked[ACTIVATIONS] == [650, 130, 30]
    assert [sum(values) for values in zip(*stacked.values())] == [1000, 900, 400]


def test_official_samples_carry_no_categories():
    official = [PhaseSample(phase, 10, 12).fields(1) for phase in PHASES]
    assert not has_categories(official) and has_categories([sample(1, phase, 10) for phase in PHASES])


def test_visible_categories_are_the_metered_device_s():
    by_place = {"device": {"parameters": 10, "optimizer_states": 0, "total": 10},
                "host": {"parameters": 0, "optimizer_states": 80, "total": 80}}
    assert visible_categories(by_place, "cuda") == {"parameters": 10, "optimizer_states": 0}
    assert visible_categories(by_place, "cpu") == {"parameters": 10, "optimizer_states": 80}  # host tensors are CPU tensors
