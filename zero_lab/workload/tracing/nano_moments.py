"""nano's moments inside a step, watched from outside the engine for a timeline (`--trace`).

The engine is not changed for a timeline, as it is not for the meters: while a timeline watches,
    labels  nano's labelled regions (`nano.collectives.labelled`: the optimizer step's phases
            "reduce_gradients", "unscale_clip", "all_gather", each gradient bucket, each stage-3
            gather) are seen as `labelled` sets and resets `COLLECTIVE_LABEL`, which it looks up
            in its module at every call: the module's variable is swapped for one that tells;
    units   stage 3's `UnitGathering` is wrapped where a unit becomes whole or is freed: `acquire`
            and `_prefetch` (gathered), `release` and `release_all` (freed);
    steps   every torch optimizer's step (nano's Adam, official's and FSDP2's torch AdamW) through
            torch's global optimizer hooks.
The observer is called `observer(kind, name, begins)` with kind "label", "unit" or "optimizer".
`watch` installs all of it and returns the function that takes it out again.
"""

from __future__ import annotations

from typing import Callable

from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

from zero_lab.nano import collectives
from zero_lab.nano.unit_gathering import UnitGathering

Observer = Callable[[str, str, bool], None]


class ToldLabel:
    """`COLLECTIVE_LABEL` as `labelled` uses it (set, reset, get), telling the observer each region."""

    def __init__(self, variable, observer: Observer):
        self.variable, self.observer = variable, observer

    def set(self, label: str):
        token = self.variable.set(label)
        self.observer("label", label, True)
        return token

    def reset(self, token) -> None:
        label = self.variable.get()
        self.variable.reset(token)
        self.observer("label", label, False)

    def get(self, *default):
        return self.variable.get(*default)


def _wrap_units(observer: Observer) -> dict[str, Callable]:
    """UnitGathering's four methods, wrapped to tell when a unit becomes whole or is freed; the originals."""
    originals = {name: getattr(UnitGathering, name) for name in ("acquire", "_prefetch", "release", "release_all")}

    def acquire(self, entries):
        for entry in entries:
            if not entry.gathered:
                observer("unit", entry.unit.name, True)
        return originals["acquire"](self, entries)

    def prefetch(self, position):
        sharded = [entry for entry in self.entries if not entry.gathered]
        originals["_prefetch"](self, position)
        for entry in sharded:
            if entry.gathered:
                observer("unit", entry.unit.name, True)

    def release(self, entry, keep: bool = False):
        whole = entry.gathered
        originals["release"](self, entry, keep)
        if whole and not entry.gathered:
            observer("unit", entry.unit.name, False)

    def release_all(self):
        whole = [entry for entry in self.entries if entry.gathered]
        originals["release_all"](self)
        for entry in whole:
            observer("unit", entry.unit.name, False)

    for name, wrapper in (("acquire", acquire), ("_prefetch", prefetch), ("release", release),
                          ("release_all", release_all)):
        setattr(UnitGathering, name, wrapper)
    return originals


def watch(observer: Observer) -> Callable[[], None]:
    """Install every watch; returns `unwatch`, which restores what was there."""
    variable = collectives.COLLECTIVE_LABEL
    collectives.COLLECTIVE_LABEL = ToldLabel(variable, observer)
    originals = _wrap_units(observer)
    hooks = [register_optimizer_step_pre_hook(
                 lambda optimizer, args, kwargs: observer("optimizer", f"{type(optimizer).__name__}.step", True)),
             register_optimizer_step_post_hook(
                 lambda optimizer, args, kwargs: observer("optimizer", f"{type(optimizer).__name__}.step", False))]

    def unwatch() -> None:
        collectives.COLLECTIVE_LABEL = variable
        for name, original in originals.items():
            setattr(UnitGathering, name, original)
        for hook in hooks:
            hook.remove()

    return unwatch
