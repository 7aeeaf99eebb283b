"""One lab directory per test module, checked by `zero-lab lab check` as a learner runs it.

`LabDirectory.check(text)` writes `text` as the learner's lab.py and runs the check in a
subprocess; the nano (and official) runs the check keeps in DIR/.zero-lab/ are reused by the
module's later checks, so one module launches nano once per world size.
"""

import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from tests.labs.mistakes import planted

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
