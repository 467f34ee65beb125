"""Docs that must stay true: the CLI reference matches the app; the README keeps its two set-up commands."""

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_cli_reference_is_current():
    spec = importlib.util.spec_from_file_location("gen_cli_docs", ROOT / "scripts" / "gen_cli_docs.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    text = (ROOT / "docs" / "cli.md").read_text()
    stamp = f"<!-- formatted by {mod.versions()} -->"
    if stamp not in text:
        pytest.skip(f"docs/cli.md was formatted with another version of typer than this one ({stamp})")
    assert text == mod.render(), "run: python scripts/gen_cli_docs.py"


def test_readme_starts_with_the_two_setup_commands():
    text = (ROOT / "README.md").read_text()
    first_block = text.split("```")[1]
    commands = [ln.split("#")[0].strip() for ln in first_block.splitlines()[1:] if ln.strip()]
    assert commands == ["make demo", "make test"]


def test_docs_links_resolve():
    import re

    for md in [ROOT / "README.md", *(ROOT / "docs").glob("*.md")]:
        for target in re.findall(r"\]\(([^)#:]+\.md)\)", md.read_text()):
            assert (md.parent / target).exists(), f"{md.name} links to missing {target}"
