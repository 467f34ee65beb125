"""`nmt serve` soaked for a minute by bench/serve.py --soak (128 clients): no request failed or lost, resident
memory after the warm-up grows by less than 5%, and the server stops cleanly. The 10-minute soak's figures, with
latency, are in docs/results.md#reliability (a latency ratio depends on the machine's load, so it is reported,
not asserted)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import toy_pairs
from helpers_translate import make_checkpoint

pytest.importorskip("uvicorn", reason="the serve extra is not installed (pip install 'nmt-cli[serve]')")
ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_a_minute_under_128_clients_loses_nothing_and_keeps_its_memory(tmp_path, toy_tokenizer_bytes):
    ckpt = make_checkpoint(tmp_path / "tiny.pt", toy_tokenizer_bytes, seed=3, max_positions=128)
    (tmp_path / "in.en").write_text("".join(en + "\n" for en, _ in toy_pairs(500, seed=9)))
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "serve.py"), "--checkpoint", str(ckpt), "--soak",
                           "--minutes", "1", "--clients", "128", "--beam", "2", "--input", str(tmp_path / "in.en"),
                           "--json", str(tmp_path / "soak.json")], capture_output=True, text=True, timeout=400)
    assert done.returncode == 0, done.stderr[-3000:]
    figures = json.loads((tmp_path / "soak.json").read_text())
    assert figures["answered"] > 0 and figures["failed"] == 0 and figures["lost"] == 0, figures
    assert figures["rss_growth_pct"] < 5 and figures["server_exit"] == 0, figures
