"""The CLI skeleton: help, version, error mapping, exit codes, and the import-direction rule."""

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

import nmt_cli

PKG = Path(nmt_cli.__file__).parent


def run_nmt(*args, input=None):
    return subprocess.run([sys.executable, "-m", "nmt_cli.cli", *args], capture_output=True, text=True,
                          input=input, timeout=120)


def test_help_lists_every_subcommand():
    r = run_nmt("--help")
    assert r.returncode == 0
    for cmd in ("prepare", "train", "average", "translate", "serve", "score", "export", "push"):
        assert cmd in r.stdout
    for cmd in ("prepare", "train", "average", "translate", "score", "push", "export ctranslate2", "export huggingface"):
        sub = run_nmt(*cmd.split(), "--help")
        assert sub.returncode == 0, sub.stderr
        assert "Usage" in sub.stdout


def _commands(command=None, path=("nmt",)):
    """(path, click command) of nmt and of every command and subcommand under it."""
    import typer

    from nmt_cli.cli import app

    command = command or typer.main.get_command(app)
    yield " ".join(path), command
    for name, sub in getattr(command, "commands", {}).items():
        yield from _commands(sub, (*path, name))


def _help(path: str, capsys, monkeypatch) -> str:
    """`PATH --help` as printed at 80 columns when stdout is not a terminal (the CLI run in-process)."""
    from nmt_cli.cli import main

    monkeypatch.setenv("COLUMNS", "80")
    with pytest.raises(SystemExit) as exc:
        main([*path.split()[1:], "--help"])
    out, err = capsys.readouterr()
    assert exc.value.code == 0 and err == "", err
    return out


COMMANDS = ["nmt", "nmt prepare", "nmt train", "nmt average", "nmt translate", "nmt serve", "nmt score", "nmt export",
            "nmt export ctranslate2", "nmt export huggingface", "nmt import", "nmt push", "nmt shortlist"]


def test_every_command_is_covered():
    assert sorted(path for path, _ in _commands()) == sorted(COMMANDS)


@pytest.mark.parametrize("path", COMMANDS)
def test_help_reads_well_at_80_columns_without_a_terminal(path, capsys, monkeypatch):
    """No truncated name, no stray space before a full stop, no Python type as a placeholder, nothing wider than
    80 columns, usage lines without {braces} or [[double brackets]], every option named whole, flags bare."""
    text = _help(path, capsys, monkeypatch)
    assert "\x1b" not in text  # no colours when stdout is not a terminal
    assert "…" not in text and not re.search(r"(?<![A-Z\]])\.\.\.", text), "truncation mark"
    assert not re.search(r" \.(\s|$)", text), "a space before a full stop"
    assert not re.search(r"<(bool|int|float|str|path|file|text|list|dict)\b|\b(list|dict|tuple)\[", text), "a Python type"
    assert max(len(line) for line in text.splitlines()) <= 80
    for usage_line in re.findall(r"^(?:Usage:|   or:) .*$", text, flags=re.M):
        assert "{" not in usage_line and "[[" not in usage_line and "<" not in usage_line, usage_line
    assert text.startswith(f"Usage: {path} ")
    command = dict(_commands())[path]
    for param in command.params:
        if param.param_type_name != "option" or param.hidden:
            continue
        names = list(param.opts)
        if param.secondary_opts == [f"--no-{names[-1][2:]}"]:
            names[-1] = f"--[no-]{names[-1][2:]}"  # --resume/--no-resume, as git writes it
        for name in names:
            assert re.search(rf"(^|[ ,]){re.escape(name)}([ ,\n]|$)", text, flags=re.M), f"{name} missing or cut"
        if param.is_flag and not param.secondary_opts:
            line = next(ln for ln in text.splitlines() if re.search(rf"{re.escape(param.opts[-1])}(  |$)", ln))
            assert re.search(rf"{re.escape(param.opts[-1])}(  |$)", line), f"{param.opts} shows a placeholder"


def test_help_in_a_terminal_is_the_same_text_in_colour():
    """On a terminal the help is coloured (click strips the colours when stdout is not one); stripped of its
    escape codes it is the text a pipe gets."""
    import click
    import typer

    from nmt_cli.cli import app

    group = typer.main.get_command(app)
    with group.make_context("nmt", ["train", "--help"], resilient_parsing=True) as root:
        train = group.get_command(root, "train")
        with train.make_context("train", [], parent=root, resilient_parsing=True) as ctx:
            coloured = train.get_help(ctx)
    assert "\x1b[" in coloured
    plain = re.sub(r"\x1b\[[0-9;]*m", "", coloured)
    assert plain.startswith("Usage: nmt train DATA_DIR -o RUN_DIR [OPTIONS]") and "--save-every-minutes" in plain
    assert click.unstyle(coloured) == plain


def test_version():
    r = run_nmt("--version")
    assert r.returncode == 0 and r.stdout.strip() == f"nmt {nmt_cli.__version__}"


def test_core_error_is_one_line_exit_1(tmp_path):
    r = run_nmt("translate", "-m", str(tmp_path / "missing.pt"), input="hello\n")
    assert r.returncode == 1
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "missing.pt" in lines[0] and "error" in lines[0]
    assert "Traceback" not in r.stderr


def test_debug_shows_traceback(tmp_path):
    r = run_nmt("--debug", "translate", "-m", str(tmp_path / "missing.pt"), input="hello\n")
    assert r.returncode != 0 and "Traceback" in r.stderr


def test_debug_after_the_command_shows_traceback_too(tmp_path):
    """The error line says "use --debug": it works where users add it, after the command as well as before."""
    r = run_nmt("translate", "-m", str(tmp_path / "missing.pt"), "--debug", input="hello\n")
    assert r.returncode != 0 and "Traceback" in r.stderr and "no such option" not in r.stderr


def test_debug_after_a_double_dash_is_an_argument():
    from nmt_cli.cli import _debug_first

    assert _debug_first(["train", "d", "--debug", "-o", "r"]) == ["--debug", "train", "d", "-o", "r"]
    assert _debug_first(["score", "--", "--debug"]) == ["score", "--", "--debug"]


def test_bad_option_value_is_one_usage_line_exit_2():
    r = run_nmt("translate", "--beam", "notanumber")
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.count("\n") == 1 and r.stderr.startswith("error: ")
    assert "--beam" in r.stderr and "'nmt translate --help'" in r.stderr


def _imports(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


def test_core_never_imports_typer_or_rich():
    offenders = []
    for path in PKG.rglob("*.py"):
        rel = path.relative_to(PKG)
        if rel.parts[0] == "commands" or rel.name == "cli.py":
            continue
        bad = _imports(path) & {"typer", "rich", "click"}
        if bad:
            offenders.append(f"{rel}: {sorted(bad)}")
    assert offenders == []


def test_core_does_not_import_commands():
    for path in PKG.rglob("*.py"):
        rel = path.relative_to(PKG)
        if rel.parts[0] == "commands" or rel.name == "cli.py":
            continue
        src = path.read_text()
        assert "nmt_cli.commands" not in src and "nmt_cli.cli" not in src, rel
