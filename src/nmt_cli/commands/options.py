"""Option values more than one command parses the same way."""

from __future__ import annotations

import typer


def max_tokens_option(value: str | None) -> int | str | None:
    """--max-tokens N|auto (nmt train, translate and serve): a positive integer, or auto (the largest batch that fits
    the GPU, found by a probe: nmt_cli/memory.py)."""
    if value is None or value == "auto":
        return value
    try:
        n = int(value)
    except ValueError:
        raise typer.BadParameter(f"must be a positive integer or 'auto', not {value!r}") from None
    if n < 1:
        raise typer.BadParameter(f"must be a positive integer or 'auto', got {n}")
    return n
