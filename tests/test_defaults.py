"""The search and batching defaults live in nmt_cli/runtime/defaults.py alone; the code and `--help` take them from there."""

import re
import subprocess
import sys
from pathlib import Path

from nmt_cli.decoding import SearchConfig
from nmt_cli.runtime import defaults
from nmt_cli.training.config import TrainConfig

SRC = Path(__file__).resolve().parents[1] / "src" / "nmt_cli"


def test_the_code_takes_the_defaults_from_defaults_py():
    s = SearchConfig()
    assert (s.beam, s.alpha, s.lp, s.stop, s.max_len_a, s.max_len_b) == (
        defaults.BEAM, defaults.LENPEN, defaults.LENPEN_FORM, defaults.STOP, defaults.MAX_LEN_A, defaults.MAX_LEN_B)
    assert TrainConfig("data", "run").valid_beam == defaults.BEAM


def test_help_shows_the_defaults():
    out = subprocess.run([sys.executable, "-m", "nmt_cli.cli", "translate", "--help"], capture_output=True, text=True,
                         check=True, env={"COLUMNS": "200", "PATH": ""}).stdout
    flat = " ".join(out.split())
    assert f"default: {defaults.max_tokens_help()}" in flat
    for option, value in (("--beam N", defaults.BEAM), ("--lenpen, --alpha ALPHA", defaults.LENPEN),
                          ("--max-len-b B", defaults.MAX_LEN_B)):
        assert re.search(re.escape(option) + r".*?\[default: " + re.escape(str(value)) + r"\]", flat), option


def test_no_other_module_writes_the_defaults():
    literal = re.compile(r"beam\w*\s*[=:]\s*4\b|num_beams=4|beam_size=4|\b6000\b|\b2000 on CPU")
    for path in SRC.rglob("*.py"):
        if path.name != "defaults.py":
            hits = [ln for ln in path.read_text().splitlines() if literal.search(ln)]
            assert not hits, f"{path.relative_to(SRC)} writes a default of defaults.py: {hits}"
