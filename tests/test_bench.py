"""bench/ holds the benchmarks users rerun, each answering --help; probes and GPU-run scripts live in bench/tools/.
Neither names the work items that made them, and both import nmt from src/ (no copies)."""

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = sorted(p for p in [*(ROOT / "bench").glob("*.py"), *(ROOT / "bench" / "tools").glob("*.py")]
                 if "__main__" in p.read_text())


def test_bench_holds_what_users_rerun():
    names = {p.name for p in (ROOT / "bench").iterdir() if p.is_file()}
    users = {"translate.py", "train.py", "prepare.py", "serve.py", "faults.py", "multi30k.sh",
             "multilingual.sh"}
    assert users <= names
    helpers = {"fairseq_gen.py", "hf_marian.py", "wmt_synth.py"}  # the other engines' runners, prepare.py's data
    assert names - helpers == users


@pytest.mark.parametrize("script", SCRIPTS, ids=[str(p.relative_to(ROOT)) for p in SCRIPTS])
def test_every_bench_script_parses_its_options_with_argparse(script):
    tree = ast.parse(script.read_text())
    calls = {n.func.attr for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)}
    assert "ArgumentParser" in calls and "parse_args" in calls, script


@pytest.mark.parametrize("script", [p for p in SCRIPTS if p.parent.name == "bench"],
                         ids=[p.name for p in SCRIPTS if p.parent.name == "bench"])
def test_the_user_benchmarks_answer_help(script):
    r = subprocess.run([sys.executable, str(script), "--help"], capture_output=True, text=True, timeout=120,
                       cwd=ROOT)
    assert r.returncode == 0 and "usage:" in r.stdout, r.stderr[-1000:]


def test_bench_names_no_work_items():
    for path in [*(ROOT / "bench").glob("*"), *(ROOT / "bench" / "tools").glob("*")]:
        if path.is_file():
            text = path.read_text()
            assert not re.search(r"\bissue \d|\(the issue\)|\.carry/before|\bsession\b", text, flags=re.I), path
