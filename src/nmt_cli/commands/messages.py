"""What commands share on stderr: notes (e.g. which hub commit a model came from), warnings, usage errors."""

from __future__ import annotations

import importlib

import typer


def note_line(message: str) -> None:
    from rich.console import Console
    from rich.markup import escape

    Console(stderr=True, highlight=False, soft_wrap=True).print(f"[dim]note:[/] {escape(message)}")


def warning_line(message: str) -> None:
    from rich.console import Console
    from rich.markup import escape

    Console(stderr=True, highlight=False, soft_wrap=True).print(f"[yellow]warning:[/] {escape(message)}")


def click_exceptions():
    """The exceptions module of the click that typer runs on (its own copy since typer 0.2x, else click)."""
    return importlib.import_module(typer.BadParameter.__module__)


def usage_error(message: str) -> Exception:
    """A usage error (exit status 2) whose message is the whole line: `raise usage_error("pass -r REF ...")`."""
    return click_exceptions().UsageError(message)
