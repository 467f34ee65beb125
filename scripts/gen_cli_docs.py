"""Generate docs/cli.md from the Typer app's own --help output (tests/test_docs.py checks it is current).

Usage: python scripts/gen_cli_docs.py [--check]
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "docs" / "cli.md"
COMMANDS = ["prepare", "train", "average", "translate", "score", "export", "export ctranslate2", "export huggingface",
            "push"]


def help_text(*args: str) -> str:
    env = {**os.environ, "COLUMNS": "100", "TERM": "dumb", "NO_COLOR": "1"}
    env.pop("FORCE_COLOR", None)
    out = subprocess.run([sys.executable, "-m", "nmt_cli.cli", *args, "--help"], capture_output=True, text=True,
                         env=env, check=True).stdout
    return "\n".join(line.rstrip() for line in out.splitlines()).strip("\n")


def versions() -> str:
    """The libraries that format --help (another version lays the same help out differently)."""
    from importlib.metadata import version

    return ", ".join(f"{name} {version(name)}" for name in ("typer", "click", "rich"))


def render() -> str:
    parts = ["# CLI reference", "",
             "Generated from the Typer app by `python scripts/gen_cli_docs.py`; `tests/test_docs.py` fails when it",
             "is out of date.", "", f"<!-- formatted by {versions()} -->", "", "## nmt", "", "```", help_text(),
             "```", ""]
    for name in COMMANDS:
        parts += [f"## nmt {name}", "", "```", help_text(*name.split()), "```", ""]
    return "\n".join(parts)


if __name__ == "__main__":
    text = render()
    if "--check" in sys.argv:
        sys.exit(0 if OUT.exists() and OUT.read_text() == text else 1)
    OUT.write_text(text)
    print(f"wrote {OUT}")
