"""The restarts of one run (`--max-restarts`, docs/restarts.md), read from what the launch printed.

Phase 1: split torchrun's console into attempts. Each attempt starts with the `[rank]` line that
         local rank 0 prints once it joined the process group (torchrun shows that rank's stdout).
Phase 2: in each attempt, torchrun's elastic agent names the worker it lost, in its own log line
             E1204 11:28:22.940000 6173 .../api.py:1002] failed (exitcode: -9) local_rank: 1 (pid: 6186) ...
         (a negative exit code is the signal that ended it: -9 is SIGKILL), and rank 0's lines
         say the last step done and, in the next attempt, the checkpoint step it resumed from
         (`[ckpt] action=load`, none when no checkpoint had been saved yet: step 0).
Phase 3: the repeated steps: those the parsed log superseded (`logparse.supersede_from`), and how
         far each repeat's loss lies from the first run of that step (0.0 when they are equal).
"""

from __future__ import annotations

import re
import signal

from zero_lab.analysis.runs.logparse import ParsedLog, is_number, read_fields
from zero_lab.workload.log_contract.log_lines import find_tagged

FAILED_WORKER = re.compile(r"^[EWI](?P<when>\d{4} \d\d:\d\d:\d\d\.\d+).*failed \(exitcode: (?P<code>-?\d+)\) "
                           r"local_rank: (?P<rank>\d+) \(pid: (?P<pid>\d+)\)")


def signal_name(exit_code: int) -> str | None:
    """SIGKILL for -9: torchrun reports a worker ended by a signal as minus its number."""
    if exit_code >= 0:
        return None
    try:
        return signal.Signals(-exit_code).name
    except ValueError:
        return f"signal {-exit_code}"


def attempts(console_text: str) -> list[list[str]]:
    """Phase 1: the console's lines, one list per attempt (what came before the first `[rank]` joins the first)."""
    split: list[list[str]] = [[]]
    seen_rank = False
    for line in console_text.splitlines():
        found = find_tagged(line)
        if found is not None and found[0] == "rank":
            if seen_rank:
                split.append([])
            seen_rank = True
        split[-1].append(line)
    return split


def attempt_facts(lines: list[str]) -> dict:
    """Phase 2 for one attempt: its lost workers, its last step and the step it loaded."""
    failures, steps, loaded = [], [], None
    for line in lines:
        failed = FAILED_WORKER.search(line)
        if failed:
            code = int(failed["code"])
            failures.append({"rank": int(failed["rank"]), "exit_code": code, "signal": signal_name(code),
                             "pid": int(failed["pid"]), "logged_at": failed["when"]})
            continue
        found = find_tagged(line)
        if found is None:
            continue
        tag, step, rest = found
        if tag == "opt_step":
            steps.append(step)
        elif tag == "ckpt":
            fields = read_fields(tag, rest) or {}
            if fields.get("action") == "load" and is_number(fields.get("step")):
                loaded = int(fields["step"])
    return {"failures": failures, "last_step": steps[-1] if steps else None, "loaded": loaded}


def restart_events(console_text: str) -> list[dict]:
    """One record per restart: the attempt it began, the worker lost before it (its local rank, which
    is its global rank on one node; exit code and signal; torchrun's timestamp), the last step done
    before the loss, and the checkpoint step the new attempt resumed from."""
    facts = [attempt_facts(lines) for lines in attempts(console_text)]
    events, last_step = [], None  # None: this machine's rank-0 log shows no step (global rank 0 ran elsewhere)
    for attempt, (before, after) in enumerate(zip(facts, facts[1:]), start=1):
        last_step = before["last_step"] if before["last_step"] is not None else last_step
        lost = before["failures"][0] if before["failures"] else {}
        events.append({"attempt": attempt, "rank": lost.get("rank"), "exit_code": lost.get("exit_code"),
                       "signal": lost.get("signal"), "logged_at": lost.get("logged_at"),
                       "after_step": last_step, "resumed_from_step": after["loaded"] or 0})
    return events


def repeated_steps(parsed: ParsedLog) -> tuple[list[int], float | None]:
    """Phase 3: (the steps run more than once, the largest |loss difference| between a step's runs)."""
    final = {int(row["step"]): row.get("loss") for row in parsed.steps}
    repeated, largest = set(), None
    for row in parsed.superseded:
        step = int(row["step"])
        repeated.add(step)
        if is_number(row.get("loss")) and is_number(final.get(step)):
            difference = abs(float(row["loss"]) - float(final[step]))
            largest = difference if largest is None else max(largest, difference)
    return sorted(repeated), largest


def restart_record(console_text: str, parsed: ParsedLog) -> dict:
    """summary.json's keys for restarts: `restarts` (how many), `restart_events`, `repeated_steps` and
    `repeated_loss_max_diff` (None when no step was repeated)."""
    events = restart_events(console_text)
    repeated, largest = repeated_steps(parsed)
    return {"restarts": len(events), "restart_events": events, "repeated_steps": repeated,
            "repeated_loss_max_diff": largest}
