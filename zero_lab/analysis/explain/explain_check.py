"""`zero-lab explain --measure`: a recorded step (`workload.tracing.step_trace`) beside its prediction.

Collectives are compared per engine call (forward, backward, step) as multisets of (collective
family, payload bytes): the order inside a backward follows autograd, which the prediction does
not claim. Memory is compared category by category, exactly, at each recorded moment: the
formula is the engine's own bookkeeping, so any byte of difference is a finding.
"""

from __future__ import annotations

from collections import Counter

from zero_lab.analysis.explain.explain import PHASES
from zero_lab.analysis.explain.explain_tables import mb
from zero_lab.nano.memory.memory_formula import CATEGORIES
from zero_lab.workload.meters.wire_bytes import family

ENGINE_CALLS = ("forward", "backward", "step")


def engine_call(phase: str) -> str:
    """forward, backward or step: the engine call a predicted phase runs in."""
    call = PHASES[phase][0]
    return "forward" if call == "engine(batch)" else "backward" if call.startswith("engine.backward") else "step"


def predicted_by_call(prediction: dict) -> dict[str, list[dict]]:
    found = {call: [] for call in ENGINE_CALLS}
    for item in prediction["collectives"]:
        found[engine_call(item["phase"])].append(item)
    return found


def signature(items: list[dict]) -> Counter:
    return Counter((family(item["op"]), item["payload_bytes"]) for item in items)


def disagreements(prediction: dict, record: dict) -> list[str]:
    """One line per difference between the prediction and the record (none: they agree)."""
    problems = []
    predicted = predicted_by_call(prediction)
    for call in ENGINE_CALLS:
        expected, got = signature(predicted[call]), signature(record["collectives"][call])
        for (op, payload), count in sorted((expected - got).items()):
            problems.append(f"{call}: predicted {count} more {op} of {payload} bytes than recorded")
        for (op, payload), count in sorted((got - expected).items()):
            problems.append(f"{call}: recorded {count} {op} of {payload} bytes that were not predicted")
    moments = {moment["name"]: moment["bytes"] for moment in prediction["moments"]}
    for moment, measured in record["memory"].items():
        for category in CATEGORIES:
            if measured[category] != moments[moment][category]:
                problems.append(f"{moment}: {category} predicted {moments[moment][category]} bytes, "
                                f"measured {measured[category]}")
    return problems


def calls_text(items: list[dict]) -> str:
    counts = signature(items)
    return ", ".join(f"{count} x {op} {mb(payload)} MB" for (op, payload), count in sorted(counts.items())) or "nothing"


def collectives_comparison(prediction: dict, record: dict) -> tuple[list[str], list[list[str]]]:
    predicted = predicted_by_call(prediction)
    body = [[call, calls_text(predicted[call]), calls_text(record["collectives"][call]),
             "yes" if signature(predicted[call]) == signature(record["collectives"][call]) else "NO"]
            for call in ENGINE_CALLS]
    return ["engine call", "predicted", "recorded", "agree"], body


def recorded_sequence(record: dict) -> tuple[list[str], list[list[str]]]:
    """Every recorded collective, in order, under the name the meter counted it."""
    body = [[call, str(index), item["op"], str(item["payload_bytes"]), str(item["wire_bytes"])]
            for call in ENGINE_CALLS for index, item in enumerate(record["collectives"][call], 1)]
    return ["engine call", "#", "op", "payload bytes", "wire bytes"], body


def memory_comparison(prediction: dict, record: dict) -> tuple[list[str], list[list[str]]]:
    moments = [moment for moment in (item["name"] for item in prediction["moments"]) if moment in record["memory"]]
    predicted = {item["name"]: item["bytes"] for item in prediction["moments"]}
    body = [[category.replace("_", " "), *[f"{predicted[moment][category]} / {record['memory'][moment][category]}"
                                           for moment in moments]] for category in CATEGORIES]
    return ["bytes: predicted / measured", *[moment.replace("_", " ") for moment in moments]], body
