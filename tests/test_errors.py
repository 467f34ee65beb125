"""Every bad input of every command is one line on stderr naming what is wrong and what to do, with exit status
1 (an error) or 2 (a usage error), no library warning, and nothing lost (an existing output is left as it was).

The table runs the CLI in-process (`main(argv)`, seconds for all of it); a few rows run again as real processes,
where a warning printed while a library is first imported would show too.
"""

from __future__ import annotations

import io
import os
import pickle
import subprocess
import sys
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch

from conftest import write_toy_data_dir
from helpers_translate import make_checkpoint
from nmt_cli.cli import main


@dataclass
class Case:
    argv: str  # split on spaces; run in a directory holding the files of `workspace`
    status: int  # 1: error, 2: usage error
    words: tuple[str, ...]  # what the line must name
    stdin: bytes = b"the cat\n"
    keeps: tuple[str, ...] = ()  # files (or directories) the failed command must leave as they were
    needs: str | None = None  # an optional module the command needs (the export extra)
    env: dict[str, str] = field(default_factory=dict)


CASES = [
    # nmt
    Case("frobnicate", 2, ("frobnicate", "'nmt --help'")),
    Case("trian", 2, ("no such command 'trian'; did you mean 'train'?",)),
    Case("--bogus", 2, ("--bogus",)),
    # translate: input and output files
    Case("translate -m good.pt -i missing.txt", 1, ("missing.txt", "no such file")),
    Case("translate -m good.pt missing.txt", 1, ("missing.txt", "no such file")),
    Case("translate -m good.pt -i .", 1, ("directory",)),
    Case("translate -m good.pt --prefix missing.txt", 1, ("prefix file missing.txt", "no such file")),
    Case("translate -m good.pt -o nodir/out.txt", 1, ("nodir/out.txt", "cannot write")),
    Case("translate -m good.pt in.txt -i in.txt", 2, ("INPUT", "-i", "not both")),
    # translate: checkpoints
    Case("translate -m missing.pt -o keep.txt", 1, ("missing.pt", "no such checkpoint"), keeps=("keep.txt",)),
    Case("translate -m random.pt -o keep.txt", 1, ("random.pt", "not a PyTorch checkpoint"), keeps=("keep.txt",)),
    Case("translate -m raw.pkl", 1, ("raw.pkl", "plain Python pickle")),
    Case("translate -m evil.pt", 1, ("evil.pt", "system object", "could run code")),
    Case("translate -m truncated.pt", 1, ("truncated.pt", "truncated")),
    Case("translate -m other.pt", 1, ("other.pt", "not an nmt checkpoint")),
    Case("translate -m data", 1, ("data", "directory")),
    # translate: options
    Case("translate", 2, ("missing option", "-m / --model CKPT", "'nmt translate --help'")),
    Case("translate -m good.pt --beam notanumber", 2, ("--beam",)),
    Case("translate -m good.pt --beam 2 --nbest 3", 2, ("--nbest 3", "--beam 2")),
    Case("translate -m good.pt --precision fp8", 2, ("--precision", "fp8")),
    Case("translate -m good.pt --device cuda --precision fp16", 1, ("cuda",))
    if not torch.cuda.is_available() else Case("translate -m good.pt --precision fp16 --device cpu", 1, ("fp16",)),
    # score
    Case("score -r missing.txt", 1, ("reference missing.txt", "no such file")),
    Case("score missing.txt -r ref.txt", 1, ("hypothesis missing.txt", "no such file")),
    Case("score latin1.txt -r ref.txt", 1, ("latin1.txt", "line 1", "not UTF-8")),
    Case("score in.txt -r ref.txt", 1, ("in.txt has 1 line", "ref.txt has 2")),
    Case("score in.txt", 2, ("no reference", "-r REF")),
    Case("score in.txt -r ref.txt -t wmt14", 2, ("-r", "-t", "not both")),
    Case("score in.txt -r ref.txt --metrics rouge", 2, ("--metrics", "rouge")),
    Case("score -r", 2, ("-r", "'nmt score --help'")),
    # average
    Case("average good.pt good.pt", 2, ("missing option", "-o / --output FILE")),
    Case("average random.pt good.pt -o keep.pt", 1, ("random.pt", "not a PyTorch checkpoint"), keeps=("keep.pt",)),
    Case("average good.pt -o good.pt", 2, ("good.pt", "one of the inputs"), keeps=("good.pt",)),
    Case("average data -o x.pt", 2, ("--last N",)),
    Case("average --last 5 missing -o x.pt", 1, ("missing", "not a directory")),
    # train
    Case("train", 2, ("missing argument DATA_DIR",)),
    Case("train data", 2, ("missing option", "-o / --output RUN_DIR")),
    Case("train nodata -o run", 1, ("nodata does not exist", "did you mean data?")),  # a typo: the directory beside
    Case("train elsewhere/data -o run", 1, ("elsewhere/data does not exist", "nmt prepare sample -o elsewhere/data")),
    Case("train ./xyz -o run", 1, ("xyz does not exist", "prepared data beside it: data")),
    Case("train in.txt -o run", 1, ("in.txt is a file", "nmt prepare")),
    Case("train data -o run --preset huge", 2, ("--preset", "huge", "tiny")),
    Case("train data -o run --update-freq 0", 2, ("--update-freq",)),
    # prepare
    Case("prepare", 2, ("missing argument NAME", "--list")),
    Case("prepare sample", 2, ("missing option -o OUT_DIR",)),
    Case("prepare wmt99 -o x", 1, ("wmt99", "--list")),
    Case("prepare custom --src-lang en --tgt-lang de --train nope --valid nope -o x", 1, ("nope.en", "--train")),
    Case("prepare sample -o x --errors sometimes", 2, ("--errors", "sometimes")),
    Case("prepare sample -o in.txt/data", 1, ("in.txt/data", "writable directory"), keeps=("in.txt",)),
    Case("translate -m good.pt -o .", 1, ("cannot write .",)),
    # export
    Case("export ctranslate2", 2, ("missing argument CKPT", "'nmt export ctranslate2 --help'")),
    Case("export ctranslate2 random.pt -o keepdir", 1, ("random.pt", "not a PyTorch checkpoint"),
         keeps=("keepdir",), needs="ctranslate2"),
    Case("export ctranslate2 good.pt -o ct2 -q int3", 2, ("--quantization", "int3")),
    Case("export huggingface good.pt -o hf --scores missing.json", 1, ("--scores missing.json", "no such file"),
         needs="transformers"),
    Case("export huggingface good.pt -o hf --scores in.txt", 1, ("--scores in.txt", "not JSON"),
         needs="transformers"),
    Case("export frobnicate", 2, ("frobnicate", "'nmt export --help'")),
    # push
    Case("push good.pt bad/repo/id --dry-run staged", 1, ("bad/repo/id", "ORG/NAME")),
    Case("push good.pt org/name --quantization int8", 2, ("--quantization", "--ctranslate2")),
    Case("push missing.pt org/name --dry-run staged", 1, ("missing.pt", "no such checkpoint")),
    Case("push good.pt org/name", 1, ("token", "HF_TOKEN")),
]


class _Evil:
    def __reduce__(self):
        return (os.system, ("echo pwned > /dev/null",))


@pytest.fixture(scope="module")
def workspace(tmp_path_factory, toy_tokenizer_bytes) -> Path:
    """good.pt, data/ and every kind of bad file the table names."""
    ws = tmp_path_factory.mktemp("ws")
    good = make_checkpoint(ws / "good.pt", toy_tokenizer_bytes).read_bytes()
    write_toy_data_dir(ws / "data", toy_tokenizer_bytes)
    (ws / "random.pt").write_bytes(bytes(range(1, 128)) * 32)
    (ws / "raw.pkl").write_bytes(pickle.dumps({"weights": [1.0, 2.0]}, protocol=4))
    torch.save({"format": "nmt-checkpoint", "version": 1, "payload": _Evil()}, ws / "evil.pt")
    (ws / "truncated.pt").write_bytes(good[: len(good) // 2])
    torch.save({"state_dict": {}}, ws / "other.pt")
    (ws / "in.txt").write_text("the cat\n")
    (ws / "ref.txt").write_text("die Katze\nder Hund\n")
    (ws / "latin1.txt").write_bytes("Größe\n".encode("latin-1"))
    (ws / "keep.txt").write_text("an earlier translation\n")
    (ws / "keep.pt").write_bytes(b"an earlier average")
    (ws / "keepdir").mkdir()
    (ws / "keepdir" / "model.bin").write_bytes(b"an earlier export")
    return ws


def _snapshot(path: Path) -> dict[str, bytes]:
    if path.is_dir():
        return {str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}
    return {"": path.read_bytes()}


def _run_in_process(case: Case, monkeypatch, capsys) -> tuple[int, str, str, list[str]]:
    """(exit status, stdout, stderr, warnings as Python would print them by default)."""
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(case.stdin), encoding="utf-8"))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for hidden in (DeprecationWarning, PendingDeprecationWarning, ImportWarning, ResourceWarning):
            warnings.simplefilter("ignore", hidden)  # hidden by default outside __main__
        with pytest.raises(SystemExit) as exc:
            main(case.argv.split())
    out, err = capsys.readouterr()
    return exc.value.code, out, err, [f"{w.category.__name__}: {w.message}" for w in caught]


@pytest.mark.parametrize("case", CASES, ids=[c.argv for c in CASES])
def test_bad_input_is_one_line_with_its_exit_status(case, workspace, monkeypatch, capsys, tmp_path):
    if case.needs:
        pytest.importorskip(case.needs)
    monkeypatch.chdir(workspace)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))  # no stored token
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    for key, value in case.env.items():
        monkeypatch.setenv(key, value)
    before = {name: _snapshot(workspace / name) for name in case.keeps}
    status, out, err, warned = _run_in_process(case, monkeypatch, capsys)
    assert status == case.status, err
    assert err.count("\n") == 1 and err.startswith("error: "), err
    hint = "(use --debug for the traceback)" if status == 1 else "--help')"
    assert err.rstrip().endswith(hint), err
    for word in case.words:
        assert word in err, (word, err)
    assert out == "" and warned == [], (out, warned)
    assert {name: _snapshot(workspace / name) for name in case.keeps} == before


@pytest.mark.parametrize("argv", ["translate -m raw.pkl", "translate -m good.pt -i missing.txt",
                                  "score -r missing.txt", "export ctranslate2 random.pt -o ct2"])
def test_bad_input_as_a_real_process_prints_one_line(argv, workspace, tmp_path):
    """A real process: stderr holds the error line and nothing else (no warning printed on import or load)."""
    if argv.startswith("export"):
        pytest.importorskip("ctranslate2")
    r = subprocess.run([sys.executable, "-m", "nmt_cli.cli", *argv.split()], input=b"the cat\n",
                       capture_output=True, cwd=workspace, timeout=120)
    assert r.returncode == 1 and r.stdout == b""
    assert r.stderr.count(b"\n") == 1 and r.stderr.startswith(b"error: "), r.stderr.decode()
