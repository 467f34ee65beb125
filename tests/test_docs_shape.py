"""The shape of the user pages: docs/results.md holds current figures only (short, every table naming the
machine, date and command of each row), and no user page speaks of the work's own process."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "docs" / "results.md"
ORDINAL = "first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth|eleventh|previous|next|later|earlier"
PROCESS = re.compile(rf"\b(this|that|the|each|a|an|helper|{ORDINAL}) sessions?\b|\bsession's\b|\bissue #?\d+|"
                     r"\bthe issue\b", re.I)


def _tables(text: str) -> list[tuple[str, list[str]]]:
    """(section heading, header cells) of every Markdown table."""
    out, section, lines = [], "", text.splitlines()
    for i, line in enumerate(lines):
        if line.startswith("## "):
            section = line[3:]
        if line.startswith("|") and i + 1 < len(lines) and re.match(r"^\|(\s*:?-+:?\s*\|)+$", lines[i + 1]):
            out.append((section, [c.strip().lower() for c in line.strip("|").split("|")]))
    return out


def test_results_page_is_short():
    assert len(RESULTS.read_text().splitlines()) <= 200


def test_every_results_table_names_machine_date_and_command():
    tables = [(s, h) for s, h in _tables(RESULTS.read_text()) if s]  # the machines table comes before any section
    assert len(tables) >= 8
    for section, header in tables:
        for column in ("machine", "date", "command"):
            assert column in header, f"results.md, {section}: the table has no '{column}' column ({header})"


def test_every_results_row_fills_machine_and_date():
    text = RESULTS.read_text().splitlines()
    for i, line in enumerate(text):
        if line.startswith("|") and i + 1 < len(text) and re.match(r"^\|(\s*-+\s*\|)+$", text[i + 1]):
            header = [c.strip().lower() for c in line.strip("|").split("|")]
            if "date" not in header:
                continue
            for row in text[i + 2:]:
                if not row.startswith("|"):
                    break
                cells = [c.strip() for c in row.strip("|").split("|")]
                assert re.fullmatch(r"20\d\d-\d\d-\d\d", cells[header.index("date")]), row
                assert cells[header.index("machine")] and cells[header.index("command")], row


def test_no_user_page_speaks_of_the_work_itself():
    """results-history.md and changes-before-0.1.0.md are logs (sessions, issues); the other pages are for users."""
    logs = {"results-history.md", "changes-before-0.1.0.md"}
    pages = [ROOT / "README.md", *(p for p in (ROOT / "docs").glob("*.md") if p.name not in logs)]
    for page in pages:
        for n, line in enumerate(page.read_text().splitlines(), 1):
            prose = re.sub(r"\]\([^)]*\)", "]", line)  # link targets name history's headings
            assert not PROCESS.search(prose), f"{page.name}:{n}: {line}"
