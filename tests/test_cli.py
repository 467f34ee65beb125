"""The CLI skeleton: help, version, error mapping, exit codes, and the import-direction rule."""

import ast
import subprocess
import sys
from pathlib import Path

import nmt_cli

PKG = Path(nmt_cli.__file__).parent


def run_nmt(*args, input=None):
    return subprocess.run([sys.executable, "-m", "nmt_cli.cli", *args], capture_output=True, text=True,
                          input=input, timeout=120)


def test_help_lists_every_subcommand():
    r = run_nmt("--help")
    assert r.returncode == 0
    for cmd in ("prepare", "train", "average", "translate", "score", "export", "push"):
        assert cmd in r.stdout
    for cmd in ("prepare", "train", "average", "translate", "score", "push", "export ctranslate2", "export huggingface"):
        sub = run_nmt(*cmd.split(), "--help")
        assert sub.returncode == 0, sub.stderr
        assert "Usage" in sub.stdout


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


def test_bad_option_value_exits_2_with_usage():
    r = run_nmt("translate", "--beam", "notanumber")
    assert r.returncode == 2
    assert "Usage" in r.stderr or "Usage" in r.stdout


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
