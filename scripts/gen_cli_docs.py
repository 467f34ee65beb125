"""Generate docs/cli.md from the app's own --help output, as printed at 80 columns (tests/test_docs.py checks
that it is current).

Usage: python scripts/gen_cli_docs.py [--check]
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "docs" / "cli.md"
COMMANDS = ["prepare", "train", "average", "translate", "serve", "score", "export", "export ctranslate2",
            "export huggingface", "import", "push", "shortlist"]  # tests/test_docs.py checks that this names every command of the app

PREAMBLE = """\
# CLI reference

Generated from the app by `python scripts/gen_cli_docs.py`: each command's `--help`, as printed at 80 columns;
`tests/test_docs.py` fails when this page is out of date.

## Errors and exit status

Every error is one line on stderr that names the file, option or value at fault and says what to do:

```
error: cannot read input missing.txt: no such file; check the path  (use --debug for the traceback)
error: missing option -o / --output RUN_DIR  (see 'nmt train --help')
```

| Status | Meaning |
|---|---|
| 0 | done |
| 1 | an error: missing, unreadable or inconsistent input (text, data directory, checkpoint), a device or precision the machine lacks, a download that failed, training that cannot go on; `nmt --debug COMMAND ...` shows the traceback |
| 2 | a usage error: an unknown option, a missing or invalid option or argument (`nmt COMMAND --help` lists them) |
| 130 | interrupted by Ctrl-C (`nmt train` saves a checkpoint first; 143 when stopped by SIGTERM) |

Warnings (e.g. invalid UTF-8 replaced by `nmt translate`) are lines that start with `warning:`; notes (e.g. the
hub commit a model came from) start with `note:`. No library warning reaches stderr.

## Input text

Every command that reads text (`nmt prepare`, `nmt translate`, `nmt score`) splits it into lines the same way,
from a file or from stdin: only `\\n` ends a line. `\\r\\n` is one line end (its `\\r` is dropped, so a file written
on Windows reads the same); a bare `\\r`, U+2028, U+2029, U+0085, a vertical tab or a form feed is part of its
line (Python's `str.splitlines()` would split there). A last line without `\\n` counts. Text is UTF-8: `nmt score`
and `nmt prepare` name the first line that is not (`nmt prepare --errors replace` replaces bad bytes by U+FFFD, as
`nmt translate` does with a warning).
"""


def help_text(*args: str) -> str:
    env = {**os.environ, "COLUMNS": "80", "TERM": "dumb", "NO_COLOR": "1"}
    env.pop("FORCE_COLOR", None)
    out = subprocess.run([sys.executable, "-m", "nmt_cli.cli", *args, "--help"], capture_output=True, text=True,
                         env=env, check=True).stdout
    return "\n".join(line.rstrip() for line in out.splitlines()).strip("\n")


def versions() -> str:
    """The library whose parameters the help is written from (nmt_cli/commands/helpformat.py lays it out)."""
    from importlib.metadata import version

    return f"typer {version('typer')}"


def render() -> str:
    parts = [PREAMBLE, f"<!-- formatted by {versions()} -->", "", "## nmt", "", "```", help_text(), "```", ""]
    for name in COMMANDS:
        parts += [f"## nmt {name}", "", "```", help_text(*name.split()), "```", ""]
    return "\n".join(parts)


if __name__ == "__main__":
    text = render()
    if "--check" in sys.argv:
        sys.exit(0 if OUT.exists() and OUT.read_text() == text else 1)
    OUT.write_text(text)
    print(f"wrote {OUT}")
