"""The shell examples of docs/*.md that need no download and no long training, run as written.

Each example is listed here with the page it comes from; the test fails when a page no longer holds the line
verbatim (change both together) or when the command fails. They run in one temporary directory laid out as the
examples expect: `model.pt`, `a.pt`, `b.pt` and the run directories `runs/base` and `runs/mine` hold tiny random
checkpoints (tests/helpers_translate.py), `input.en` a few sentences, `ref.de`, `hyp.de`... German lines.
Examples that download (`hf:`, `wmt14-*`) or train for minutes are not listed.
"""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from helpers_translate import make_checkpoint

ROOT = Path(__file__).resolve().parents[1]

EXAMPLES = [
    ("getting-started.md", "nmt --help"),
    ("prepare.md", "nmt prepare --list"),
    ("prepare.md", "nmt prepare sample -o data/sample"),
    ("getting-started.md", "nmt translate -m runs/mine --average-last 5 -i input.en -o out.de"),
    ("getting-started.md", "nmt translate -m a.pt -m b.pt < input.en > out.de"),
    ("getting-started.md", "cat input.en | nmt translate -m runs/mine/averaged.pt > out.de"),
    ("translate.md", "cat input.en | nmt translate -m runs/base/checkpoint_best.pt > out.de"),
    ("translate.md", "nmt translate input.en -o out.de -m a.pt -m b.pt"),
    ("translate.md", "nmt translate -m runs/base --average-last 5 < input.en"),
    ("translate.md", "nmt translate -m model.pt --nbest 4 < input.en > nbest.tsv"),
    ("translate.md", "nmt translate -m model.pt --precision bf16 --threads 2 < input.en"),
    ("cli.md", "nmt average --last 5 runs/base -o runs/base/averaged.pt"),
    ("train.md", "nmt train --print-config --preset big > big.yaml"),
    ("getting-started.md", "nmt score out.de -r ref.de --metrics bleu,chrf,ter"),
    ("score.md", "nmt score -r ref.de < hyp.de"),
    ("score.md", "nmt score hyp.de -r ref.de"),
    ("score.md", "nmt score hyp.de -r ref1.de -r ref2.de"),
    ("score.md", "nmt score hyp.de -r ref.de --tok-bleu"),
    ("score.md", "nmt score -r ref.de sysA.de sysB.de --paired-bs"),
    ("score.md", "nmt score hyp.de -r ref.de --json"),
    ("score.md", 'nmt score hyp.de -r ref.de --metrics "bleu chrf ter"'),
    ("score.md", "nmt score hyp.de -r ref.de --metrics bleu --metrics chrf --metrics ter"),
    ("score.md", "nmt score hyp.de -r ref.de --metrics bleu chrf ter"),
]

GERMAN = ["Ein Mann fährt Fahrrad.", "Zwei Hunde spielen im Schnee.", "Eine Frau liest ein Buch im Park.",
          "Kinder laufen am Strand.", "Der alte Mann trägt einen Hut."]


@pytest.fixture(scope="module")
def workspace(tmp_path_factory, toy_tokenizer_bytes) -> Path:
    work = tmp_path_factory.mktemp("examples")
    make_checkpoint(work / "model.pt", toy_tokenizer_bytes)
    make_checkpoint(work / "a.pt", toy_tokenizer_bytes, seed=1)
    make_checkpoint(work / "b.pt", toy_tokenizer_bytes, seed=2)
    for run in ("base", "mine"):
        for step in range(1, 6):
            make_checkpoint(work / "runs" / run / f"checkpoint_{step}.pt", toy_tokenizer_bytes, seed=step)
        shutil.copy(work / "model.pt", work / "runs" / run / "checkpoint_best.pt")
        shutil.copy(work / "model.pt", work / "runs" / run / "averaged.pt")
    (work / "input.en").write_text("the cat sat\na dog ran home\n\nold man\n")
    for name, lines in {"ref.de": GERMAN, "ref1.de": GERMAN, "ref2.de": GERMAN[::-1], "hyp.de": GERMAN[:3] + GERMAN[:2],
                        "sysA.de": GERMAN, "sysB.de": GERMAN[1:] + GERMAN[:1]}.items():
        (work / name).write_text("\n".join(lines) + "\n")
    return work


def test_every_listed_example_is_in_its_page():
    for page, command in EXAMPLES:
        assert command in (ROOT / "docs" / page).read_text(), f"docs/{page} no longer shows: {command}"


@pytest.mark.parametrize("page,command", EXAMPLES, ids=[c for _, c in EXAMPLES])
def test_example_runs(workspace, page, command):
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
           "HF_HUB_OFFLINE": "1"}
    if command.startswith("nmt score out.de"):  # needs the output of a translate example
        (workspace / "out.de").write_text("\n".join(GERMAN) + "\n")
    done = subprocess.run(["bash", "-c", f"set -o pipefail; {command}"], cwd=workspace, env=env, capture_output=True,
                          text=True, stdin=subprocess.DEVNULL, timeout=300)
    assert done.returncode == 0, f"docs/{page}: `{command}` failed:\n{done.stderr[-2000:]}"
    out = re.sub(r"\s+", " ", done.stdout + done.stderr)
    assert "Traceback" not in out


def test_the_readme_quick_start_runs_on_the_sample_corpus(tmp_path):
    """The README's four commands as written, on the sample corpus instead of WMT14 and with the tiny preset for a
    short run instead of base: prepare, train (which writes averaged.pt by default), translate it, score."""
    readme = (ROOT / "README.md").read_text()
    block = readme.split("```bash\n")[2].split("```")[0]  # the quick start (the first block is make demo/test)
    commands = [line.split("  #")[0].strip() for line in block.splitlines() if line.strip()]
    assert [c.split()[:2] for c in commands] == [["nmt", "prepare"], ["nmt", "train"], ["cat", "input.en"],
                                                  ["nmt", "score"]], commands
    smaller = {"wmt14-en-de": "sample", "--preset base": "--preset tiny --max-steps 40"}
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
           "HF_HUB_OFFLINE": "1"}
    for command in commands:
        for real, small in smaller.items():
            command = command.replace(real, small)
        if command.startswith("cat input.en"):  # the sample's test split, as input and reference
            raw = next((tmp_path / "data").iterdir()) / "raw"
            shutil.copy(raw / "test.en", tmp_path / "input.en")
            shutil.copy(raw / "test.de", tmp_path / "ref.de")
        r = subprocess.run(["bash", "-c", command], cwd=tmp_path, env=env, capture_output=True, text=True,
                           timeout=600)
        assert r.returncode == 0, (command, r.stderr[-2000:])
    assert "BLEU" in r.stdout and len((tmp_path / "out.de").read_text().splitlines()) == \
        len((tmp_path / "input.en").read_text().splitlines())
