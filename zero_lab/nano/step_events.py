"""Moments of nano's step that something outside the engine may follow: a timeline (`--trace`).

nano tells its observers two kinds of moment, each as a region that begins and ends:
    "label": a labelled region of the step (`collectives.labelled`): the optimizer step's phases
             ("reduce_gradients", "unscale_clip", "adam", "all_gather"), a gradient bucket
             reduced, a stage-3 unit or prefetch gathered;
    "unit":  stage 3: a unit whole in memory, from the start of its gather to its release.
An observer is a callable `observer(kind, name, begins)`; with none registered (every run without
`--trace`) announcing costs one empty-list test. The engine never reads what observers do.
"""

from __future__ import annotations

from typing import Callable

Observer = Callable[[str, str, bool], None]

OBSERVERS: list[Observer] = []


def announce(kind: str, name: str, begins: bool) -> None:
    """Tell every observer that the region `name` of `kind` begins (or ends) now."""
    for observer in OBSERVERS:
        observer(kind, name, begins)


def observe(observer: Observer) -> None:
    OBSERVERS.append(observer)


def stop_observing(observer: Observer) -> None:
    if observer in OBSERVERS:
        OBSERVERS.remove(observer)
