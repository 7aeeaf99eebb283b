"""One lab directory per test module, checked by `zero-lab lab check` as a learner runs it.

`LabDirectory.check(text)` writes `text` as the learner's lab.py and runs the check in a
subprocess; the nano (and official) runs the check keeps in DIR/.zero-lab/ are reused by the
module's later checks, so one module launches nano once per world size.

A lab's mutants are judged by the lab check's own comparisons (`zero_lab.labs.check`) on runs
trained together in one spawned world (`mutant_outputs`, tests/labs/in_process.py): what
`lab check` would print for each, without a launch per mutant. A mutant whose check is "runs" (a
rank stops) stays on a `lab check` launch, where torchrun stops the other ranks.
"""

import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from tests.labs.in_process import engine_package, lab_runs
from tests.labs.mistakes import Mutant, mutants_of, planted
from zero_lab.labs.catalog import BY_NAME

ZERO_LAB = str(Path(sys.executable).with_name("zero-lab"))
SOLUTIONS = Path(__file__).resolve().parent / "solutions"


@dataclass
class LabDirectory:
    lab: str
    directory: Path

    @classmethod
    def start(cls, lab: str, root: Path) -> "LabDirectory":
        directory = root / f"lab_{lab}"
        done = subprocess.run([ZERO_LAB, "lab", "start", lab, str(directory)], capture_output=True, text=True,
                              timeout=120)
        assert done.returncode == 0, done.stderr
        return cls(lab, directory)

    def solution(self) -> str:
        return (SOLUTIONS / f"{self.lab}.py").read_text()

    def with_mistake(self, name: str) -> str:
        return planted(self.solution(), self.lab, name)

    def check(self, lab_text: str | None, *options: str) -> subprocess.CompletedProcess:
        """Run `zero-lab lab check` on the directory with `lab_text` as lab.py (None: as start wrote it)."""
        if lab_text is not None:
            (self.directory / "lab.py").write_text(lab_text)
        return subprocess.run([ZERO_LAB, "lab", "check", self.lab, str(self.directory), *options],
                              capture_output=True, text=True, timeout=900)


def assert_stops_at_the_first_function(done: subprocess.CompletedProcess, lab: str, function: str) -> None:
    """The untouched skeleton's check: its first item fails at 2 ranks, naming the function to write."""
    assert done.returncode == 1, done.stdout + done.stderr
    assert done.stdout.startswith("FAIL runs (world size 2)\n"), done.stdout
    assert f"lab {lab}'s {function} is not written yet" in done.stdout
    assert f"hint: write {function} in lab.py" in done.stdout


def assert_every_check_passed(done: subprocess.CompletedProcess, world_sizes=(2, 3)) -> None:
    """`check` exited 0 with the four checks passed at every world size."""
    assert done.returncode == 0, done.stdout + done.stderr
    for world_size in world_sizes:
        for check in ("runs", "losses", "bytes", "wire"):
            assert f"PASS {check} (world size {world_size})" in done.stdout, done.stdout


def assert_beside_nano_and_official(stdout: str, world_sizes=(2, 3)) -> None:
    """In the closing table of a passed check, the learner's row equals nano's (last loss, bytes held after
    the step, wire bytes per step) and its last loss equals official DeepSpeed's, at every world size."""
    rows = [line.split("│")[1:-1] for line in stdout.splitlines() if line.startswith("│")]
    figures = {(row[0].strip(), row[1].strip()): [cell.strip() for cell in row[2:]] for row in rows}
    for world_size in map(str, world_sizes):
        assert figures[(world_size, "yours")] == figures[(world_size, "nano")], stdout
        assert figures[(world_size, "yours")][0] == figures[(world_size, "official")][0], stdout


def mutant_outputs(lab: LabDirectory, root: Path) -> dict[str, tuple[int, str]]:
    """{mutant: (the exit code, what `lab check --gpus 2 --no-official` prints)} of each of the lab's
    mutants that runs to its end, trained beside nano in one world of 2 ranks."""
    from zero_lab.analysis.compare.metrics import resolve_loss_tol
    from zero_lab.labs.check import checks_in_order, printed

    mutants = [mutant for mutant in mutants_of(lab.lab) if mutant.caught_by != "runs"]
    packages = {mutant.name: engine_package(root, f"lab_{lab.lab}_{mutant.name}", lab.with_mistake(mutant.name))
                for mutant in mutants}
    packages["reference"] = engine_package(root, f"lab_{lab.lab}_reference", lab.solution())
    runs = lab_runs(BY_NAME[lab.lab], packages, root)
    outputs, tolerance = {}, resolve_loss_tol(None, ["fp32"])
    for name in packages:
        results = checks_in_order(runs[name], BY_NAME[lab.lab], lambda: runs["nano"], tolerance)
        text = "".join(line + "\n" for result in results for line in printed(result))
        outputs[name] = (0 if results[-1].ok else 1, text)
    # judged in the world, the reference solution passes every check, as its `lab check` launch does: what
    # fails a mutant here is its mistake, not the world
    code, text = outputs.pop("reference")
    assert code == 0, f"the reference solution fails when judged in the world:\n{text}"
    return outputs


def assert_the_mutant_is_caught(lab: LabDirectory, mutant: Mutant, outputs: dict[str, tuple[int, str]]) -> None:
    """The check fails with the mutant planted, at the check the mutant names, every check before it
    passed, and its hint names the function at fault: judged on the world's runs (`mutant_outputs`), or
    by a `lab check` launch for a mutant whose check is "runs"."""
    if mutant.caught_by == "runs":
        options = ("--gpus", "2") if lab.lab == "fp16" else ("--gpus", "2", "--no-official")
        done = lab.check(lab.with_mistake(mutant.name), *options)
        code, stdout = done.returncode, done.stdout + done.stderr
    else:
        code, stdout = outputs[mutant.name]
    assert code == 1, stdout
    order = ("runs", "losses", "bytes", "wire")
    for check in order[:order.index(mutant.caught_by)]:
        assert f"PASS {check} (world size 2)" in stdout, stdout
    assert f"FAIL {mutant.caught_by} (world size 2)" in stdout, stdout
    (hint,) = [line for line in stdout.splitlines() if line.startswith("  hint: ")]
    named = sorted((hint.index(function), function) for function in BY_NAME[lab.lab].functions if function in hint)
    assert named and named[0][1] == mutant.function, (mutant.name, hint)  # the first function it names
    for shown in mutant.shows:
        assert shown in stdout, (shown, stdout)
