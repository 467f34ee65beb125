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


def _shell_blocks(page: str) -> list[list[str]]:
    """The ```bash blocks of docs/PAGE, each as its commands: continuation lines joined, comments dropped."""
    blocks = re.findall(r"```bash\n(.*?)```", (ROOT / "docs" / page).read_text(), flags=re.S)
    out = []
    for block in blocks:
        joined = re.sub(r"\\\n\s*", "", block)
        out.append([line.split("  #")[0].strip() for line in joined.splitlines() if line.split("#")[0].strip()])
    return out


def test_getting_started_sample_commands_are_what_make_demo_runs():
    """docs/getting-started.md says `make demo` runs its four sample commands: scripts/demo.sh's nmt lines, with
    its defaults filled in, are those commands."""
    demo = (ROOT / "scripts" / "demo.sh").read_text()
    ran = [line.replace("$NMT", "nmt").replace('"$DIR', '"demo').replace('"$STEPS"', "1200").replace('"', "")
           for line in demo.splitlines() if line.startswith("$NMT ")]
    ran = [line.split(" | tee ")[0] for line in ran]  # the demo also keeps the score in a file
    assert "DEMO_STEPS ?= 1200" in (ROOT / "Makefile").read_text() and "${NMT_DEMO_STEPS:-1200}" in demo
    sample = next(b for b in _shell_blocks("getting-started.md") if b[0].startswith("nmt prepare sample"))
    assert [c.split("#")[0].strip() for c in sample] == ran


def _supply(work: Path) -> None:
    """The files the page expects a user to have, made from what the commands before wrote: a corpus of one's own
    and input.en/ref.de from the sample's raw text, a.pt/b.pt/model.pt and sysA.de/sysB.de from the run."""
    raw = work / "demo" / "data" / "raw"
    if raw.is_dir() and not (work / "corpus").exists():
        (work / "corpus").mkdir()
        for split in ("train", "valid", "test"):
            for lang in ("en", "de"):
                shutil.copy(raw / f"{split}.{lang}", work / "corpus" / f"{split}.{lang}")
        (work / "input.en").write_text("".join((raw / "test.en").read_text().splitlines(True)[:10]))
        (work / "ref.de").write_text("".join((raw / "test.de").read_text().splitlines(True)[:10]))
    last = work / "runs" / "mine" / "checkpoint_last.pt"
    if last.exists() and not (work / "model.pt").exists():
        for name in ("a.pt", "b.pt", "model.pt"):
            shutil.copy(last, work / name)
    if (work / "out.de").exists() and not (work / "sysA.de").exists():
        shutil.copy(work / "out.de", work / "sysA.de")
        shutil.copy(work / "ref.de", work / "sysB.de")


def test_getting_started_commands_run_as_written(tmp_path):
    """Every shell command of docs/getting-started.md after the install, in order, in one directory, with the step
    counts a test affords (--max-steps 1200 -> 12, --max-time 20 -> --max-steps 4): each exits 0."""
    blocks = _shell_blocks("getting-started.md")
    # (the install from a wheel is `make wheel-check`'s to run: CI builds and installs it)
    install, rest = blocks[0], [c for block in blocks[1:] if not block[0].startswith("pip ") for c in block]
    assert install[-1] == "nmt --help" and rest[0].startswith("nmt prepare sample")
    smaller = {"--max-steps 1200": "--max-steps 12", "--max-time 20": "--max-steps 4"}
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
           "HF_HUB_OFFLINE": "1"}
    for command in ["nmt --help", *rest]:
        for real, small in smaller.items():
            command = command.replace(real, small)
        _supply(tmp_path)
        r = subprocess.run(["bash", "-c", f"set -o pipefail; {command}"], cwd=tmp_path, env=env, capture_output=True,
                           text=True, stdin=subprocess.DEVNULL, timeout=600)
        assert r.returncode == 0, (command, r.stderr[-2000:])
    assert (tmp_path / "demo" / "run" / "averaged.pt").exists() and (tmp_path / "runs" / "mine" / "averaged.pt").exists()
