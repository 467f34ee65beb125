"""nmt train: the loss drops, accumulation is exact, resume is exact, checkpoints are safe, bad input is refused."""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import signal
import subprocess
import sys
import threading
import time

import pytest
import torch

from helpers_train import cli_args as _cli_args
from helpers_train import poison_loss, torchrun
from nmt_cli.checkpoints.averaging import fewer_message, periodic_checkpoints
from nmt_cli.checkpoints.format import load
from nmt_cli.data.store import collate
from nmt_cli.errors import CheckpointError, ConfigError, DataError, DeviceError, TrainingError
from nmt_cli.runtime import cpus
from nmt_cli.training import plan as plan_mod
from nmt_cli.training.checkpoint_manager import prune_periodic
from nmt_cli.training.config import (
    MIN_SAVE_EVERY,
    MIN_VALID_EVERY,
    TrainConfig,
    resolve_averaging,
    resolve_batching,
    resolve_keep_last,
    resolve_save_every,
    resolve_save_minutes,
    resolve_valid_every,
    resolve_valid_minutes,
)
from nmt_cli.training.distributed.process import FP16_INIT_SCALE, Runtime
from nmt_cli.training.distributed.world import Launch
from nmt_cli.training.launch import train
from nmt_cli.training.loop import Trainer
from nmt_cli.training.plan import plan_run, write_run_config
from nmt_cli.training.reader import Update
from nmt_cli.training.schedule import inverse_sqrt_lr, peak_lr

SMALL = {"d_model": 32, "d_ff": 64, "n_heads": 4, "encoder_layers": 1, "decoder_layers": 1}


def small_cfg(data_dir, out_dir, **kw) -> TrainConfig:
    base = dict(preset="tiny", model=dict(SMALL), max_tokens=256, update_freq=1, warmup=10, lr=3e-3,
                precision="fp32", threads=1, log_every=5)
    base.update(kw)
    return TrainConfig(str(data_dir), str(out_dir), **base)


def run_nmt(*args, **kw):
    return subprocess.run([sys.executable, "-m", "nmt_cli.cli", *map(str, args)], capture_output=True, text=True,
                          timeout=120, **kw)


# ---- schedule and batching ------------------------------------------------------------------------------------

def test_schedule_is_the_papers_formula():
    d, w = 512, 4000
    assert inverse_sqrt_lr(w, d, w) == pytest.approx(d**-0.5 * w**-0.5)
    assert inverse_sqrt_lr(100, d, w) == pytest.approx(d**-0.5 * 100 * w**-1.5)
    assert inverse_sqrt_lr(16000, d, w) == pytest.approx(d**-0.5 * 16000**-0.5)
    lrs = [inverse_sqrt_lr(s, d, w) for s in range(1, 10000, 50)]
    top = lrs.index(max(lrs))
    assert all(a < b for a, b in zip(lrs[:top], lrs[1 : top + 1], strict=True))  # rises during warmup
    assert all(a > b for a, b in zip(lrs[top + 1 :], lrs[top + 2 :], strict=False))  # then decays
    assert peak_lr(d, w, peak=1e-3) == pytest.approx(1e-3)
    assert inverse_sqrt_lr(4 * w, d, w, peak=1e-3) == pytest.approx(5e-4)


def test_update_freq_auto_reaches_the_update_size(tmp_path):
    cfg = TrainConfig("d", "o", preset="base", max_tokens=3125)
    assert resolve_batching(cfg, 1, "cuda").update_freq == 8  # one GPU reproduces the 8-GPU batch
    assert resolve_batching(cfg, 8, "cuda").update_freq == 1
    default = resolve_batching(TrainConfig("d", "o", preset="base"), 1, "cuda")
    assert (default.max_tokens, default.update_freq) == (25000, 1)
    cpu = resolve_batching(TrainConfig("d", "o", preset="base"), 1, "cpu")
    assert cpu.max_tokens_per_update >= 24000 and cpu.max_tokens <= 8192
    fixed = resolve_batching(TrainConfig("d", "o", preset="base", max_tokens=1000, update_freq=3), 2, "cpu")
    assert fixed.max_tokens_per_update == 6000


def test_the_default_gpu_micro_batch_fits_the_gpu_and_keeps_the_update_size():
    from nmt_cli.config import preset
    from nmt_cli.training.config import train_memory_bytes

    # the estimate against the peaks measured on an H200 (bf16): base 2.2 / 11.6 GiB, big 4.9 / 19.2 GiB
    for name, tokens, gib in (("base", 3125, 2.2), ("base", 25000, 11.6), ("big", 3125, 4.9), ("big", 25000, 19.2)):
        assert train_memory_bytes(preset(name), tokens) / 2**30 == pytest.approx(gib, rel=0.07)
    big, base = TrainConfig("d", "o", preset="big"), TrainConfig("d", "o", preset="base")

    def plan(cfg, gpus, memory_gb, precision="bf16"):
        b = resolve_batching(cfg, gpus, "cuda", preset(cfg.preset), int(memory_gb * 1e9), precision)
        return b.max_tokens, b.update_freq

    assert plan(big, 1, 141) == (25000, 1)  # an H200 takes the whole update at once
    assert plan(big, 1, 24) == (12500, 2)  # a 24 GB GPU accumulates two halves: same update size
    assert plan(base, 1, 16, "fp16") == (12500, 2)
    assert plan(big, 8, 16, "fp16") == (3125, 1)  # 8 GPUs: the paper's 3125 tokens each
    pinned = TrainConfig("d", "o", preset="big", max_tokens=25000)  # an explicit --max-tokens is kept
    assert resolve_batching(pinned, 1, "cuda", preset("big"), int(16e9)).max_tokens == 25000


def test_presets_save_by_updates_as_the_paper_and_average_its_last_checkpoints():
    """base/big: a checkpoint every ~1,400 / 600 updates (the paper's 10 minutes at its speed), the last 5 / 20
    averaged; a shorter run saves often enough to average its N over at most its last quarter, but never more
    often than every MIN_SAVE_EVERY updates: a run too short for that averages fewer, saying why; time only on
    request (or with --max-time, max-time / (4 x N), at least 30 s); validation at the checkpoints by updates, at
    least MIN_VALID_EVERY apart, and, in a run that saves by time, every 5 minutes at most."""
    def saving(**kw):
        cfg = TrainConfig("d", "o", **kw)
        max_steps = cfg.max_steps or cfg.recipe("max_steps")
        every, minutes = resolve_save_every(cfg, max_steps), resolve_save_minutes(cfg)
        average, why = resolve_averaging(cfg, max_steps, every, minutes)
        return every, average, minutes, why

    def validating(**kw):
        cfg = TrainConfig("d", "o", **kw)
        every = resolve_save_every(cfg, cfg.max_steps or cfg.recipe("max_steps"))
        return resolve_valid_every(cfg, every), resolve_valid_minutes(cfg, resolve_save_minutes(cfg))

    assert saving(preset="base") == (1400, 5, None, None)
    assert saving(preset="big") == (600, 20, None, None)
    assert saving(preset="tiny") == (1000, 5, None, None)
    assert saving(preset="tiny", max_steps=1200) == (60, 5, None, None)  # the demo's: the last 5 of 20
    assert saving(preset="big", max_steps=8000) == (100, 20, None, None)
    assert saving(preset="base", max_steps=1000)[:2] == (MIN_SAVE_EVERY, 5)  # 1000 / 20 = 50: just enough
    every, average, _, why = saving(preset="base", max_steps=500)  # 500 / 20 = 25: fewer in its last 125 updates
    assert (every, average) == (MIN_SAVE_EVERY, 3) and why.startswith("a run of 500 updates averages its last 3")
    every, average, _, why = saving(preset="base", max_steps=30)  # once saved every update
    assert (every, average) == (MIN_SAVE_EVERY, 1) and "too short to average" in why and "final weights" in why
    assert saving(preset="base", max_steps=10, save_every=1) == (1, 5, None, None)  # as asked, however often
    assert saving(preset="base", save_every=7, average_last=3) == (7, 3, None, None)
    assert saving(preset="base", average=False)[1] == 0
    assert saving(preset="base", max_time=20)[1:3] == (5, 1.0)
    assert saving(preset="big", max_time=160)[1:3] == (20, 2.0)  # 20 averaged: 80 saves
    assert saving(preset="base", max_time=5)[1:3] == (3, 0.5)  # the floor: 3 fit in its last 1.25 minutes
    assert saving(preset="base", max_time=4.5, save_every_minutes=0.01)[1:3] == (5, 0.01)
    assert MIN_VALID_EVERY == 200
    assert validating(preset="tiny", max_steps=1200) == (240, None)  # the demo: at every 4th checkpoint
    assert validating(preset="base", max_steps=30) == (200, None)
    assert validating(preset="base") == (1400, None)
    assert validating(preset="base", save_every=7) == (203, None)
    assert validating(preset="base", max_steps=30, valid_every=10) == (10, None)
    assert validating(preset="base", max_time=20) == (1400, 5.0)  # saves every minute, validates every 5
    assert validating(preset="base", max_time=20, save_every_minutes=0.5, valid_every=200) == (200, 5.0)
    assert validating(preset="base", max_time=300) == (1400, 10.0)  # saves every 10 minutes: validates with them
    assert validating(preset="base", max_time=20, valid_every_minutes=0.5) == (1400, 0.5)
    assert resolve_keep_last(TrainConfig("d", "o", preset="big")) == 20


def _counts(run) -> tuple[list, list]:
    """The updates metrics.jsonl records a validation and a checkpoint_<step>.pt save at."""
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return ([r["step"] for r in records if r["kind"] == "valid"],
            [r["step"] for r in records if r["kind"] == "save" and r["periodic"]])


@pytest.mark.parametrize(("max_steps", "valids", "saves", "averaged"), [
    (30, [30], [30], [30]),  # once saved and validated at every update; too short to average: the final weights
    (120, [120], [50, 100, 120], [120]),
    (450, [200, 400, 450], [50 * k for k in range(1, 10)] + [450], [350, 400, 450]),  # 3 fit in its last quarter
])
def test_a_short_run_saves_and_validates_at_the_floors_and_averages_what_fits(toy_data_dir, tmp_path, max_steps,
                                                                              valids, saves, averaged):
    """A run shorter than the preset's saves every MIN_SAVE_EVERY updates at most and validates every
    MIN_VALID_EVERY at most, each once more at the end, and averages the checkpoints of its last quarter;
    metrics.jsonl and the end summary count and time them."""
    assert (MIN_SAVE_EVERY, MIN_VALID_EVERY) == (50, 200)
    saves = sorted(set(saves))
    run = tmp_path / "run"
    events = []
    result = train(small_cfg(toy_data_dir, run, max_steps=max_steps, log_every=50, keep_last=10),
                   progress=events.append)
    assert _counts(run) == (valids, saves)
    assert load(run / "averaged.pt").meta["averaged_from"] == [str(run / f"checkpoint_{k}.pt") for k in averaged]
    assert (result.validations, result.saves) == (len(valids), len(saves))
    end = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()][-1]
    assert end["kind"] == "end" and (end["validations"], end["saves"]) == (len(valids), len(saves))
    assert 0 < end["valid_seconds"] < end["elapsed"] and 0 < end["save_seconds"] < end["elapsed"]
    start = events[0]
    assert (start["save_every"], start["valid_every"], start["average_last"]) == (50, 200, len(averaged))
    assert (start["average_note"] is None) == (len(averaged) == 5)


def test_validation_keeps_its_own_schedule(toy_data_dir, tmp_path, monkeypatch):
    """--valid-every apart from --save-every: each on its own updates, both at the end; a checkpoint records the
    validation figures of its own update only; --patience counts validations (not saves)."""
    run = tmp_path / "run"
    r = run_nmt(*_cli_args(toy_data_dir, run, "--max-steps", "13", "--save-every", "4", "--valid-every", "6",
                           "--log-every", "4"))
    assert r.returncode == 0, r.stderr
    assert "a checkpoint every 4 updates; validation every 6 updates and at the end; averaged.pt from the last 5" \
        in r.stderr
    assert _counts(run) == ([6, 12, 13], [4, 8, 12, 13])
    assert "valid_nll" not in load(run / "checkpoint_8.pt").meta and "valid_nll" in load(run / "checkpoint_12.pt").meta
    # the data directory has no shortlist.pt: the run learned one, and every checkpoint carries it
    assert load(run / "checkpoint_8.pt").shortlist is not None and load(run / "averaged.pt").shortlist is not None
    log = (run / "train.log").read_text()
    assert re.search(r"update 6 epoch \d+: valid_nll .*\(\d[.\d]* (s|min)\)", log), log
    assert re.search(r"update 4: saved checkpoint_4.pt and checkpoint_last.pt \(\d[.\d]* (s|min)\)", log), log
    assert re.search(r"validation: 3 in \S+ (s|min) \(\d+\.\d% of the run\); saving: 4 in \S+ (s|min) "
                     r"\(\d+\.\d%\)", log), log
    monkeypatch.setattr(Trainer, "validate", lambda self: {"valid_nll": 2.0, "valid_ppl": 7.39, "valid_loss": 2.1})
    result = train(small_cfg(toy_data_dir, tmp_path / "p", max_steps=1000, save_every=1000, valid_every=1,
                             patience=2))  # the same figures at every validation: no improvement after the first
    assert result.stopped_by == "patience" and result.step == 3 and result.validations == 3


# ---- the loop -------------------------------------------------------------------------------------------------

def test_loss_drops_and_run_dir_is_complete(toy_data_dir, tmp_path):
    run = tmp_path / "run"
    result = train(small_cfg(toy_data_dir, run, max_steps=80, save_every=40, average_last=2))
    first, last = result.history[0], result.history[-1]
    assert last["loss"] < 0.7 * first["loss"]
    assert result.valid["valid_ppl"] < 15  # uniform over the 64-token vocabulary would be 64
    assert result.stopped_by == "max_steps" and result.step == 80
    names = {p.name for p in run.iterdir()}
    assert {"checkpoint_last.pt", "checkpoint_best.pt", "checkpoint_40.pt", "checkpoint_80.pt", "averaged.pt",
            "config.json", "metrics.jsonl"} <= names
    config = json.loads((run / "config.json").read_text())
    assert config["model"]["d_model"] == 32 and config["max_steps"] == 80 and config["precision"] == "fp32"
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert {r["kind"] for r in records} >= {"start", "train", "valid", "end"}
    # the training state is plain data: loadable without unpickling code
    raw = torch.load(run / "checkpoint_last.pt", weights_only=True)
    assert raw["train_state"]["step"] == 80 and "optimizer" in raw["train_state"]
    assert load(run / "averaged.pt").train_state is None


def test_every_live_line_shows_a_speed_and_an_eta(toy_data_dir, tmp_path):
    """The lines the display shows right after a log line carried the new, empty window: 0 tok/s, ETA 0:00:00."""
    events = []
    train(small_cfg(toy_data_dir, tmp_path / "run", max_steps=12, log_every=4), progress=events.append)
    live = [e for e in events if e["kind"] == "train"]
    assert len(live) == 12
    assert all(e["tgt_tokens_per_s"] > 0 for e in live), [e["tgt_tokens_per_s"] for e in live]
    assert all(e["eta"] > 0 for e in live if e["step"] < 12), [e["eta"] for e in live]


def test_one_name_one_number_for_the_validation_figures(toy_data_dir, tmp_path):
    """The live display, the end summary and metrics.jsonl give the validation figure "best" tracks under one name
    and with one value."""
    run = tmp_path / "run"
    r = run_nmt(*_cli_args(toy_data_dir, run, "--max-steps", "12", "--valid-every", "4", "--log-every", "4"))
    assert r.returncode == 0, r.stderr
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    valids = [e for e in records if e["kind"] == "valid"]
    end = [e for e in records if e["kind"] == "end"][-1]
    best = min(valids, key=lambda e: e["valid_nll"])
    assert end["best_valid_nll"] == best["valid_nll"] and end["best_step"] == best["step"]
    assert all(e["best_valid_nll"] == min(v["valid_nll"] for v in valids[: i + 1]) for i, e in enumerate(valids))
    for e in valids:  # each validation line shows the figures under the same names and values
        assert f"valid_nll {e['valid_nll']:.4f}  valid_ppl {e['valid_ppl']:.2f}" in r.stderr
    assert f"best valid_nll {best['valid_nll']:.4f} at update {best['step']}" in r.stderr
    assert "valid loss" not in r.stderr and "best validation" not in r.stderr


def test_bf16_autocast_trains_on_cpu(toy_data_dir, tmp_path):
    result = train(small_cfg(toy_data_dir, tmp_path / "run", max_steps=30, precision="bf16", valid_bleu=True,
                             valid_beam=2))
    assert math.isfinite(result.history[-1]["loss"]) and 0.0 <= result.valid["valid_bleu"] <= 100.0
    assert result.history[-1]["loss"] < result.history[0]["loss"]
    assert json.loads((tmp_path / "run" / "config.json").read_text())["precision"] == "bf16"


def _fresh_trainer(data_dir, out_dir) -> Trainer:
    cfg = small_cfg(data_dir, out_dir, model={**SMALL, "dropout": 0.0}, max_steps=10)
    plan = plan_run(cfg)
    return Trainer(plan, Runtime(Launch("cpu", 1, None, False, "fp32")))


def test_gradient_accumulation_equals_one_big_batch(toy_data_dir, tmp_path):
    """2 micro-batches of 4 sentences == 8 micro-batches of 1 == 1 batch of 8: the same per-token mean gradient
    reaches the optimizer (dropout 0, fp32)."""
    results = []
    for split in ([8], [4, 4], [1] * 8):
        trainer = _fresh_trainer(toy_data_dir, tmp_path / f"run{len(split)}")
        seen = {}
        real_step = trainer.optimizer.step

        def capture(*a, _trainer=trainer, _seen=seen, _real=real_step, **kw):
            _seen.update({n: p.grad.clone() for n, p in _trainer.module.named_parameters()})
            return _real(*a, **kw)

        trainer.optimizer.step = capture
        data, micro, start = trainer.train_data, [], 0
        for size in split:
            micro.append(collate([data[i] for i in range(start, start + size)]))
            start += size
        stats = trainer.update(Update(micro, sum(b.n_tgt_tokens for b in micro), sum(b.n_src_tokens for b in micro)))
        results.append((stats, seen))
    (ref_stats, ref), others = results[0], results[1:]
    assert ref and max(float(g.abs().max()) for g in ref.values()) > 1e-3
    for stats, grads in others:
        assert stats.tgt_tokens == ref_stats.tgt_tokens
        assert stats.loss_sum == pytest.approx(ref_stats.loss_sum, rel=1e-5)
        for k in ref:
            torch.testing.assert_close(grads[k], ref[k], rtol=1e-4, atol=1e-6)


def test_resume_equals_uninterrupted_training(toy_data_dir, tmp_path):
    """fp32 with dropout on: 2N updates straight == N updates, stop, resume for N more (bitwise)."""
    per_epoch = len(_fresh_trainer(toy_data_dir, tmp_path / "probe").reader.batches)
    n = per_epoch * 2 // 3 + 1  # stop mid-epoch; the resumed half crosses into the next epoch
    straight = train(small_cfg(toy_data_dir, tmp_path / "a", max_steps=2 * n))
    half = train(small_cfg(toy_data_dir, tmp_path / "b", max_steps=n))
    assert half.step == n
    resumed = train(small_cfg(toy_data_dir, tmp_path / "b", max_steps=2 * n))
    assert resumed.step == straight.step == 2 * n and resumed.epoch == straight.epoch >= 2
    a, b = load(tmp_path / "a" / "checkpoint_last.pt"), load(tmp_path / "b" / "checkpoint_last.pt")
    for k in a.model_state:
        assert torch.equal(a.model_state[k], b.model_state[k]), k
    opt_a, opt_b = a.train_state["optimizer"]["state"], b.train_state["optimizer"]["state"]
    for i in opt_a:
        assert torch.equal(opt_a[i]["exp_avg_sq"], opt_b[i]["exp_avg_sq"])
    assert (a.train_state["epoch"], a.train_state["pos"]) == (b.train_state["epoch"], b.train_state["pos"])


def test_resume_refuses_an_incompatible_checkpoint(toy_data_dir, tmp_path):
    train(small_cfg(toy_data_dir, tmp_path / "run", max_steps=3))
    before = (tmp_path / "run" / "checkpoint_last.pt").read_bytes()
    with pytest.raises(CheckpointError, match="another model"):
        train(small_cfg(toy_data_dir, tmp_path / "run", max_steps=6, model={**SMALL, "d_model": 64}))
    with pytest.raises(ConfigError, match="--no-resume: .* already holds a run .* drop --no-resume"):
        train(small_cfg(toy_data_dir, tmp_path / "run", max_steps=6, resume=False))
    assert (tmp_path / "run" / "checkpoint_last.pt").read_bytes() == before


def test_nan_loss_is_reported_with_the_step(toy_data_dir, tmp_path, monkeypatch):
    poison_loss(monkeypatch, at=4, factor=float("nan"))
    with pytest.raises(TrainingError, match="update 4"):
        train(small_cfg(toy_data_dir, tmp_path / "run", max_steps=10, save_every=2))
    assert load(tmp_path / "run" / "checkpoint_last.pt").train_state["step"] == 2  # the last good state


def test_interrupted_save_leaves_the_old_checkpoint_valid(toy_data_dir, tmp_path, monkeypatch):
    run = tmp_path / "run"
    train(small_cfg(toy_data_dir, run, max_steps=4))
    real_save = torch.save

    def dying_save(obj, f, *a, **kw):
        f.write(b"PK\x03\x04 half a checkpoint")
        raise KeyboardInterrupt  # e.g. the machine goes down mid-write

    monkeypatch.setattr(torch, "save", dying_save)
    with pytest.raises(KeyboardInterrupt):
        train(small_cfg(toy_data_dir, run, max_steps=8))
    monkeypatch.setattr(torch, "save", real_save)
    ckpt = load(run / "checkpoint_last.pt")
    assert ckpt.train_state["step"] == 4
    assert not [p for p in run.iterdir() if p.name.endswith(".tmp")]


def _signal_at(monkeypatch, step: int) -> None:
    """Send this process SIGTERM when the trainer is about to run update `step` + 1."""
    real_update = Trainer.update

    def update(self, batches):
        if self.step == step:
            os.kill(os.getpid(), signal.SIGTERM)
        return real_update(self, batches)

    monkeypatch.setattr(Trainer, "update", update)


def test_a_stop_signal_saves_first_and_does_nothing_else(toy_data_dir, tmp_path, monkeypatch):
    """SIGTERM (torchrun kills 30 s later): checkpoint_last.pt is written at once; the (here slow) final validation,
    the periodic checkpoint and the averaging are skipped."""
    validations = []
    real_validate = Trainer.validate

    def slow_validate(self):
        validations.append(self.step)
        time.sleep(2.0)
        return real_validate(self)

    monkeypatch.setattr(Trainer, "validate", slow_validate)
    _signal_at(monkeypatch, 5)
    run = tmp_path / "run"
    result = train(small_cfg(toy_data_dir, run, max_steps=1000, average_last=2))
    assert result.stopped_by == "signal" and result.signum == signal.SIGTERM
    assert validations == []
    # the signal came during update 6; one process reads its flag right after that update
    assert load(run / "checkpoint_last.pt").train_state["step"] == result.step == 6
    assert not (run / "averaged.pt").exists() and periodic_checkpoints(run) == []


def test_a_second_signal_during_the_save_stops_at_once_with_one_line(toy_data_dir, tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from nmt_cli.cli import app

    run = tmp_path / "run"
    train(small_cfg(toy_data_dir, run, max_steps=4))
    before = (run / "checkpoint_last.pt").read_bytes()
    _signal_at(monkeypatch, 6)

    def interrupted_save(obj, f, *a, **kw):
        f.write(b"PK\x03\x04 half a checkpoint")
        os.kill(os.getpid(), signal.SIGTERM)  # the second signal arrives while the checkpoint is being written

    monkeypatch.setattr(torch, "save", interrupted_save)
    result = CliRunner().invoke(app, [str(a) for a in _cli_args(toy_data_dir, run, "--max-steps", "100")])
    assert result.exit_code == 130, result.output
    lines = [ln for ln in result.output.splitlines() if ln.startswith("error:")]
    assert len(lines) == 1 and "interrupted again" in lines[0] and "still holds update 4" in lines[0]
    assert "Traceback" not in result.output
    assert (run / "checkpoint_last.pt").read_bytes() == before
    assert not [p for p in run.iterdir() if p.name.endswith(".tmp")]


def test_stale_temporary_files_are_removed_and_files_follow_the_umask(toy_data_dir, tmp_path):
    run = tmp_path / "run"
    old = os.umask(0o027)
    try:
        train(small_cfg(toy_data_dir, run, max_steps=2))
        # what kill -9 during a save leaves: a temporary file beside the checkpoint (and one of config.json)
        (run / "checkpoint_last.pt.k2j4x9.tmp").write_bytes(b"x" * 1000)
        (run / "config.json.ab12.tmp").write_text("{")
        (run / "notes.txt").write_text("mine")
        train(small_cfg(toy_data_dir, run, max_steps=4))
    finally:
        os.umask(old)
    assert sorted(p.name for p in run.iterdir() if p.name.endswith(".tmp")) == []
    assert (run / "notes.txt").read_text() == "mine"
    for name in ("checkpoint_last.pt", "checkpoint_4.pt", "config.json"):
        assert (run / name).stat().st_mode & 0o777 == 0o640, name  # 0666 less the umask, not mkstemp's 0600


def test_a_full_disk_is_one_line_and_the_last_checkpoint_stays(toy_data_dir, tmp_path, monkeypatch, capsys):
    import errno

    from nmt_cli.cli import main

    run = tmp_path / "run"
    train(small_cfg(toy_data_dir, run, max_steps=2))
    before = (run / "checkpoint_last.pt").read_bytes()

    def full_disk(obj, f, *a, **kw):
        f.write(b"PK\x03\x04 part of a checkpoint")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(torch, "save", full_disk)
    with pytest.raises(CheckpointError, match="No space left on device.*keeps its previous content"):
        train(small_cfg(toy_data_dir, run, max_steps=4))
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_info:  # the console script: one line, exit 1
        main([str(a) for a in _cli_args(toy_data_dir, run, "--max-steps", "6")])
    assert exit_info.value.code == 1
    errors = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1 and "No space left on device" in errors[0]
    assert (run / "checkpoint_last.pt").read_bytes() == before
    assert not [p for p in run.iterdir() if p.name.endswith(".tmp")]


def test_an_unwritable_run_directory_is_refused_before_training(toy_data_dir, tmp_path, monkeypatch):
    real_access = os.access
    monkeypatch.setattr(os, "access", lambda p, mode: False if str(p).startswith(str(tmp_path / "ro"))
                        else real_access(p, mode))
    (tmp_path / "ro").mkdir()
    with pytest.raises(ConfigError, match="not writable"):
        plan_run(small_cfg(toy_data_dir, tmp_path / "ro" / "run", max_steps=2))
    assert not (tmp_path / "ro" / "run").exists()


class UpdateClock:
    """A clock that moves only when the trainer updates: `seconds` per update (the run's time, --max-time and the
    saves by minutes follow it, not the machine's speed)."""

    def __init__(self, seconds: float):
        self.now, self.seconds = 1000.0, seconds

    def __call__(self) -> float:
        return self.now

    def train(self, cfg: TrainConfig):
        plan = plan_run(cfg)
        write_run_config(plan)
        trainer = Trainer(plan, Runtime(Launch("cpu", 1, None, False, "fp32")), clock=self)
        update = trainer.update

        def timed(u):
            self.now += self.seconds
            return update(u)

        trainer.update = timed
        return trainer.fit()


def test_max_time_stops_and_time_based_checkpoints_average(toy_data_dir, tmp_path):
    """Each update takes 0.5 s of the run's clock: --max-time 0.25 (15 s) stops at the first update past it (31),
    --save-every-minutes 0.05 (3 s) saves the state at the updates where 3 s have passed since the last save (the
    flag raised before update n, agreed with it), and the last 3 of those are averaged."""
    run = tmp_path / "run"
    clock = UpdateClock(0.5)
    result = clock.train(small_cfg(toy_data_dir, run, max_time=0.25, max_steps=100000, average_last=3, keep_last=3,
                                   save_every_minutes=0.05))
    assert result.stopped_by == "max_time"
    assert result.step == 31 and result.elapsed == 15.5  # 15 s reached after update 30: update 31 ran, then stop
    steps = [int(p.stem.split("_")[1]) for p in periodic_checkpoints(run)]
    assert steps == [21, 28, 31], steps  # 3 s after a save the flag rides on the 7th update; the last: the stop's
    assert load(run / "averaged.pt").meta["averaged_from"] == [str(p) for p in periodic_checkpoints(run)]
    saves = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [e["step"] for e in saves if e["kind"] == "save"] == [7, 14, 21, 28, 31]


def test_max_epochs_and_patience(toy_data_dir, tmp_path):
    result = train(small_cfg(toy_data_dir, tmp_path / "e", max_epochs=2))
    assert result.stopped_by == "max_epochs" and result.epoch == 3
    trainer = _fresh_trainer(toy_data_dir, tmp_path / "p")
    assert trainer.best.improved({"valid_nll": 2.0}, 1) and trainer.best.improved({"valid_nll": 1.5}, 2)
    assert not trainer.best.improved({"valid_nll": 1.7}, 3) and trainer.best.bad == 1 and trainer.best.step == 2


def test_valid_bleu_uses_beam_search(toy_data_dir, tmp_path):
    run = tmp_path / "run"
    result = train(small_cfg(toy_data_dir, run, max_steps=20, valid_bleu=True, valid_beam=2))
    assert 0.0 <= result.valid["valid_bleu"] <= 100.0
    assert result.best_valid == result.valid["valid_bleu"]


def test_keep_last_prunes_oldest(tmp_path):
    for step in (5, 10, 15, 100):
        (tmp_path / f"checkpoint_{step}.pt").write_bytes(b"x")
    (tmp_path / "checkpoint_last.pt").write_bytes(b"x")
    prune_periodic(tmp_path, 2)
    assert [p.name for p in periodic_checkpoints(tmp_path)] == ["checkpoint_15.pt", "checkpoint_100.pt"]
    assert (tmp_path / "checkpoint_last.pt").exists()


# ---- distributed (gloo on CPU) --------------------------------------------------------------------------------

def test_two_gloo_processes_train_and_agree(toy_data_dir, tmp_path):
    result = train(small_cfg(toy_data_dir, tmp_path / "run", max_steps=6, cpu_procs=2, valid_bleu=True, valid_beam=2))
    assert result.ranks_agree is True and 0.0 <= result.valid["valid_bleu"] <= 100.0  # validated on both ranks
    assert result.step == 6 and result.history[-1]["loss"] < result.history[0]["loss"] * 1.05
    config = json.loads((tmp_path / "run" / "config.json").read_text())
    assert config["world_size"] == 2
    assert load(tmp_path / "run" / "checkpoint_last.pt").train_state["world_size"] == 2


def test_cpu_processes_are_started_before_torch_is_imported_only_when_their_number_is_sure(monkeypatch):
    from nmt_cli.training.distributed.spawn import early_world_size

    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(key, raising=False)
    assert early_world_size(None, 2) == early_world_size(0, 2) == 2
    assert early_world_size(None, 1) is None and early_world_size(2, 1) is None  # GPUs: counted by torch first
    assert early_world_size(None, 10**6) is None  # refused by plan_launch: nothing started
    monkeypatch.setenv("RANK", "0"), monkeypatch.setenv("WORLD_SIZE", "2"), monkeypatch.setenv("LOCAL_RANK", "0")
    assert early_world_size(None, 2) is None  # torchrun started the processes


def test_two_gloo_processes_resume_together(toy_data_dir, tmp_path):
    train(small_cfg(toy_data_dir, tmp_path / "run", max_steps=3, cpu_procs=2))
    result = train(small_cfg(toy_data_dir, tmp_path / "run", max_steps=6, cpu_procs=2))
    assert result.ranks_agree is True and result.step == 6
    assert json.loads((tmp_path / "run" / "config.json").read_text())["resumed_from"].endswith("checkpoint_last.pt")


def test_ranks_without_the_checkpoint_rank_0_resumes_from_stop_the_run(toy_data_dir, tmp_path):
    """Two processes started as torchrun starts them, on "nodes" whose run directories are not shared (each its
    own working directory, -o run): rank 0 would resume, rank 1 cannot see the checkpoint. Both stop with one line
    instead of training apart; rank 0's checkpoint is untouched and rank 1 writes nothing."""
    from nmt_cli.training.distributed.spawn import free_port

    nodes = [tmp_path / "node0", tmp_path / "node1"]
    for node in nodes:
        node.mkdir()
    train(small_cfg(toy_data_dir, nodes[0] / "run", max_steps=3))
    before = (nodes[0] / "run" / "checkpoint_last.pt").read_bytes()
    port = str(free_port())
    procs = []
    for rank, node in enumerate(nodes):
        env = {**os.environ, "RANK": str(rank), "WORLD_SIZE": "2", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1",
               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port}
        args = _cli_args(toy_data_dir, "run", "--max-steps", "6", "--gpus", "0", "--threads", "1")
        procs.append(subprocess.Popen([sys.executable, "-m", "nmt_cli.cli", *map(str, args)], cwd=node, env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    errs = [p.communicate(timeout=180)[1] for p in procs]
    assert [p.returncode for p in procs] == [1, 1], errs
    lines = [ln for ln in errs[0].splitlines() if ln.strip()]
    assert len(lines) == 1 and "rank 1 cannot see" in lines[0] and "checkpoint_last.pt" in lines[0], errs[0]
    assert (nodes[0] / "run" / "checkpoint_last.pt").read_bytes() == before
    assert not (nodes[1] / "run").exists()


class _Ranks:
    """One rank of two as `agree_on_resume` sees it, the other rank's side scripted: what rank 0 broadcasts (for
    rank 1) and what the other rank answers in gathers (nothing wrong, nothing unsure)."""

    def __init__(self, rank: int, broadcasts: list | None = None):
        self.distributed, self.rank, self.is_main, self.broadcasts = True, rank, rank == 0, broadcasts

    def broadcast_object(self, obj):
        return obj if self.is_main else self.broadcasts.pop(0)

    def gather_objects(self, obj):
        other = False if isinstance(obj, bool) else None
        return [obj, other] if self.is_main else [other, obj]


def test_the_checkpoint_to_resume_is_hashed_only_where_a_rank_sees_another_file(tmp_path, monkeypatch):
    """Every rank must resume from rank 0's very checkpoint. Shared storage (the same size and modification time)
    reads nothing; a copy (another time) is hashed, by rank 0 and by that rank once; other bytes stop the run."""
    from dataclasses import dataclass

    @dataclass
    class Plan:
        resume_from: str | None
        finished: dict | None = None

    ckpt = tmp_path / "checkpoint_last.pt"
    ckpt.write_bytes(b"x" * 1000)
    hashed = []
    real_sha = plan_mod.file_sha256
    monkeypatch.setattr(plan_mod, "file_sha256", lambda path: hashed.append(path) or real_sha(path))
    st = ckpt.stat()
    same = {"path": str(ckpt), "size": st.st_size, "mtime_ns": st.st_mtime_ns}
    assert plan_mod.agree_on_resume(Plan(str(ckpt)), _Ranks(0)).resume_from == str(ckpt)
    assert plan_mod.agree_on_resume(Plan(None), _Ranks(1, [same])).resume_from == str(ckpt)
    assert hashed == []
    copied = {**same, "mtime_ns": st.st_mtime_ns - 10**9}
    assert plan_mod.agree_on_resume(Plan(None), _Ranks(1, [copied, real_sha(ckpt)])).resume_from == str(ckpt)
    assert len(hashed) == 1
    with pytest.raises(TrainingError, match="rank 1 sees another .* than rank 0 \\(different bytes\\)"):
        plan_mod.agree_on_resume(Plan(None), _Ranks(1, [copied, "0" * 64]))
    with pytest.raises(TrainingError, match="rank 1 cannot see"):
        plan_mod.agree_on_resume(Plan(None), _Ranks(1, [{**same, "path": str(tmp_path / "elsewhere.pt")}]))


def _children(pid: int) -> list[tuple[int, str, dict]]:
    """(pid, command line, environment) of the processes whose parent is `pid` (Linux /proc)."""
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            status = open(f"/proc/{entry}/status").read()
            if f"\nPPid:\t{pid}\n" not in status:
                continue
            cmd = open(f"/proc/{entry}/cmdline", "rb").read().replace(b"\0", b" ").decode()
            env = dict(kv.split("=", 1) for kv in open(f"/proc/{entry}/environ", "rb").read().decode(
                errors="replace").split("\0") if "=" in kv)
        except OSError:
            continue
        out.append((int(entry), cmd, env))
    return out


def _wait_for(predicate, seconds: float, what: str) -> None:
    deadline = time.time() + seconds
    while not predicate():
        if time.time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.2)


def _updates(run) -> int:
    metrics = run / "metrics.jsonl"
    if not metrics.exists():
        return 0
    whole = metrics.read_text().split("\n")[:-1]  # (a line being written has no newline yet)
    steps = [json.loads(line).get("step", 0) for line in whole if '"train"' in line]
    return max(steps, default=0)


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="Linux /proc")
@pytest.mark.parametrize("launcher", ["cpu-procs", "torchrun"])
def test_a_stopped_rank_ends_the_run_with_one_line_naming_it(toy_data_dir, tmp_path, launcher):
    """Rank 1 stopped with SIGSTOP, under `--cpu-procs 2` or `torchrun --nproc-per-node 2`: within --dist-timeout
    (here 6 s) rank 0's watchdog names it in one line, kills it (it runs on this machine: stopped, it would hold
    torchrun's SIGTERM for torchrun's 30 s grace period) and exits 1, instead of waiting for the process group's
    timeout; the run ends non-zero well before torchrun's grace period would have passed."""
    run = tmp_path / "run"
    args = map(str, _cli_args(toy_data_dir, run, "--max-steps", "100000", "--threads", "1", "--dist-timeout", "0.1",
                              "--log-every", "1", *(["--cpu-procs", "2"] if launcher == "cpu-procs" else ["--gpus", "0"])))
    proc = subprocess.Popen([*([sys.executable] if launcher == "cpu-procs" else torchrun(2)), "-m", "nmt_cli.cli",
                             *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    rank1 = None
    try:
        _wait_for(lambda: _updates(run) >= 3, 120, "3 updates")
        rank1 = next(pid for pid, cmd, env in _children(proc.pid)
                     if ("spawn_main" in cmd if launcher == "cpu-procs" else env.get("RANK") == "1"))
        os.kill(rank1, signal.SIGSTOP)
        stopped_at = time.time()
        _, err = proc.communicate(timeout=120)
        waited = time.time() - stopped_at
    finally:
        if rank1 is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(rank1, signal.SIGKILL)
        proc.kill()
    assert proc.returncode == 1 if launcher == "cpu-procs" else proc.returncode != 0, err
    errors = [ln for ln in err.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1 and "rank 0: rank 1 of 2 has not answered for 6 s" in errors[0], err
    assert waited < 30, (waited, err)  # 6 s of silence, then the watchdog's kill (not torchrun's grace period)
    if launcher == "cpu-procs":
        assert "Traceback" not in err  # (torchrun prints its own summary of the failed processes)


def test_a_rank_that_dies_is_named_in_one_line_by_the_survivor(toy_data_dir, tmp_path):
    """Two processes started as torchrun starts them (env://, rank 0 holds the store); rank 0 killed with SIGKILL:
    rank 1's collective fails, and it says in one line that rank 0 went away, not with a gloo traceback."""
    from nmt_cli.training.distributed.spawn import free_port

    port = str(free_port())
    procs = []
    for rank in range(2):
        env = {**os.environ, "RANK": str(rank), "WORLD_SIZE": "2", "LOCAL_RANK": str(rank), "LOCAL_WORLD_SIZE": "2",
               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port}
        args = _cli_args(toy_data_dir, tmp_path / "run", "--max-steps", "100000", "--gpus", "0", "--threads", "1",
                         "--log-every", "1")
        procs.append(subprocess.Popen([sys.executable, "-m", "nmt_cli.cli", *map(str, args)], env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    try:
        _wait_for(lambda: _updates(tmp_path / "run") >= 3, 120, "3 updates")
        procs[0].kill()
        _, err = procs[1].communicate(timeout=120)
    finally:
        for p in procs:
            p.kill()
    assert procs[1].returncode == 1, err
    errors = [ln for ln in err.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1 and "rank 1: rank 0 of 2 ended or stopped answering" in errors[0], err
    assert "Traceback" not in err


@pytest.mark.slow
@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="Linux /proc")
def test_torchrun_restarts_a_killed_rank_and_the_run_resumes_to_the_same_weights(toy_data_dir, tmp_path):
    """torchrun --nproc-per-node 2 --max-restarts 2; rank 0 killed with SIGKILL after the checkpoint at update 20:
    torchrun restarts both ranks, the run resumes at update 20 and ends at 60 with the weights of an uninterrupted
    run (CPU, fp32: deterministic). torchrun names the dead rank itself and stops the other with SIGTERM at once:
    no traceback."""
    def start(run):
        args = _cli_args(toy_data_dir, run, "--max-steps", "60", "--save-every", "20", "--threads", "1",
                         "--log-every", "1", "--gpus", "0")
        cmd = [*torchrun(2), "--max-restarts", "2", "-m", "nmt_cli.cli", *map(str, args)]
        return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    straight = start(tmp_path / "straight")
    _, err = straight.communicate(timeout=600)
    assert straight.returncode == 0, err
    run = tmp_path / "killed"
    proc = start(run)
    try:
        _wait_for(lambda: (run / "checkpoint_20.pt").exists() and _updates(run) >= 22, 300, "update 22")
        rank0 = next(pid for pid, _, env in _children(proc.pid) if env.get("RANK") == "0")
        os.kill(rank0, signal.SIGKILL)
        _, err = proc.communicate(timeout=600)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    assert "resuming" in err and "at update 20" in err, err
    assert "Traceback" not in err and "exitcode: -9" in err, err
    a, b = load(tmp_path / "straight" / "checkpoint_last.pt"), load(run / "checkpoint_last.pt")
    assert a.train_state["step"] == b.train_state["step"] == 60
    assert all(torch.equal(a.model_state[k], b.model_state[k]) for k in a.model_state)


def test_flags_raised_by_any_rank_are_agreed_by_all_one_update_later():
    """distributed.votes.Votes: rank 1's stop at update 2 and rank 0's save at update 4 reach every rank with the exchange of
    the update after; one process reads its own flags at once."""
    from helpers_train import exchange_votes, run_ranks
    from nmt_cli.training.distributed.votes import Votes

    raised = {(1, 2): (True, False), (0, 4): (False, True)}
    want = [(False, False)] * 6
    want[3], want[5] = (True, False), (False, True)
    assert run_ranks(exchange_votes, 2, raised) == [(0, want), (1, want)]
    alone = Votes(Runtime(Launch("cpu", 1, None, False, "fp32")))
    assert alone.exchange(True, False) == (True, False) and alone.exchange(False, True) == (False, True)


def test_a_run_over_nccl_makes_no_process_group_besides_the_default_one(toy_data_dir, tmp_path):
    """Host values (loss sums, stop and save flags) go through the default process group, NCCL on GPUs: a run whose
    launch says NCCL makes no other group (nmt once made a gloo group beside NCCL for them). Here the default group
    is gloo underneath (no NCCL on a CPU) while nmt is told "nccl" wherever it asks; the run saves by the clock (rank
    0's flag, agreed a step late) and by updates, validates and stops, every rank at the same update."""
    import dataclasses

    from helpers_train import run_ranks, train_as_nccl
    from nmt_cli.training.plan import write_run_config

    run = tmp_path / "run"
    plan = plan_run(small_cfg(toy_data_dir, run, max_steps=5, cpu_procs=2, save_every=100,
                              save_every_minutes=1e-9))
    assert plan.launch.backend == "gloo"
    plan = dataclasses.replace(plan, launch=dataclasses.replace(plan.launch, backend="nccl"))
    write_run_config(plan)
    out = run_ranks(train_as_nccl, 2, plan)
    assert out == [(0, ["nccl"], [], 5, "max_steps", True), (1, ["nccl"], [], 5, "max_steps", True)]
    # the clock's flag, raised by rank 0 once the time is up (at once here), reaches both ranks an update later;
    # rank 0 raises it again only after that save (not while it is on its way: that would save twice in a row)
    assert [p.name for p in periodic_checkpoints(run)] == [f"checkpoint_{k}.pt" for k in (2, 4, 5)]


@pytest.mark.slow
@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="Linux /proc")
def test_two_nodes_on_one_machine_train_save_resume_after_a_kill_and_finish(toy_data_dir, tmp_path):
    """Two torchrun agents (two "nodes" of 2 processes each) meet at one c10d rendezvous on 127.0.0.1: the run
    trains and saves; a rank of the second node killed with SIGKILL makes both agents restart their workers
    (--max-restarts; only that node's agent counts a restart, distributed.process_group.agree_round), the run resumes from its last
    checkpoint and finishes, every update after the resume holding the batches of an uninterrupted run and the
    first one its loss. (Not bitwise the weights: with more than 2 processes the all-reduce's sums depend on their
    order, which a resumed process does not keep; the tiny model turns that roundoff into visible differences.)"""
    from nmt_cli.training.distributed.spawn import free_port

    def nodes(run, port):
        args = _cli_args(toy_data_dir, run, "--max-steps", "40", "--save-every", "10", "--threads", "1",
                         "--log-every", "1", "--gpus", "0")
        return [subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--nnodes", "2",
                                  "--nproc-per-node", "2", "--max-restarts", "2", "--rdzv-backend", "c10d",
                                  "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", "twonodes", "-m", "nmt_cli.cli",
                                  *map(str, args)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                for _ in range(2)]

    straight = nodes(tmp_path / "straight", free_port())
    errs = [p.communicate(timeout=900)[1] for p in straight]
    assert [p.returncode for p in straight] == [0, 0], errs
    run = tmp_path / "killed"
    agents = nodes(run, free_port())
    try:
        _wait_for(lambda: (run / "checkpoint_10.pt").exists() and _updates(run) >= 12, 600, "update 12")
        workers = [(pid, env) for agent in agents for pid, _, env in _children(agent.pid)]
        victim = next(pid for pid, env in workers if env.get("RANK") == "3")
        os.kill(victim, signal.SIGKILL)
        errs = [p.communicate(timeout=900)[1] for p in agents]
    finally:
        for p in agents:
            p.kill()
    assert [p.returncode for p in agents] == [0, 0], errs
    resumed = [int(m.group(1)) for e in errs for m in [re.search(r"resuming \S+ at update (\d+)", e)] if m]
    assert resumed and resumed[0] % 10 == 0, errs
    a, b = load(tmp_path / "straight" / "checkpoint_last.pt"), load(run / "checkpoint_last.pt")
    assert a.train_state["step"] == b.train_state["step"] == 40 and b.train_state["world_size"] == 4

    def updates(path):  # step -> its record, the last one written (a resumed run writes some steps twice)
        return {e["step"]: e for e in map(json.loads, (path / "metrics.jsonl").read_text().splitlines())
                if e["kind"] == "train"}

    straight_log, killed_log = updates(tmp_path / "straight"), updates(run)
    after = range(resumed[0] + 1, 41)
    assert [killed_log[k]["tgt_tokens_per_update"] for k in after] == \
        [straight_log[k]["tgt_tokens_per_update"] for k in after]
    first = resumed[0] + 1
    assert killed_log[first]["loss"] == pytest.approx(straight_log[first]["loss"], rel=1e-6)


def test_a_compiled_model_inside_ddp_is_compiled_by_ddp_optimizer(tmp_path):
    """DDP(torch.compile(model)), the order PyTorch recommends: dynamo still compiles the model under DDP's
    DDPOptimizer (graphs split at DDP's buckets, so the backward overlaps the all-reduce); a gloo group of one in a
    process of its own."""
    from nmt_cli.training.distributed.spawn import free_port

    code = """
import sys, torch, torch.distributed as dist
from torch._dynamo.backends.distributed import DDPOptimizer
from nmt_cli.config import preset
from nmt_cli.model import Transformer
from nmt_cli.training.distributed.ddp import data_parallel
from nmt_cli.training.distributed.process import Runtime
from nmt_cli.training.distributed.world import Launch

dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{sys.argv[1]}", rank=0, world_size=1)
calls, real = [], DDPOptimizer.compile_fn
DDPOptimizer.compile_fn = lambda self, gm, inputs: calls.append(gm) or real(self, gm, inputs)
module = Transformer(preset("tiny", vocab_size=64, d_model=32, d_ff=64, encoder_layers=1, decoder_layers=1))
model = data_parallel(torch.compile(module, backend="eager"), Runtime(Launch("cpu", 2, "gloo", True, "fp32")))
src, tgt = torch.randint(4, 64, (2, 5)), torch.randint(4, 64, (2, 6))
model(src, tgt, src == 0).float().sum().backward()
print(len(calls), all(p.grad is not None for p in module.parameters()))
"""
    r = subprocess.run([sys.executable, "-c", code, str(free_port())], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    graphs, grads = r.stdout.split()
    assert int(graphs) >= 1 and grads == "True"


# ---- the command line -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("extra, message", [
    (["--precision", "fp16", "--gpus", "0"], "fp16"),
    (["--gpus", "64"], "--gpus 64"),
    (["--max-tokens", "4"], "--max-tokens"),
    (["--max-tokens", "4", "--cpu-procs", "2"], "--max-tokens"),  # the second process, started early, stops quietly
])
def test_bad_input_is_one_line_and_writes_nothing(toy_data_dir, tmp_path, extra, message):
    run = tmp_path / "run"
    r = run_nmt(*_cli_args(toy_data_dir, run, "--max-steps", "2"), *extra)
    assert r.returncode == 1, r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and message in lines[0] and "Traceback" not in r.stderr
    assert not run.exists()


def test_data_dir_not_written_by_prepare(tmp_path):
    (tmp_path / "raw").mkdir()
    with pytest.raises(DataError, match="nmt prepare"):
        plan_run(TrainConfig(str(tmp_path / "raw"), str(tmp_path / "run")))
    assert not (tmp_path / "run").exists()


def test_fp16_on_cpu_is_refused(toy_data_dir, tmp_path):
    with pytest.raises(DeviceError, match="fp16"):
        plan_run(small_cfg(toy_data_dir, tmp_path / "run", precision="fp16", gpus=0))


@pytest.fixture()
def fake_gpus(monkeypatch):
    """Pretend to have GPUs of the given compute capabilities (only what plan_launch looks at)."""
    from nmt_cli.training.distributed import world as runtime

    def install(*capabilities):
        names = {(7, 0): "Tesla V100", (7, 5): "Tesla T4", (8, 0): "A100", (9, 0): "H200"}
        monkeypatch.setattr(runtime.torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(runtime.torch.cuda, "device_count", lambda: len(capabilities))
        monkeypatch.setattr(runtime.torch.cuda, "get_device_capability", lambda i=0: capabilities[i])
        monkeypatch.setattr(runtime.torch.cuda, "get_device_name", lambda i=0: names[capabilities[i]])
        # torch's own test says True for a V100 (emulated bf16): nmt must not ask it
        monkeypatch.setattr(runtime.torch.cuda, "is_bf16_supported", lambda *a, **kw: True)

    return install


def test_precision_auto_uses_bf16_only_where_it_is_native(fake_gpus):
    from nmt_cli.training.distributed.world import plan_launch

    fake_gpus((9, 0), (8, 0))
    assert plan_launch(2, 1, "auto").precision == "bf16"
    fake_gpus((7, 0), (7, 0))
    assert plan_launch(2, 1, "auto").precision == "fp16"
    assert plan_launch(1, 1, "fp32").precision == "fp32"
    with pytest.raises(DeviceError, match=r"GPU 0 \(Tesla V100, compute capability 7.0\) has no native bf16.*fp16"):
        plan_launch(1, 1, "bf16")
    fake_gpus((8, 0), (7, 5))  # a mixed machine: every GPU used must have it
    assert plan_launch(1, 1, "auto").precision == "bf16" and plan_launch(2, 1, "auto").precision == "fp16"


def test_precision_under_torchrun_is_checked_on_this_ranks_gpu(fake_gpus, monkeypatch):
    from nmt_cli.training.distributed.world import plan_launch

    fake_gpus((8, 0), (7, 5))
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert plan_launch(None, 1, "auto").precision == "fp16"
    monkeypatch.setenv("LOCAL_RANK", "0")
    assert plan_launch(None, 1, "auto").precision == "bf16"


def test_fp16_loss_scaler_skips_and_counts_overflowed_updates(toy_data_dir, tmp_path, monkeypatch):
    """The fp16 path (autocast + dynamic loss scaling), exercised on CPU where torch supports it: an update whose
    gradients overflow is skipped (weights untouched, scale halved), counted, and does not advance the step."""
    fp16 = Launch("cpu", 1, None, False, "fp16")
    from nmt_cli.training import launch as launch_mod

    for module in (plan_mod, launch_mod):  # nmt train refuses fp16 on CPU
        monkeypatch.setattr(module, "plan_launch", lambda *a, **kw: fp16)
    calls = poison_loss(monkeypatch, at=3, factor=float("inf"))
    run = tmp_path / "run"
    result = train(small_cfg(toy_data_dir, run, max_steps=6, precision="fp16", save_every=100))  # one validation
    assert result.step == 6 and result.overflows == 1 and calls["n"] == 7
    events = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [e["overflows"] for e in events if e["kind"] == "train"][-1] == 1
    ckpt = load(run / "checkpoint_last.pt")
    assert ckpt.train_state["overflows"] == 1
    assert ckpt.train_state["scaler"]["scale"] == FP16_INIT_SCALE / 2  # halved once, not yet grown back
    assert all(torch.isfinite(t).all() for t in ckpt.model_state.values())


def _files(run) -> dict:
    return {p.name: (p.stat().st_mtime_ns, p.read_bytes()) for p in sorted(run.iterdir()) if p.is_file()}


def test_a_finished_run_is_left_as_it_is_and_a_raised_stop_continues_it(toy_data_dir, tmp_path):
    """Re-running the command of a run that reached its stop says so in one line and changes nothing (no update
    past it, no checkpoint pruned, no averaged.pt rewritten); raising --max-steps continues it. A short run saves
    often enough to average; fewer checkpoints than --average-last asks for are averaged all, said in one line;
    the header says what the warmup and the saving mean for this run; train.log holds what was printed."""
    run = tmp_path / "run"
    r = run_nmt(*_cli_args(toy_data_dir, run, "--max-steps", "6", "--save-every", "4", "--average-last", "3"))
    assert r.returncode == 0, r.stderr
    assert "lr rises over 10 warmup updates, past this run's 6" in r.stderr
    assert ("a checkpoint every 4 updates; validation every 200 updates and at the end; averaged.pt from the last "
            "3 at the end") in r.stderr
    assert f"note: {fewer_message(run, 2, 3)}" in r.stderr  # checkpoint_4.pt and the final checkpoint_6.pt
    assert load(run / "averaged.pt").meta["averaged_from"] == [str(run / "checkpoint_4.pt"),
                                                              str(run / "checkpoint_6.pt")]
    log = (run / "train.log").read_text()
    assert "lr rises over 10 warmup updates" in log and "done: 6 updates" in log
    before = _files(run)
    r = run_nmt(*_cli_args(toy_data_dir, run, "--max-steps", "6", "--save-every", "4", "--average-last", "3"))
    assert r.returncode == 0, r.stderr
    assert r.stderr.strip() == (f"{run} already reached its stop (update 6 of --max-steps 6); nothing done: raise "
                                "that stop (--max-steps, --max-time, --max-epochs or --patience) to train further")
    assert _files(run) == before
    r = run_nmt(*_cli_args(toy_data_dir, run, "--max-steps", "8", "--save-every", "4", "--average-last", "3"))
    assert r.returncode == 0, r.stderr
    assert f"resuming {run} at update 6" in r.stderr and "done: 8 updates" in r.stderr
    assert load(run / "checkpoint_last.pt").train_state["step"] == 8
    assert load(run / "averaged.pt").meta["averaged_from"][-1] == str(run / "checkpoint_8.pt")


def test_the_header_warns_of_slow_bf16_and_says_where_metrics_go(toy_data_dir, tmp_path, monkeypatch):
    import importlib.util

    from nmt_cli.runtime import precision

    monkeypatch.setattr(precision, "cpu_has_fast_bf16", lambda: False)
    events = []
    train(small_cfg(toy_data_dir, tmp_path / "run", max_steps=2, precision="bf16"), progress=events.append)
    start = events[0]
    assert start["kind"] == "start" and "no native bf16" in start["slow_precision"]
    if importlib.util.find_spec("tensorboard") is None:
        assert "TensorBoard is not installed" in start["tensorboard_note"]
    else:
        assert start["tensorboard_note"] is None and (tmp_path / "run" / "tensorboard").is_dir()


def test_cli_trains_then_sigterm_saves_and_exits(toy_data_dir, tmp_path):
    run = tmp_path / "run"
    r = run_nmt(*_cli_args(toy_data_dir, run, "--max-steps", "12", "--save-every", "6", "--log-every", "4"))
    assert r.returncode == 0, r.stderr
    assert "update 12/" in r.stderr and "done: 12 updates" in r.stderr
    # a long run, stopped by SIGTERM: a checkpoint is written and the process exits without a traceback
    proc = subprocess.Popen([sys.executable, "-m", "nmt_cli.cli",
                             *map(str, _cli_args(toy_data_dir, run, "--max-steps", "100000", "--log-every", "1"))],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        _wait_for(lambda: _updates(run) > 12, 120, "an update past 12 after the resume")
    finally:
        proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert "SIGTERM" in err and "Traceback" not in err
    state = load(run / "checkpoint_last.pt").train_state
    assert state["step"] > 12  # resumed from 12 and went on before the signal


def test_tiny_model_learns_the_sample_corpus_in_seconds(sample_data_dir, tmp_path):
    cfg = small_cfg(sample_data_dir, tmp_path / "run", model={**SMALL, "d_model": 64, "d_ff": 128},
                    max_tokens=1024, warmup=30, lr=5e-3, max_steps=100, log_every=10)
    result = train(cfg)
    first, last = result.history[0], result.history[-1]
    assert last["loss"] < 0.7 * first["loss"]
    assert result.valid["valid_ppl"] < 0.1 * 400  # far below uniform over the vocabulary


def test_a_run_started_idle_drops_a_thread_when_a_neighbour_arrives(toy_data_dir, tmp_path, monkeypatch):
    """Automatic threads are counted again during the run (cpus.Watch): a run that chose 2 threads on an idle
    machine goes down to 1 once a busy neighbour takes a core, and says so in metrics.jsonl. The machine is counters
    the test advances (a second of its time per look; the neighbour arrives at the third), not the real one."""
    monkeypatch.setattr(cpus, "default_threads", lambda procs=1: cpus.ThreadChoice(2, "2 cores, 0 busy: 2 threads"))
    ticks = {"busy": 0.0, "total": 0.0, "looks": 0}

    def snapshot(_cpus):  # each look: one more second of a 2-core machine, a neighbour busy on a core from the 3rd
        ticks["looks"] += 1
        ticks["busy"] += 100.0 if ticks["looks"] >= 3 else 0.0
        ticks["total"] += 200.0
        return ticks["busy"], ticks["total"], 0.0

    real_watch, real_poll = cpus.Watch, cpus.Watch.poll
    monkeypatch.setattr(cpus, "Watch", lambda: real_watch(every_s=0.0, snapshot=snapshot, clock=lambda: 0.0,
                                                          cpus={0, 1}))

    def poll(self, current):  # the run stops once a look changes the count
        choice = real_poll(self, current)
        if choice is not None:
            os.kill(os.getpid(), signal.SIGTERM)
        return choice

    monkeypatch.setattr(real_watch, "poll", poll)
    before = torch.get_num_threads()
    guard = threading.Timer(120, os.kill, (os.getpid(), signal.SIGTERM))  # (ends a run that never sees the neighbour)
    guard.start()
    try:
        result = train(small_cfg(toy_data_dir, tmp_path / "run", threads=None, max_steps=10**6))
    finally:
        guard.cancel()
        torch.set_num_threads(before)
    assert result.stopped_by == "signal"
    events = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [e for e in events if e["kind"] == "start"][0]["threads"] == 2
    changes = [e for e in events if e["kind"] == "threads"]
    assert changes and changes[0]["threads"] == 1 and "busy" in changes[0]["reason"], changes
    assert changes[0]["step"] == 2  # the looks after updates 1 (idle) and 2 (the neighbour's first second)


def test_the_train_state_is_a_state_dict_of_its_own():
    """state.TrainState: what checkpoint_last.pt holds besides the optimizer, as plain data that round-trips; an
    older nmt's per-rank data position is scaled to the global one."""
    from nmt_cli.training.state import Best, TrainState

    state = TrainState(Best("valid_bleu", 31.5, 400, 2), step=420, epoch=3, pos=17, elapsed=12.5, overflows=1,
                       validations=2, valid_seconds=3.0, saves=4, save_seconds=0.5, probed_max_tokens=9000,
                       world_size=2)
    saved = state.state_dict()
    assert saved["pos_global"] is True and saved["best"] == 31.5 and saved["bad_valids"] == 2
    again = TrainState(Best("valid_bleu"))
    again.load_state_dict(saved)
    assert again == state
    older = TrainState()
    older.load_state_dict({**saved, "pos_global": False})
    assert older.pos == 34  # 17 batches on each of 2 ranks
