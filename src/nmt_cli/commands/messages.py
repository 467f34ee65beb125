"""Lines on stderr that commands share: notes (e.g. which hub commit a model came from)."""

from __future__ import annotations


def note_line(message: str) -> None:
    from rich.console import Console
    from rich.markup import escape

    Console(stderr=True, highlight=False, soft_wrap=True).print(f"[dim]note:[/] {escape(message)}")
