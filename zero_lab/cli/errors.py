"""Bad input ends a command with one line, `error: <problem>. <fix>`, and exit code 2."""

from __future__ import annotations

import functools
import sys

import typer

EXIT_OK, EXIT_GATE, EXIT_BAD_INPUT, EXIT_RUN_FAILED = 0, 1, 2, 3  # interrupted: 128 + the signal's number
FOREIGN_BAD_INPUT = {"NanoConfigError", "WorkloadError", "CheckpointError"}


class BadInput(Exception):
    """A problem the user can fix; never shown as a traceback."""

    def __init__(self, problem: str, fix: str = ""):
        super().__init__(f"{problem.rstrip('.')}. {fix}".strip())


def one_line_errors(command):
    """Turn BadInput (and the engine's config errors) into one line on stderr and exit 2."""

    @functools.wraps(command)
    def wrapper(*args, **kwargs):
        try:
            return command(*args, **kwargs)
        except BadInput as error:
            fail(str(error))
        except Exception as error:
            # The engine's and the workload's bad-input errors already read `<problem>. <fix>`.
            if type(error).__name__ not in FOREIGN_BAD_INPUT:
                raise
            fail(str(error))

    return wrapper


def fail(message: str) -> None:
    print(f"error: {message}", file=sys.stderr)
    raise typer.Exit(EXIT_BAD_INPUT)


def check_not_negative(value: float | None, option: str) -> None:
    """None (not given) or a value of 0 or more, else BadInput naming the option."""
    if value is not None and value < 0:
        raise BadInput(f"{option} {value} is negative", f"pass 0 or more to {option}")


def check_positive(value: float | None, option: str) -> None:
    """None (not given) or a value above 0, else BadInput naming the option."""
    if value is not None and not value > 0:
        raise BadInput(f"{option} {value} is not above 0", f"pass a positive number to {option}")


def check_choice(value: str, option: str, choices: tuple[str, ...]) -> str:
    """value if it is one of choices, or BadInput naming the option and the choices."""
    if value not in choices:
        raise BadInput(f"{option} {value} is not one of {', '.join(choices)}", f"for example {option} {choices[0]}")
    return value


def parse_int_list(text: str, option: str, allowed: range | None = None) -> list[int]:
    """'1,2,8' -> [1, 2, 8], or BadInput naming the option."""
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise BadInput(f"{option} must be a comma-separated list of integers, not {text!r}", f"for example {option} 1,2")
    if not values:
        raise BadInput(f"{option} is empty", f"for example {option} 1,2")
    for value in values:
        if allowed is not None and value not in allowed:
            raise BadInput(f"{option} has {value}, outside {allowed.start}..{allowed.stop - 1}", "pick values in range")
    return values


def check_picture_path(path, flag: str) -> None:
    """A picture's path: a .png in an existing directory (checked before any work)."""
    if path.suffix.lower() != ".png":
        raise BadInput(f"{flag} {path} is not a .png file", f"name the picture like {flag} step.png")
    if not path.parent.is_dir():
        raise BadInput(f"{flag} {path}: the directory {path.parent} does not exist", "create it first, or pick another path")
