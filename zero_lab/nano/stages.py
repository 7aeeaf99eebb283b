"""The one table of ZeRO stages: which exist, what each partitions, and every fact that follows.

A fact about a stage lives on its row here, and the rest of nano asks the row, not the number:
the config's rules, the flat layout, the memory formula, the units, the engine and the checkpoint
files all read a `Stage` (`stages.of(number)`). A new stage is one row here (and its optimizer
module), and a refusal reads the same everywhere.

What a stage partitions decides the rest:
    optimizer states -> a flat buffer is cut into world_size partitions (stage 0 keeps it whole,
                        as one), padded as official DeepSpeed pads them;
    gradients        -> gradients are reduced during backward, bucket by bucket, into the fp32
                        gradient partition, which is where they accumulate over a window (below,
                        autograd accumulates them in param.grad, in the parameters' dtype);
    parameters       -> parameters are gathered for each use, unit by unit, and the checkpoint
                        takes official's stage-3 files (one model-states file per rank, the fp32
                        masters cut per parameter).

A row may be a variant of its stage: it partitions the same but collects gradients its own way.
The one variant, FP32_ACCUMULATION, is stage 1 with bf16 and `data_types.grad_accum_dtype: fp32`
(without offload), where official DeepSpeed runs its BF16_Optimizer: gradients accumulate in a
full-size fp32 buffer and are all-reduced from it at the boundary (`stage1_fp32_accumulation.py`).
`for_run` picks the row a configuration runs.
"""

from __future__ import annotations

from dataclasses import dataclass

START_ALIGNMENT_FACTOR = 2  # official DeepSpeed's nccl_start_alignment_factor: 4 bytes / 2-byte elements
OPTIMIZER_STATES, GRADIENTS, PARAMETERS = "optimizer states", "gradients", "parameters"
FP32_ACCUMULATION = "fp32 accumulation"  # the variant's name, as messages and `explain` print it
FLAT, PER_PARAMETER = "flat", "per_parameter"  # the two cuts of a checkpoint's partitions (checkpoint/reshard.py)


@dataclass(frozen=True)
class CheckpointLayout:
    """How official DeepSpeed writes a stage's checkpoint files; nano writes and reads the same."""

    cut: str  # FLAT: each group end to end, cut in partitions; PER_PARAMETER: each parameter cut in N
    model_states_per_rank: bool  # every rank writes a model-states file (else rank 0 writes the one)
    fp32_key: str  # the optimizer file's key for the fp32 master partitions
    moments_key: str  # ... and for torch.optim's state dict of Adam's moments
    partition_count_per_group: bool  # partition_count is a list, one per group (else one number)


FLAT_FILES = CheckpointLayout(FLAT, False, "single_partition_of_fp32_groups", "base_optimizer_state", True)
PER_PARAMETER_FILES = CheckpointLayout(PER_PARAMETER, True, "fp32_flat_groups", "optimizer_state_dict", False)


@dataclass(frozen=True)
class Stage:
    number: int
    partitions: tuple[str, ...]  # what each rank holds only 1/N of
    checkpoint: CheckpointLayout
    implemented: bool = True
    # A reduce-scattered bucket is divided by the world size before the sum (official's stage-1/2
    # `average_tensor`, its stage-3 `reduce_scatter_coalesced`), not the sum after it (its stage 0
    # and every all-reduce path).
    predivides: bool = False
    # bf16's `check_grad_overflow: false` lets a step with non-finite gradients through: official's
    # stage-1/2 optimizer honours it; its stage-0 bf16 and its stage-3 optimizers check every step.
    applies_unchecked_bf16_steps: bool = False
    variant: str = ""  # "" for the stage itself, else the variant's name (the module docstring)

    @property
    def name(self) -> str:
        """'stage 1', or 'stage 1 (fp32 accumulation)' for a variant."""
        return f"stage {self.number}" + (f" ({self.variant})" if self.variant else "")

    @property
    def holds_fp32_gradients(self) -> bool:
        """Gradients accumulate over the window in one full-size fp32 buffer per flat buffer, whose
        slice this rank owns is its gradient partition (a view, no storage of its own)."""
        return self.variant == FP32_ACCUMULATION

    @property
    def partitions_optimizer_states(self) -> bool:
        return OPTIMIZER_STATES in self.partitions

    @property
    def reduces_during_backward(self) -> bool:
        """Gradients partitioned: each bucket is reduced as backward produces it (so `no_sync`,
        which postpones reduction, is refused), and no full-size param.grad outlives backward."""
        return GRADIENTS in self.partitions

    @property
    def partitions_parameters(self) -> bool:
        return PARAMETERS in self.partitions

    def partition_count(self, world_size: int) -> int:
        """Partitions of a flat buffer: one (the whole buffer) unless optimizer states are partitioned."""
        return world_size if self.partitions_optimizer_states else 1

    def flat_alignment(self, precision: str, world_size: int) -> int:
        """The multiple a group's flat buffer is padded to, as official DeepSpeed pads it: to 2 x
        world_size where it partitions (each 16-bit partition starts 4-byte aligned), not at all at
        stage 0 (official's stage 0 keeps no flat buffer in any precision: its bf16 runs
        FP16_UnfusedOptimizer, one fp32 copy per parameter). The precision changes nothing."""
        return START_ALIGNMENT_FACTOR * world_size if self.partitions_optimizer_states else 1

    def gradient_accumulation_precision(self, precision: str) -> str:
        """Where gradients accumulate over a window: the fp32 gradient partition when they are
        reduced during backward, the full-size fp32 gradients in the fp32-accumulation variant,
        else autograd's param.grad in the parameters' precision."""
        return "fp32" if self.reduces_during_backward or self.holds_fp32_gradients else precision

    def reduces_whole_buffer_together(self, sharded: bool) -> bool:
        """Whether a buffer's gradients join the buckets spanning whole buffers (`spanning_layout`)
        rather than have range buckets of their own: at the stage that partitions parameters, the
        always-whole buffers (one persistent parameter each) do, in one call per backward as
        official's coalesced reduce-scatter takes them with the rest of its bucket; below it each
        group is one buffer, and none does."""
        return self.partitions_parameters and not sharded

    @property
    def gathers_in_allgather_buckets(self) -> bool:
        """After the step every rank all-gathers the updated partitions in `allgather_bucket_size`
        buckets, as official's stage-1/2 optimizer does (stage 3 gathers each unit when it is used)."""
        return self.partitions_optimizer_states and not self.partitions_parameters


STAGES = (
    Stage(0, (), FLAT_FILES),  # plain data parallelism: every rank holds everything
    Stage(1, (OPTIMIZER_STATES,), FLAT_FILES, predivides=True, applies_unchecked_bf16_steps=True),
    Stage(2, (OPTIMIZER_STATES, GRADIENTS), FLAT_FILES, predivides=True, applies_unchecked_bf16_steps=True),
    Stage(3, (OPTIMIZER_STATES, GRADIENTS, PARAMETERS), PER_PARAMETER_FILES, predivides=True),  # gathered for each use
    # Official's BF16_Optimizer: all-reduces whole buckets (no predivide) and skips every step
    # whose gradient norm is not finite, whatever bf16.check_grad_overflow says.
    Stage(1, (OPTIMIZER_STATES,), FLAT_FILES, variant=FP32_ACCUMULATION),
)
BY_NUMBER = {row.number: row for row in STAGES if not row.variant}
VARIANTS = {(row.number, row.variant): row for row in STAGES}
IMPLEMENTED = tuple(row.number for row in STAGES if row.implemented and not row.variant)


def implemented_list() -> str:
    """'0, 1, 2 or 3': the stages nano runs, for messages."""
    *first, last = [str(number) for number in IMPLEMENTED]
    return f"{', '.join(first)} or {last}" if first else last


def refusal(stage: object) -> str | None:
    """The one message for a stage nano cannot run (None when it can)."""
    if stage in IMPLEMENTED:  # the two lookups of the table itself: every other module asks `of`
        return None
    if stage in BY_NUMBER:
        return (f"nano does not implement ZeRO stage {stage} yet; use stage {implemented_list()}, "
                "or run official DeepSpeed (--impl official)")
    return f"ZeRO stage {stage!r} does not exist; use stage {implemented_list()}"


def of(stage: object, variant: str = "") -> Stage:
    """The row of a stage nano runs (or of its variant); ValueError with the refusal otherwise."""
    refused = refusal(stage)
    if refused:
        raise ValueError(refused)
    if (stage, variant) not in VARIANTS:
        raise ValueError(f"stage {stage} has no variant {variant!r}")
    return VARIANTS[(stage, variant)]


def for_run(stage: object, precision: str, grad_accum_dtype: str | None = None,
            offload_optimizer: bool = False) -> Stage:
    """The row a configuration runs: stage 1 with bf16 parameters and `grad_accum_dtype` fp32
    takes the fp32-accumulation variant, as official DeepSpeed then takes its BF16_Optimizer
    (with offload_optimizer official keeps its stage-1 optimizer, so nano keeps stage 1)."""
    row = of(stage)
    if (row.number == 1 and precision == "bf16" and grad_accum_dtype == "fp32"
            and not offload_optimizer):
        return of(stage, FP32_ACCUMULATION)
    return row
