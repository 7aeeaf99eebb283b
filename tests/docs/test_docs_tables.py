"""The docs' tables and figures against what they describe: nano's modules and layers, the memory
formula, the line count, the root unit's bytes, the demo command."""

from __future__ import annotations

import re
from fractions import Fraction

import pytest

import zero_lab.nano
from zero_lab.nano.memory.memory_formula import model_state_bytes, peak_model_state_bytes
from tests.docs.doc_text import REPO, read, table_after
from tests.nano.test_layers import layer_of, module_name

NANO = REPO / "zero_lab" / "nano"
NANO_MD = read(REPO / "docs" / "nano.md")


def nano_modules() -> set[str]:
    """Every module of the package by its name in the layer list (`config.keys`; a package's
    __init__ by the package's name; the top __init__ as '')."""
    return {module_name(path) for path in NANO.rglob("*.py")}


def listed_name(cell: str) -> str:
    """`config/keys.py` -> 'config.keys', `config/__init__.py` -> 'config', `__init__.py` -> ''."""
    return module_name(NANO / cell)


def layer(name: str) -> int:
    """A module's position in the package docstring's layer list (the top __init__ first)."""
    return -1 if name == "" else layer_of()[name]


def test_the_module_table_lists_every_module_in_layer_order():
    named = [listed_name(name) for row in table_after(NANO_MD, "Read the package top-down")[1:]
             for name in re.findall(r"`([\w/]+\.py)`", row[0])]
    assert set(named) == nano_modules(), (f"listed, not in the package: {set(named) - nano_modules()}; "
                                          f"not listed: {nano_modules() - set(named)}")
    positions = [layer(name) for name in named]
    assert positions == sorted(positions), list(zip(named, positions))


@pytest.mark.parametrize("readme", ["README.md", "README.zh-CN.md"])
def test_the_readme_layout_names_the_engine_layers_in_their_order(readme):
    row = next(line for line in read(REPO / readme).splitlines() if line.startswith("| `zero_lab/nano/`"))
    names = [name for name in re.findall(r"`(\w+)`", row)]
    assert len(names) >= 10 and all(name in layer_of() for name in names), names
    positions = [layer(name) for name in names]
    assert positions == sorted(positions), list(zip(names, positions))


def value(expression: str, world_size: int) -> Fraction:
    """'4 + 12/N' at N = world_size, exactly."""
    assert re.fullmatch(r"[\d\s+/N]+", expression), expression
    return sum((Fraction(term.strip().replace("N", str(world_size))) for term in expression.split("+")), Fraction(0))


def bytes_per_parameter(stage: int, precision: str, world_size: int, moment: str, sharded: bool = False,
                        grad_accum_dtype: str | None = None) -> Fraction:
    numel = 2 * world_size * 1000  # no padding: the table's figures are per parameter
    figures = model_state_bytes(stage, precision, numel, world_size, moment, sharded=sharded,
                                grad_accum_dtype=grad_accum_dtype)
    return Fraction(sum(figures.values()), numel)


def precisions_of(cell: str) -> list[tuple[str, str | None]]:
    """'bf16/fp16' -> both; 'bf16, `grad_accum_dtype: fp32`' -> bf16 with that data type."""
    if "grad_accum_dtype" in cell:
        return [(cell.split(",")[0], re.search(r"grad_accum_dtype: (\w+)", cell).group(1))]
    return [(precision, None) for precision in cell.split("/")]


@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
def test_the_bytes_per_parameter_table_is_the_memory_formula(world_size):
    rows = table_after(NANO_MD, "## Bytes per parameter on each rank")
    assert rows[0] == ["precision", "stage", "end of backward", "optimizer step", "between steps", "peak at N=2"]
    assert len(rows) == 8
    for precisions, stage, *cells in rows[1:]:
        for precision, grad_accum_dtype in precisions_of(precisions):
            for cell, moment in zip(cells, ("backward", "step", "between_steps")):
                expected = bytes_per_parameter(int(stage), precision, world_size, moment,
                                               grad_accum_dtype=grad_accum_dtype)
                assert {value(side, world_size) for side in cell.split("=")} == {expected}, (precision, stage, moment)
            numel = 4000
            peak = Fraction(peak_model_state_bytes(int(stage), precision, numel, 2, grad_accum_dtype=grad_accum_dtype),
                            numel)
            assert value(cells[3], 2) == peak, (precision, stage, "peak")


@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_the_stage_3_table_is_the_memory_formula(world_size):
    rows = table_after(NANO_MD, "Bytes per parameter on one rank (P elements, all sharded")
    assert rows[0][:3] == ["precision", "between steps", "end of backward, step"]
    for precisions, between, backward_and_step, _ in rows[1:]:
        for precision in ("bf16", "fp16") if precisions == "bf16/fp16" else (precisions,):
            for cell, moments in ((between, ("between_steps",)), (backward_and_step, ("backward", "step"))):
                for moment in moments:
                    expected = bytes_per_parameter(3, precision, world_size, moment, sharded=True)
                    assert {value(side, world_size) for side in cell.split("=")} == {expected}, (precision, moment)


def test_the_line_count_is_about_right():
    stated = int(re.search(r"in about ([\d,]+) readable lines", NANO_MD)[1].replace(",", ""))
    lines = sum(len(path.read_text().splitlines()) for path in NANO.rglob("*.py"))
    assert abs(stated - lines) <= 0.05 * lines, f"docs say about {stated}, nano has {lines} lines"


def test_the_root_units_bytes_are_in_mib():
    from zero_lab.analysis.memory.activation_memory import decoder_shape
    from zero_lab.analysis.memory.peak_memory import unit_parameters

    _, root = unit_parameters(decoder_shape("qwen3-0.6b"))
    stated = re.search(r"for Qwen3-0\.6B,\s+([\d.]+)M elements: ([\d.]+) MB in bf16", NANO_MD)
    assert float(stated[1]) == round(root / 1e6, 1)
    assert float(stated[2]) == round(root * 2 / 2**20, 1), "MB is 2**20 bytes everywhere in the docs"


def test_the_demo_command_is_the_same_everywhere():
    demo = re.search(r"^demo: setup\n\t\$\(BIN\)/(zero-lab compare [^\n]+)", read(REPO / "Makefile"), flags=re.M)[1]
    assert demo in read(REPO / ".github" / "workflows" / "cpu-compare.yml"), "the workflow's comment"
    for readme in ("README.md", "README.zh-CN.md"):
        assert f"`make demo` 运行 `{demo}`" in read(REPO / readme) or f"`make demo` runs `{demo}`" in read(REPO / readme)
    assert demo in read(REPO / "docs" / "cli.md")


@pytest.mark.parametrize("doc", ["cli.md", "compare-json.md"])
def test_what_the_docs_say_of_officials_stage_3_prediction_is_what_it_is(doc):
    """The docs say official's stage-3 peak is `null` (not modelled) exactly while it is not predicted."""
    from zero_lab.analysis.memory.activation_memory import decoder_shape
    from zero_lab.analysis.memory.peak_memory import predict_peak

    text = " ".join(read(REPO / "docs" / doc).split())
    says_null = "null` for official at stage 3" in text or "its `predicted_peak_mb` is `null`" in text
    shape = decoder_shape("tiny")
    predicted = {impl: predict_peak(shape, stage, "fp32", 2, 128, 4, impl=impl) is not None
                 for impl in ("nano", "official") for stage in (3,)}
    assert predicted["nano"]
    assert says_null == (not predicted["official"]), f"{doc} says null: {says_null}; official predicted: {predicted['official']}"
    for stage in (1, 2):
        assert predict_peak(shape, stage, "fp32", 2, 128, 4, impl="official") is not None, "official rows at stages 1-2"
