"""nmt average: the result is the element-wise mean, a normal checkpoint, and mismatches are refused."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from nmt_cli.checkpoints.averaging import average_checkpoints, fewer_message, last_checkpoints
from nmt_cli.checkpoints.format import Checkpoint, load, save
from nmt_cli.config import preset
from nmt_cli.errors import CheckpointError
from nmt_cli.model import Transformer

CONFIG = dict(vocab_size=64, d_model=32, d_ff=64, n_heads=4, encoder_layers=1, decoder_layers=1)


def run_nmt(*args):
    return subprocess.run([sys.executable, "-m", "nmt_cli.cli", *map(str, args)], capture_output=True, text=True,
                          timeout=120)


def write_run(run_dir, tokenizer: bytes, steps=(10, 20, 30), **overrides):
    """checkpoint_<step>.pt files with different random weights; returns their state dicts."""
    run_dir.mkdir(parents=True, exist_ok=True)
    config = preset("tiny", **{**CONFIG, **overrides})
    states = []
    for i, step in enumerate(steps):
        torch.manual_seed(i)
        state = Transformer(config).state_dict()
        save(Checkpoint(config, state, tokenizer, {"src": "en", "tgt": "de"}, None, {"step": step}),
             run_dir / f"checkpoint_{step}.pt")
        states.append(state)
    return states


def test_average_is_the_elementwise_mean(tmp_path, toy_tokenizer_bytes):
    states = write_run(tmp_path / "run", toy_tokenizer_bytes)
    avg = average_checkpoints([tmp_path / "run" / f"checkpoint_{s}.pt" for s in (10, 20, 30)])
    for k, v in avg.model_state.items():
        torch.testing.assert_close(v, (states[0][k] + states[1][k] + states[2][k]) / 3)
        assert v.dtype == states[0][k].dtype
    assert avg.train_state is None and avg.langs == {"src": "en", "tgt": "de"}
    assert avg.build_model().num_parameters() > 0  # a normal checkpoint that translate can load


def test_last_n_picks_the_newest_by_step(tmp_path, toy_tokenizer_bytes):
    write_run(tmp_path / "run", toy_tokenizer_bytes, steps=(9, 10, 100))
    assert [p.name for p in last_checkpoints(tmp_path / "run", 2)] == ["checkpoint_10.pt", "checkpoint_100.pt"]
    with pytest.raises(CheckpointError, match="no checkpoint_"):
        last_checkpoints(tmp_path, 2)


def test_mismatched_checkpoints_are_refused(tmp_path, toy_tokenizer_bytes):
    write_run(tmp_path / "a", toy_tokenizer_bytes, steps=(1,))
    write_run(tmp_path / "b", toy_tokenizer_bytes, steps=(2,), d_ff=128)
    with pytest.raises(CheckpointError, match="different model config"):
        average_checkpoints([tmp_path / "a" / "checkpoint_1.pt", tmp_path / "b" / "checkpoint_2.pt"])


def test_cli_average_last_n_and_files(tmp_path, toy_tokenizer_bytes):
    states = write_run(tmp_path / "run", toy_tokenizer_bytes)
    out = tmp_path / "avg.pt"
    r = run_nmt("average", "--last", "2", tmp_path / "run", "-o", out)
    assert r.returncode == 0, r.stderr
    for k, v in load(out).model_state.items():
        torch.testing.assert_close(v, (states[1][k] + states[2][k]) / 2)
    out2 = tmp_path / "avg2.pt"
    r = run_nmt("average", tmp_path / "run" / "checkpoint_10.pt", tmp_path / "run" / "checkpoint_30.pt", "-o", out2)
    assert r.returncode == 0, r.stderr
    for k, v in load(out2).model_state.items():
        torch.testing.assert_close(v, (states[0][k] + states[2][k]) / 2)


def test_cli_average_fewer_than_asked_averages_those_there_and_says_so(tmp_path, toy_tokenizer_bytes):
    """The one rule of nmt train, nmt average --last N and nmt translate --average-last N (see also
    test_translate.py and test_train.py)."""
    states = write_run(tmp_path / "run", toy_tokenizer_bytes)
    out = tmp_path / "avg.pt"
    r = run_nmt("average", "--last", "5", tmp_path / "run", "-o", out)
    assert r.returncode == 0, r.stderr
    notes = [ln for ln in r.stderr.splitlines() if ln.startswith("note:")]
    assert notes == ["note: " + fewer_message(tmp_path / "run", 3, 5)]
    for k, v in load(out).model_state.items():
        torch.testing.assert_close(v, (states[0][k] + states[1][k] + states[2][k]) / 3)


def test_cli_average_bad_input(tmp_path, toy_tokenizer_bytes):
    write_run(tmp_path / "run", toy_tokenizer_bytes)
    r = run_nmt("average", tmp_path / "run", "-o", tmp_path / "x.pt")  # a directory without --last
    assert r.returncode == 2 and "--last" in r.stderr
    r = run_nmt("average", tmp_path / "missing.pt", "-o", tmp_path / "x.pt")
    assert r.returncode == 1 and "missing.pt" in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "x.pt").exists()


def test_cli_average_onto_a_full_disk_is_one_line_and_leaves_nothing(tmp_path, toy_tokenizer_bytes):
    """The averaged checkpoint (~3 MB) onto a 1 MB filesystem: one line naming the file and the full disk, exit 1,
    no temporary file; the previous average, where there was one, kept whole."""
    from helpers_faults import leftovers, small_filesystem

    write_run(tmp_path / "run", toy_tokenizer_bytes, steps=(10, 20), d_model=128, d_ff=512)
    with small_filesystem(tmp_path / "small", "1m") as small:
        done = run_nmt("average", "--last", "2", tmp_path / "run", "-o", small / "avg.pt")
        assert done.returncode == 1, done.stderr
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and "avg.pt" in lines[0] and "No space left on device" in lines[0], done.stderr
        assert "Traceback" not in done.stderr and list(small.iterdir()) == [] and leftovers(small) == []
        (small / "avg.pt").write_bytes(b"previous")
        done = run_nmt("average", "--last", "2", tmp_path / "run", "-o", small / "avg.pt")
        assert done.returncode == 1 and "keeps its previous content" in done.stderr, done.stderr
        assert (small / "avg.pt").read_bytes() == b"previous" and leftovers(small) == []
