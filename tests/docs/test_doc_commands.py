"""The `zero-lab` commands the docs show: every one parses (each flag exists, each value has its type),
the cheap ones run, and what the docs say they print is what they print."""

from __future__ import annotations

import json
import re

import pytest
import typer
from typer.testing import CliRunner

from zero_lab.cli.app import app
from tests.docs.doc_text import DOCS, REPO, code_commands, read

runner = CliRunner()
COMMANDS = [(path.name, argv) for path in DOCS for argv in code_commands(read(path))]
CHEAP = ("estimate", "explain", "config")  # no launch, no torch for a preset


def shown(argv: list[str]) -> list[str]:
    """The command as a user would type it: optional parts in [...] kept, a shell redirection cut."""
    argv = argv[:argv.index(">")] if ">" in argv else argv
    return [word.strip("[]") for word in argv]


def command_of(argv: list[str]):
    """(the click command argv names, its arguments); typer may carry its own click, so a group is
    told by its sub-commands, not by its class."""
    group = typer.main.get_command(app)
    command, rest = group, list(argv)
    while hasattr(command, "commands"):
        command, rest = command.commands.get(rest[0]), rest[1:]
        assert command is not None, argv
    assert hasattr(command, "callback") and not hasattr(command, "commands"), argv
    return command, rest


@pytest.mark.parametrize("where, argv", COMMANDS, ids=[f"{where}:{' '.join(argv[:4])}" for where, argv in COMMANDS])
def test_every_command_in_the_docs_parses(where, argv):
    command, rest = command_of(shown(argv))
    arguments = rest[:rest.index("--")] if "--" in rest else rest
    command.make_context(command.name, arguments, resilient_parsing=False)  # raises on a flag it lacks


@pytest.mark.parametrize("where, argv", [(where, argv) for where, argv in COMMANDS if argv[0] in CHEAP and "--measure" not in argv],
                         ids=lambda value: value if isinstance(value, str) else " ".join(value[:4]))
def test_the_cheap_commands_in_the_docs_run(where, argv, monkeypatch):
    monkeypatch.chdir(REPO)
    result = runner.invoke(app, shown(argv))
    assert result.exit_code == 0, f"{where}: zero-lab {' '.join(argv)}\n{result.output}"


def options_of(argv: list[str]) -> set[str]:
    command, _ = command_of(argv)
    return {option for parameter in command.params for option in parameter.opts if option.startswith("--")} - {"--help"}


def test_explain_documents_its_own_options():
    section = read(REPO / "docs" / "cli.md").split("## `zero-lab explain`")[1].split("\n## ")[0]
    listed = set(re.findall(r"`(--[\w-]+)", section.split("Options:")[1].split("\n\n")[0]))
    assert listed == options_of(["explain"]), listed ^ options_of(["explain"])
    mentioned = set(re.findall(r"(?<![\w-])(--[a-z][\w-]+)", section.replace(section.split("Options:")[1].split("\n\n")[0], "")))
    assert mentioned <= options_of(["explain"]), f"explain's section names options explain lacks: {mentioned - options_of(['explain'])}"


def quoted_errors(readme: str) -> list[str]:
    """Every quoted message of the README's last section, "Common errors"."""
    return re.findall(r"`([^`]+)`", read(REPO / readme).split("## ")[-1])


def config_with(tmp_path, **zero) -> str:
    config = json.loads((REPO / "harness" / "configs" / "zero2.json").read_text())
    config["zero_optimization"].update(zero)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    return str(path)


@pytest.mark.parametrize("readme", ["README.md", "README.zh-CN.md"])
def test_the_common_errors_the_readme_quotes_are_what_the_cli_prints(readme, tmp_path, monkeypatch):
    from zero_lab.launch import torchrun_job

    monkeypatch.setattr(torchrun_job.subprocess, "Popen", lambda *args, **kwargs: pytest.fail("bad input launched torchrun"))
    official_only = tmp_path / "official-only.json"
    official_only.write_text(json.dumps({**json.loads((REPO / "harness" / "configs" / "zero2.json").read_text()),
                                         "flops_profiler": {"enabled": False}}))
    run = ["run", "--device", "cpu", "--model", "tiny", "--out", str(tmp_path / "runs")]
    produced_by = {  # the README's quote (X: any word, ...: anything) -> a command that meets it
        "error: ...: config key 'X' is known to official DeepSpeed but not implemented by nano": [*run, "--config", str(official_only)],
        "error: official DeepSpeed rejects fp16 on this CPU": ["compare", "--device", "cpu", "--dtype", "float16"],
        "zero_optimization.offload_param needs stage 3": [*run, "--stage", "2", "--offload", "param"],
        "nvme is not implemented by nano": [*run, "--config", config_with(tmp_path, offload_optimizer={"device": "nvme"})],
    }
    quotes = quoted_errors(readme)
    for quote, argv in produced_by.items():
        assert quote in quotes, f"{readme} no longer quotes {quote!r}"
        result = runner.invoke(app, argv)
        assert result.exit_code == 2, result.output
        pattern = re.escape(quote).replace(re.escape("..."), ".*").replace("X", r"\S+")
        assert re.search(pattern, result.stderr), f"{readme} quotes {quote!r}; the CLI prints {result.stderr!r}"
