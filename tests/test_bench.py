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
    users = {"translate.py", "train.py", "prepare.py", "serve.py", "serve_vs_libretranslate.py", "faults.py",
             "multi30k.sh", "multilingual.sh"}
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


SLOT_TABLES_OFF = """
import sys, torch
sys.path.insert(0, "bench/tools")
import mechanisms
from nmt_cli.config import preset
from nmt_cli.decoding import SearchConfig, decode_batches
from nmt_cli.model import Transformer
torch.manual_seed(0)
model = Transformer(preset("tiny", vocab_size=40, d_model=32, d_ff=64, n_heads=4, dropout=0.0)).eval()
src = torch.randint(4, 40, (10, 9))
src[::3, 6:] = 0  # padding
mask = src == 0
batches = [(src[:6], mask[:6]), (src[6:], mask[6:])]
cfg = SearchConfig(beam=4, nbest=4, max_len_a=1.0, max_len_b=12)
before = decode_batches(model, batches, cfg)
mechanisms.turn_off("slot-tables")
after = decode_batches(model, batches, cfg)
for b, a in zip(sum(before, []), sum(after, []), strict=True):
    assert [h.tokens for h in b] == [h.tokens for h in a], (b, a)
    assert all(abs(x.score - y.score) < 1e-4 for x, y in zip(b, a, strict=True))
print("same")
"""


def test_the_cache_without_slot_tables_decodes_the_same():
    """`bench/tools/mechanisms.py --off slot-tables` (the alternative the slot tables are timed against in
    docs/results.md) gives the engine's hypotheses: the figure compares two ways to one answer."""
    r = subprocess.run([sys.executable, "-c", SLOT_TABLES_OFF], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert r.returncode == 0 and r.stdout.strip() == "same", r.stderr[-2000:]
