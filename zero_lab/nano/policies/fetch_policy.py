"""Stage 3's fetch and release rules, as official DeepSpeed (0.19) runs them, as pure arithmetic over
one micro-step's recorded trace. No torch: `unit_gathering.py` applies the rules to a live model,
`zero-lab explain` (`simulate_micro_step`) to a model it never builds, and both give the same answer.

The trace (`fetch_trace`): one micro-step's uses of the traced modules, the forward's then the
backward's. Official records its trace during the first micro-step and applies the rules from the
second on; until then (and whenever a use leaves the recorded order) nothing is prefetched and
every unit is freed after each use, which is also what `unit_gathering` does without these rules.
`initialize` hands the rules to stage 3 (`FetchRules.schedule`); no stage imports them.

The rules, with official's names for the keys (`runtime/zero/partitioned_param_coordinator.py`):
    1. Fetch: a use gathers its unit if it is not whole, and in the same call the units of the
       parameters it uses without owning them (its external parameters: `TracedUse.units`).
    2. Prefetch (`stage3_prefetch_bucket_size` > 0; `overlap_comm` plays no part): the trace's uses
       are a queue, consumed up to the current use. Then, while the units started here add up to
       less than min(bucket size, `stage3_max_live_parameters` minus the elements already
       gathered), the next use is taken off the queue; its unit is gathered if it is not whole
       yet, and noted as fetched for that later use either way (each of its units). A bucket
       smaller than one unit still starts one.
    3. Release: after a use, each of its units is freed unless (official counts from its step
       counter: the uses begun so far, which in the backward may already be past the use that is
       released)
       a. the prefetch already noted it as fetched for a later use (official keeps what its
          prefetch reached: at a reuse distance of 0 this is all that is kept), or
       b. it comes back before the uses after this one add up to `stage3_max_reuse_distance`
          elements. The walk counts every traced use, the model's own modules (embedding, head)
          included, each with all the parameters it touches, persistent ones too: a large head
          counts twice between a block's forward and its backward.
    4. Persistence (`unit_policy.plan_units`): the small parameters are never released.
    5. Calls: what one fetch (rule 1) or one prefetch (rule 2) starts moves in one all-gather
       (per dtype: `coalesced_gather`), as official's `all_gather_coalesced` sends it
       (`MicroStep.forward_calls`, `backward_calls`).
A unit is what official fetches at once (`unit_policy`): a module's own parameters, a leaf
module's subtree. Official queues and counts parameters, nano units: a prefetch window that ends
inside a module with several sharded parameters takes all of them here (Qwen3's modules have one).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Callable, Mapping, Sequence

from zero_lab.nano.fetch_trace import TracedUse


def full_order(forward: Sequence[TracedUse], backward: Sequence[TracedUse] | None = None) -> list[TracedUse]:
    """A micro-step's uses: the forward, then the backward as recorded (when not given, the model
    first, then the rest reversed)."""
    if backward is None:
        backward = list(forward[:1]) + list(forward[:0:-1])
    return list(forward) + list(backward)


@dataclass(frozen=True)
class FetchRules:
    """The three `stage3_*` keys of `zero_optimization` the rules read (persistence is `unit_policy`'s)."""

    prefetch_bucket_size: int
    max_live_parameters: int
    max_reuse_distance: int

    def schedule(self, forward: Sequence[TracedUse], unit_numel: Mapping[str, int],
                 backward: Sequence[TracedUse] | None = None) -> "FetchSchedule":
        """The rules over one micro-step that follows a recorded trace (what `unit_gathering` asks)."""
        return FetchSchedule(forward, unit_numel, self, backward)


class FetchSchedule:
    """The rules (module docstring) over one micro-step of a recorded trace; positions index
    `order` (`full_order`): the forward's uses, then the backward's."""

    def __init__(self, forward: Sequence[TracedUse], unit_numel: Mapping[str, int], rules: FetchRules,
                 backward: Sequence[TracedUse] | None = None):
        self.order = full_order(forward, backward)
        self.unit_numel = unit_numel
        self.rules = rules
        self.queue = deque(range(len(self.order)))
        self.fetched_for: dict[str, int] = {}

    def follows_trace(self, position: int, use: TracedUse) -> bool:
        """Whether the use at `position` is the recorded one (if not, the trace is stale)."""
        return position < len(self.order) and self.order[position] == use

    def _note(self, position: int) -> None:
        for unit in self.order[position].units:
            self.fetched_for[unit] = max(self.fetched_for.get(unit, -1), position)

    def prefetch(self, position: int, is_gathered: Callable[[str], bool], live_numel: int) -> list[str]:
        """Rule 2 at the use at `position` (its unit already whole): the units to start gathering."""
        while self.queue and self.queue[0] <= position:
            self._note(self.queue.popleft())
        if self.rules.prefetch_bucket_size <= 0:
            return []
        budget = min(self.rules.max_live_parameters - live_numel, self.rules.prefetch_bucket_size)
        started, numel = [], 0
        while self.queue and numel < budget:
            later = self.queue.popleft()
            self._note(later)
            for unit in self.order[later].units:
                if unit not in started and not is_gathered(unit):
                    started.append(unit)
                    numel += self.unit_numel[unit]
        return started

    def keep(self, unit: str, step: int) -> bool:
        """Rule 3 for `unit` once `step` uses have begun (official releases at its step counter,
        which a module's release finds past its own use and any use begun since): True keeps it."""
        if self.fetched_for.get(unit, -1) > step:  # 3a
            return True
        walked = 0
        for later in self.order[step:]:  # 3b
            if walked >= self.rules.max_reuse_distance:
                return False
            if later.unit == unit or unit in later.external:
                return True
            walked += later.numel
        return False


@dataclass
class MicroStep:
    """What `simulate_micro_step` found: each phase's gathers, in order, grouped into the calls
    that move them (rule 5), and what is whole after the forward."""

    forward_calls: list[list[str]]
    backward_calls: list[list[str]]
    whole_after_forward: set[str]
    largest_prefetch: int = 0  # elements of the largest set of units one prefetch started in the forward
    # after each use: (its phase, its module, the elements whole once it is released), forward then backward
    gathered_after: list[tuple[str, object, int]] = field(default_factory=list)

    @property
    def forward_gathers(self) -> list[str]:
        return [unit for call in self.forward_calls for unit in call]

    @property
    def backward_gathers(self) -> list[str]:
        return [unit for call in self.backward_calls for unit in call]


def simulate_micro_step(forward: Sequence[TracedUse], unit_numel: Mapping[str, int], rules: FetchRules | None,
                        held: str | None = None, backward: Sequence[TracedUse] | None = None) -> MicroStep:
    """One micro-step of `unit_gathering.UnitGathering` whose backward uses the modules as in
    `backward` (default: the reverse order, `full_order`), each released right after its use:
    `rules` None is the recording micro-step (no trace yet). `held` is the unit held from the
    model's forward to the end of its backward (nano's root)."""
    schedule = FetchSchedule(forward, unit_numel, rules, backward) if rules is not None else None
    whole: set[str] = set()
    calls: list[list[str]] = []

    def gather(units: list[str | None]) -> None:
        """One fetch or prefetch: the units not whole yet, in one call (rule 5)."""
        call = [unit for unit in dict.fromkeys(units) if unit is not None and unit not in whole]
        whole.update(call)
        if call:
            calls.append(call)

    largest_prefetch = 0

    def use(position: int, units: tuple[str, ...]) -> None:
        nonlocal largest_prefetch
        gather(list(units))
        if schedule is not None:
            live = sum(unit_numel[name] for name in whole)
            started = schedule.prefetch(position, whole.__contains__, live)
            gather(started)
            if position < len(forward):
                largest_prefetch = max(largest_prefetch, sum(unit_numel[name] for name in started))

    def release(position: int, units: tuple[str, ...]) -> None:
        for unit in units:
            if unit != held and not (schedule is not None and schedule.keep(unit, position + 1)):
                whole.discard(unit)

    gathered_after: list[tuple[str, object, int]] = []

    def use_and_release(position: int, traced: TracedUse) -> None:
        use(position, traced.units)
        release(position, traced.units)
        phase = "forward" if position < len(forward) else "backward"
        gathered_after.append((phase, traced.module, sum(unit_numel[name] for name in whole)))

    gather([held])
    for position, traced in enumerate(forward):
        use_and_release(position, traced)
    forward_calls, calls = calls, []
    whole_after_forward = set(whole)
    order = full_order(forward, backward)
    for position in range(len(forward), len(order)):
        use_and_release(position, order[position])
    return MicroStep(forward_calls, calls, whole_after_forward, largest_prefetch, gathered_after)
