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


def _load_generator():
    spec = importlib.util.spec_from_file_location("gen_cli_docs", ROOT / "scripts" / "gen_cli_docs.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_cli_reference_covers_every_command():
    import typer

    from nmt_cli.cli import app

    def names(group, prefix=""):
        for name, cmd in getattr(group, "commands", {}).items():
            if not cmd.hidden:
                yield prefix + name
                yield from names(cmd, prefix + name + " ")

    assert sorted(_load_generator().COMMANDS) == sorted(names(typer.main.get_command(app)))


def test_readme_starts_with_the_two_setup_commands():
    text = (ROOT / "README.md").read_text()
    first_block = text.split("```")[1]
    commands = [ln.split("#")[0].strip() for ln in first_block.splitlines()[1:] if ln.strip()]
    assert commands == ["make demo", "make test"]


def _slug(heading: str) -> str:
    """The anchor GitHub gives a Markdown heading: lower case, punctuation dropped, spaces as hyphens."""
    import re

    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _anchors(md: Path) -> set[str]:
    import re

    text = re.sub(r"```.*?```", "", md.read_text(), flags=re.S)  # a '#' line in a code block is no heading
    return {_slug(m) for m in re.findall(r"^#{1,6} (.+)$", text, flags=re.M)}


def test_slug_matches_github():
    assert _slug("Multi30k en→de, 20 minutes of training on 2 CPU cores (machine A)") == \
        "multi30k-ende-20-minutes-of-training-on-2-cpu-cores-machine-a"
    assert _slug("GPU: one NVIDIA H200 (fourth session, 2026-11-23)") == "gpu-one-nvidia-h200-fourth-session-2026-11-23"


def test_docs_links_resolve():
    """Every relative .md link of the README and docs/ names a file that exists and, with #anchor, a heading of it."""
    import re

    for md in [ROOT / "README.md", ROOT / "CHANGELOG.md", *(ROOT / "docs").glob("*.md")]:
        for target, anchor in re.findall(r"\]\(([^)#:]*?\.md)?(?:#([^)]+))?\)", md.read_text()):
            path = md.parent / target if target else md
            if not target and not anchor:
                continue
            assert path.exists(), f"{md.name} links to missing {target}"
            if anchor:
                assert anchor in _anchors(path), f"{md.name} links to {target or md.name}#{anchor}, no such heading"


def test_code_and_bench_point_to_existing_results_anchors():
    """Docstrings, comments and bench scripts that cite docs/NAME.md#anchor name a heading that exists."""
    import re

    for path in [*(ROOT / "src").rglob("*.py"), *(ROOT / "bench").glob("*"), *(ROOT / "tests").glob("*.py")]:
        if not path.is_file():
            continue
        for name, anchor in re.findall(r"docs/([\w-]+\.md)#([\w-]+)", path.read_text(errors="replace")):
            if path.name == "test_docs.py" and name == "NAME.md":
                continue
            target = ROOT / "docs" / name
            assert target.exists(), f"{path.relative_to(ROOT)} cites missing docs/{name}"
            assert anchor in _anchors(target), f"{path.relative_to(ROOT)} cites docs/{name}#{anchor}, no such heading"


def test_pip_install_of_the_wheel_is_said_to_come_later():
    """The wheel is not published yet: a page that shows `pip install nmt-cli` also says how to install from a
    clone, and that the wheel comes once published (docs/cli.md, the --help texts, names the extras as published)."""
    import re

    as_written = {"cli.md", "changes-before-0.1.0.md"}  # (the log keeps its lines as they were written)
    for md in [ROOT / "README.md", *(p for p in (ROOT / "docs").glob("*.md") if p.name not in as_written)]:
        text = md.read_text()
        for line in text.splitlines():
            if re.search(r"pip install '?nmt-cli", line):
                flat = " ".join(text.split())
                assert "once the wheel is published" in flat and "clone" in flat, f"{md.name}: {line}"


def test_repository_paths_named_in_user_docs_exist():
    """A bench/, scripts/, tests/ or nmt_cli/ file that the README or a user page names exists (the history pages
    keep the paths of their time)."""
    import re

    as_written = {"changes-before-0.1.0.md", "results-history.md"}
    for md in [ROOT / "README.md", *(p for p in (ROOT / "docs").glob("*.md") if p.name not in as_written)]:
        for path in re.findall(r"(?<![\w/])((?:bench|scripts|tests|src/nmt_cli|nmt_cli)/[\w./-]+\.(?:py|sh))",
                               md.read_text()):
            if md.name == "serve.md" and path == "scripts/suggestions-to-jsonl.py":
                continue  # LibreTranslate's own script
            local = ROOT / ("src/" + path if path.startswith("nmt_cli/") else path)
            assert local.exists(), f"{md.name} names {path}, which does not exist"
