"""Option values more than one command parses the same way."""

from __future__ import annotations

import typer


def int_or_auto(value: str | None) -> int | str | None:
    """An option's N|auto: a positive integer, or auto. --max-tokens (nmt train, translate and serve; auto: the
    largest batch that fits the GPU, found by a probe: nmt_cli/runtime/memory.py) and --update-freq (nmt train)."""
    if value is None or value == "auto":
        return value
    try:
        n = int(value)
    except ValueError:
        raise typer.BadParameter(f"must be a positive integer or 'auto', not {value!r}") from None
    if n < 1:
        raise typer.BadParameter(f"must be a positive integer or 'auto', got {n}")
    return n
