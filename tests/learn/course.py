"""The course (docs/learn/) as its tests read it: the lessons in order, each lesson's commands with the
output excerpt it shows, its pictures, its Try it, the numbers its running text states; and a runner
that runs every command of a lesson once, as written, from a copy of the repository root.

The lessons' format (docs/learn/README.md, "How every lesson is checked"):
- a command is a ```bash block of one command (`zero-lab ...`, or `make demo`), `#` comments aside;
  a trailing `# exits N` says the command is meant to exit N (a refusal, a run that fails on purpose),
  and `prlimit --as=BYTES zero-lab ...` runs it under an address-space limit per process (Linux);
- a ```text block right after it is an excerpt of what it prints: a line `...` skips output, every
  other line must appear in the output in that order (box-drawing characters, table pipes and runs
  of spaces aside; a line may stop before the output's line does);
- a picture is `![...](img/NAME.png)`, drawn by a command of the lesson with `--plot docs/learn/img/NAME.png`;
- the running text's numbers (outside code) are what a lesson's test computes, but for small integers
  (stages, ranks, bytes per element: 32 or less) and what a test names as a formula's constant.
"""

from __future__ import annotations

import os
import re
import resource
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
LEARN = REPO / "docs" / "learn"
CHINESE = LEARN / "zh"
LESSONS = sorted(LEARN.glob("[0-9]*-*.md"), key=lambda path: int(path.name.split("-")[0]))
ZERO_LAB = str(Path(sys.executable).with_name("zero-lab"))
LAUNCHING = ("run", "compare")  # commands that start torchrun: run as a user would, in a process of their own
BOX = re.compile(r"[│┃┏┓┗┛━─┳┻╇┡┩┣┫╋┼├┤└┘┌┐┬┴═╭╮╰╯|]")
NUMBER = re.compile(r"(?<![\w.-])\d[\d,]*(?:\.\d+)?")
SMALL = 32  # integers up to this are a lesson's vocabulary (stages, ranks, bytes per element), not measurements


def lesson(number: int, chinese: bool = False) -> Path:
    path = next(path for path in LESSONS if path.name.startswith(f"{number}-"))
    return CHINESE / path.name if chinese else path


def read(path: Path) -> str:
    return path.read_text(encoding="utf-8")


@dataclass(frozen=True)
class Shown:
    """One command a lesson shows, with the excerpt of its output (if any) and its section."""

    command: str
    excerpt: tuple[str, ...]
    section: str
    exit_code: int = 0  # what the command is meant to exit with (`# exits N`)


def fenced(text: str) -> list[tuple[str, str, int]]:
    """(language, body, offset) of every fenced block in order."""
    return [(match[1], match[2], match.start()) for match in re.finditer(r"```(\w*)\n(.*?)```", text, flags=re.S)]


def section_at(text: str, offset: int) -> str:
    """The `## ` heading a block sits under (a code block's own lines are not headings)."""
    before = re.sub(r"```.*?```", "", text[:offset], flags=re.S)
    headings = re.findall(r"^## (.+)$", before, flags=re.M)
    return headings[-1] if headings else ""


def shown_commands(text: str) -> list[Shown]:
    """Every ```bash block's command, with the ```text block that follows it as its excerpt."""
    blocks = fenced(text)
    found = []
    for index, (language, body, offset) in enumerate(blocks):
        if language != "bash":
            continue
        lines = [line for line in re.sub(r"\\\n\s*", " ", body).splitlines() if line.strip() and not line.startswith("#")]
        assert len(lines) == 1, f"a bash block shows one command, not {lines}"
        following = blocks[index + 1] if index + 1 < len(blocks) else None
        between = text[offset + len(body) + 10:following[2]] if following else ""
        excerpt = ()
        if following and following[0] == "text" and not between.strip("`\n "):
            excerpt = tuple(line for line in following[1].splitlines() if line.strip())
        meant = re.search(r" # exits (\d+)", lines[0])
        found.append(Shown(lines[0].split(" #")[0].strip(), excerpt, section_at(text, offset),
                           int(meant[1]) if meant else 0))
    return found


def pictures(text: str) -> list[str]:
    """The images a lesson shows, as paths under docs/learn/."""
    return re.findall(r"!\[[^\]]*\]\(([^)]+\.png)\)", text)


def prose(text: str) -> str:
    """The running text: code blocks, inline code, link targets and HTML tags taken out."""
    text = re.sub(r"```.*?```", " ", text, flags=re.S)
    text = re.sub(r"`[^`]*`", " ", text)
    text = re.sub(r"\]\([^)]*\)", "]", text)
    return re.sub(r"<[^>]+>", " ", text)


def stated_numbers(text: str) -> set[str]:
    """The numbers the running text states, but small integers: '596,049,920', '1136.88', '0.667'."""
    numbers = {match.rstrip(",") for match in NUMBER.findall(prose(text))}
    return {number for number in numbers if not (number.isdigit() and int(number) <= SMALL)}


def normalized(line: str) -> str:
    return " ".join(BOX.sub(" ", line).split())


def excerpt_problems(excerpt: tuple[str, ...], output: str) -> list[str]:
    """Each excerpt line not found, in order, in the output (a line may be the start of one)."""
    lines = [normalized(line) for line in output.splitlines()]
    position, problems = 0, []
    for shown in excerpt:
        wanted = normalized(shown)
        if not wanted or wanted == "...":
            continue
        found = next((index for index in range(position, len(lines)) if wanted and wanted in lines[index]), None)
        if found is None:
            problems.append(f"not printed (in this order): {shown.strip()}")
        else:
            position = found + 1
    return problems


@dataclass
class Ran:
    """What running a lesson's commands gave: per command its output, exit code and CPU seconds."""

    workdir: Path
    outputs: dict[str, str] = field(default_factory=dict)
    exit_codes: dict[str, int] = field(default_factory=dict)
    meant_exit_codes: dict[str, int] = field(default_factory=dict)
    cpu_seconds: dict[str, float] = field(default_factory=dict)
    wall_seconds: dict[str, float] = field(default_factory=dict)


def repository_copy(root: Path) -> Path:
    """A place that looks like the repository root to a lesson's commands: the configs and scripts they
    read (linked, read-only for them), and empty folders for what they write (pictures, runs)."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "harness").symlink_to(REPO / "harness")
    (root / "examples").symlink_to(REPO / "examples")
    (root / "docs" / "learn" / "img").mkdir(parents=True)
    (root / "docs" / "learn" / "configs").symlink_to(LEARN / "configs")
    (root / "runs").mkdir()
    return root


def cpu_time(who: int) -> float:
    usage = resource.getrusage(who)
    return usage.ru_utime + usage.ru_stime


def run_command(command: str, workdir: Path) -> tuple[str, int, float, float]:
    """(output, exit code, CPU seconds, wall seconds) of one `zero-lab ...` command run in workdir:
    one that launches in a process of its own, stdout and stderr together as a terminal shows them;
    the others in this process (the CLI as typer runs it)."""
    words = shlex.split(command)
    limit = words[:2] if words[0] == "prlimit" else []  # ["prlimit", "--as=BYTES"]
    argv = words[len(limit) + 1:]
    started = time.monotonic()
    if argv[0] in LAUNCHING or limit:
        before = cpu_time(resource.RUSAGE_CHILDREN)
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
               "PYTHONUNBUFFERED": "1"}
        done = subprocess.run([*limit, ZERO_LAB, *argv], cwd=workdir, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True, timeout=600)
        return done.stdout, done.returncode, cpu_time(resource.RUSAGE_CHILDREN) - before, time.monotonic() - started
    from typer.testing import CliRunner

    from zero_lab.cli.app import app

    before, here = cpu_time(resource.RUSAGE_SELF), os.getcwd()
    os.chdir(workdir)
    try:
        result = CliRunner().invoke(app, argv)
    finally:
        os.chdir(here)
    if result.exception and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result.output, result.exit_code, cpu_time(resource.RUSAGE_SELF) - before, time.monotonic() - started


def run_lesson(number: int, workdir: Path) -> Ran:
    """Every `zero-lab` command the lesson shows, once each, in the order shown."""
    ran = Ran(repository_copy(workdir))
    for shown in shown_commands(read(lesson(number))):
        if not shown.command.startswith(("zero-lab ", "prlimit ")) or shown.command in ran.outputs:
            continue
        output, code, cpu, wall = run_command(shown.command, ran.workdir)
        ran.outputs[shown.command] = output
        ran.exit_codes[shown.command] = code
        ran.meant_exit_codes[shown.command] = shown.exit_code
        ran.cpu_seconds[shown.command] = cpu
        ran.wall_seconds[shown.command] = wall
    return ran


def command_with(ran: Ran, *words: str) -> str:
    """The one command of the run whose words include all of `words` (a lesson's command, found by what it asks)."""
    matches = [command for command in ran.outputs if all(word in shlex.split(command) for word in words)]
    assert len(matches) == 1, f"expected one command with {words}, found {matches}"
    return matches[0]


def as_json(command: str, workdir: Path) -> dict:
    """What a cheap command computes, as data: the same command with --format json and no picture,
    run in this process (stdout only)."""
    import json

    from typer.testing import CliRunner

    from zero_lab.cli.app import app

    argv = shlex.split(command)[1:]
    if "--plot" in argv:
        index = argv.index("--plot")
        del argv[index:index + 2]
    here = os.getcwd()
    os.chdir(workdir)
    try:
        result = CliRunner().invoke(app, [*argv, "--format", "json"])
    finally:
        os.chdir(here)
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


# The checks every lesson's test makes, each returning the problems it found.

def command_problems(ran: Ran) -> list[str]:
    """A command that failed, or took more than 2 cores can do in a minute (CPU seconds, which a
    loaded machine inflates far less than wall time)."""
    problems = [f"exit {code} (meant {ran.meant_exit_codes[command]}): {command}\n{ran.outputs[command][-2000:]}"
                for command, code in ran.exit_codes.items() if code != ran.meant_exit_codes[command]]
    problems += [f"{seconds:.0f} CPU s (over 2 cores x 60 s): {command}"
                 for command, seconds in ran.cpu_seconds.items() if seconds > 120]
    return problems


def excerpts_problems(text: str, ran: Ran) -> list[str]:
    """Every excerpt of a `zero-lab` command against what it printed."""
    problems = []
    for shown in shown_commands(text):
        if shown.excerpt and shown.command in ran.outputs:
            problems += [f"{shown.command}: {problem}" for problem in excerpt_problems(shown.excerpt, ran.outputs[shown.command])]
    return problems


def picture_problems(text: str, ran: Ran) -> list[str]:
    """Each picture the lesson shows against the one its command drew now: the numbers it carries,
    and its pixels when the same matplotlib drew the committed one."""
    import matplotlib
    import numpy

    from zero_lab.analysis.report.picture import picture_data, picture_pixels

    problems = []
    commands = [command for command in ran.outputs if "--plot" in shlex.split(command)]
    for picture in pictures(text):
        drawn_by = [command for command in commands if f"docs/learn/{picture}" in shlex.split(command)]
        if len(drawn_by) != 1:
            problems.append(f"{picture}: drawn by {len(drawn_by)} of the lesson's commands, not 1")
            continue
        committed, fresh = LEARN / picture, ran.workdir / "docs" / "learn" / picture
        if not committed.is_file():
            problems.append(f"{picture} is not committed; draw it with: {drawn_by[0]}")
            continue
        stored, now = picture_data(committed), picture_data(fresh)
        if stored["data"] != now["data"]:
            problems.append(f"{picture} is stale (its numbers changed); draw it again with: {drawn_by[0]}")
        elif stored["matplotlib"] == matplotlib.__version__ and not numpy.array_equal(picture_pixels(committed),
                                                                                      picture_pixels(fresh)):
            problems.append(f"{picture} is stale (drawn differently); draw it again with: {drawn_by[0]}")
    return problems


def number_problems(text: str, facts: dict[str, str], constants: tuple[str, ...] = ()) -> list[str]:
    """Both ways: every number the running text states is a computed fact (or a formula's constant
    the test names), and every fact appears in the lesson (its text or an excerpt)."""
    stated = stated_numbers(text)
    known = set(facts.values()) | set(constants)
    problems = [f"the text states {number}, which no test computes" for number in sorted(stated - known)]
    everywhere = {match.rstrip(",") for match in NUMBER.findall(text)}
    problems += [f"{name} = {value} is computed but not in the lesson" for name, value in facts.items()
                 if value not in everywhere]
    return problems


def mb(nbytes: float, digits: int = 2) -> str:
    """MB (2^20 bytes) as zero-lab prints them."""
    return f"{nbytes / 2**20:.{digits}f}"


def moment(walk: dict, name: str) -> dict:
    return next(item for item in walk["moments"] if item["name"] == name)


def wire(walk: dict, phase: str | None = None) -> int:
    return sum(item["wire_bytes"] for item in walk["collectives"] if phase is None or item["phase"] == phase)


def table_rows(output: str) -> dict[str, list[str]]:
    """The first table of each metric a command printed: row label -> its other cells."""
    rows = {}
    for line in output.splitlines():
        if line.startswith("│"):
            label, *cells = [cell.strip() for cell in line.strip("│").split("│")]
            rows.setdefault(label, cells)
    return rows
