"""One training process: `Trainer.fit()` runs the recipe of "Attention Is All You Need".

    for each update (reader.py: the next processes x update-freq batches, dealt to the ranks; their real tokens):
        accumulate update_freq micro-batches (DDP gradient sync only on the last), label-smoothed loss summed
        gradients /= the update's target tokens; optional clipping; lr = d^-0.5 min(step^-0.5, step warmup^-1.5); Adam
        stop? save? validate? (by the clock) raised by any rank, agreed by all a step later (distributed/votes.py)
        log / validate (validate.py) / save (checkpoint_manager.py) / stop, each on its own schedule (checkpoint_manager.Periodic)

Only rank 0 logs and writes files. The Trainer holds the model, the optimizer and the counters, and runs the loop;
beside it: `reader.py` (the data position, each epoch's order, prefetch), `checkpoint_manager.py` (what is saved when, the
training state a resume restores, averaging at the end), `validate.py`, `metrics_log.py` (the log and the run's
header). The run around it: `plan.py` (checks before anything is written, the batches), `launch.py` (one process,
spawned processes or torchrun's), `distributed/` (processes, votes, DDP, watchdog, signals).
"""

from __future__ import annotations

import contextlib
import functools
import math
import random
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import numpy as np
import torch

from nmt_cli.atomic import remove_stale_tmp
from nmt_cli.checkpoints.format import load
from nmt_cli.config import PAD_ID
from nmt_cli.data.shortlist import from_data_dir
from nmt_cli.data.store import ParallelData, load_manifest, read_tokenizer
from nmt_cli.errors import CheckpointError, TrainingError
from nmt_cli.runtime import cpus
from nmt_cli.runtime.memory import SAFETY, out_of_memory_advice
from nmt_cli.training.checkpoint_manager import Periodic, RunCheckpoints, weights_digest
from nmt_cli.training.config import probe_cap, probed_batching
from nmt_cli.training.distributed.ddp import data_parallel
from nmt_cli.training.distributed.process import Runtime
from nmt_cli.training.distributed.signals import StopSignals
from nmt_cli.training.distributed.votes import Votes
from nmt_cli.training.files import BEST, LAST
from nmt_cli.training.loss import label_smoothed_cross_entropy
from nmt_cli.training.metrics_log import MetricsLog, Window, start_event
from nmt_cli.training.plan import RunPlan, bucket_positions, repacked, write_run_config
from nmt_cli.training.probe import probe_ranks
from nmt_cli.training.reader import TrainReader, Update
from nmt_cli.training.schedule import inverse_sqrt_lr
from nmt_cli.training.state import Best, TrainState, plain, rng_state, set_rng_state
from nmt_cli.training.validate import PerDirection, Validator, validator_for

Progress = Callable[[dict], None]
MIN_FP16_SCALE = 2.0**-10


@dataclass
class UpdateStats:
    """One update: this rank's loss sums (a device tensor, read only when needed) and the token totals over all
    ranks."""

    losses: torch.Tensor  # [2] this rank's sums of the label-smoothed loss and the nll, on the training device
    tgt_tokens: float
    src_tokens: float
    skipped: bool = False  # fp16 overflow: the update was not applied
    lr: float = 0.0

    @property
    def loss_sum(self) -> float:  # (reading it waits for the device)
        return float(self.losses[0])

    @property
    def nll_sum(self) -> float:
        return float(self.losses[1])


@dataclass
class TrainResult:
    out_dir: str
    step: int
    epoch: int
    elapsed: float  # seconds of training (cumulative over resumes)
    stopped_by: str  # max_steps | max_epochs | max_time | patience | signal | already (see `already`)
    last: str
    best: str | None = None
    averaged: str | None = None
    valid: dict | None = None
    best_valid: float | None = None  # the best value of `criterion`, reached at update `best_step`
    criterion: str = "valid_nll"
    best_step: int | None = None
    overflows: int = 0
    signum: int | None = None
    history: list = field(default_factory=list)
    ranks_agree: bool | None = None  # distributed runs: every rank ended with bitwise identical weights
    validations: int = 0  # over the whole run (all its resumes), and the seconds they took
    valid_seconds: float = 0.0
    saves: int = 0  # checkpoint_last.pt writes (with their checkpoint_<step>.pt), and the seconds that writing took
    save_seconds: float = 0.0  # (checkpoint_best.pt and the averaging at the end included)
    already: str | None = None  # the run had reached this stop before this command: nothing was trained


class Trainer:
    """One training process: the model, its optimizer and `fit`, over a data reader (reader.py), a validation
    (validate.py) and the run's checkpoints (checkpoint_manager.py)."""

    def __init__(self, plan: RunPlan, rt: Runtime, progress: Progress | None = None,
                 clock: Callable[[], float] = time.monotonic):
        self.plan, self.cfg, self.rt = plan, plan.cfg, rt
        self.clock = clock  # seconds, for the run's time, --max-time and the saves by minutes (tests give their own)
        self.progress = progress if rt.is_main else None
        self.out_dir = plan.out_dir
        cfg, device = self.cfg, rt.device
        self.tokenizer = read_tokenizer(cfg.data_dir)
        manifest = load_manifest(cfg.data_dir)
        self.train_data = ParallelData(cfg.data_dir, "train", manifest)
        self.valid_data = ParallelData(cfg.data_dir, "valid", manifest) if plan.has_valid else None
        # model: identical initialisation on every rank, then rank-specific dropout streams
        torch.manual_seed(cfg.seed)
        np.random.seed(cfg.seed)
        random.seed(cfg.seed)
        from nmt_cli.model import Transformer

        self.module = Transformer(plan.model_config).to(device)
        if rt.rank:
            torch.manual_seed(cfg.seed + 1000 * rt.rank)
        self.params = [p for p in self.module.parameters() if p.requires_grad]
        self.optimizer = torch.optim.Adam(self.params, lr=0.0, betas=tuple(cfg.adam_betas), eps=cfg.adam_eps,
                                          **_adam_impl(device))
        self.scaler = rt.make_scaler()
        # the counters, the data position, the best validation: what a resume goes on from (state.py)
        self.state = TrainState(Best("valid_bleu" if cfg.valid_bleu else "valid_nll"), world_size=rt.world_size)
        self.metrics: MetricsLog | None = None  # rank 0's log, while fit() runs
        self.session_start: float | None = None  # self.clock() when fit() started, and `elapsed` then
        self.elapsed_before = 0.0
        self.probe_source = ""  # where the probed micro-batch came from, for the run's header
        # the data's vocabulary shortlist travels in every checkpoint (rank 0 writes them; learned if the data
        # directory has none: data/shortlist.py)
        shortlist = from_data_dir(cfg.data_dir, manifest).to_dict() if rt.is_main else None
        self.checkpoints = RunCheckpoints(self.out_dir, plan.model_config, self.tokenizer, plan.langs, plan.keep_last,
                                          shortlist)
        if plan.resume_from:
            self.load_state_dict(*self.checkpoints.restore(plan.resume_from))
        elif plan.init_from:  # fine-tuning: the weights only (a new optimizer, schedule and step counter)
            self.module.load_state_dict(load(plan.init_from, map_location=device).model_state)
        if plan.batching.probe:
            self._probe_batching()
        b = self.plan.batching
        self.reader = TrainReader(self.train_data, self.plan.batches, b.update_freq, rt.rank, rt.world_size,
                                  cfg.seed, cfg.max_epochs, b.max_tokens, bucket_positions(self.plan),
                                  pin_memory=device.type == "cuda", position=(self.state.epoch, self.state.pos))
        self.model = self._compiled(self.module) if cfg.compile else self.module
        if rt.distributed:  # DDP around the compiled model: see `data_parallel`
            self.model = data_parallel(self.model, rt)
        # what a killed save left behind (kill -9 during torch.save: NAME.XXXX.tmp files of up to a checkpoint each)
        self.stale_tmp = remove_stale_tmp(self.out_dir) if rt.is_main and self.out_dir.is_dir() else (0, 0)

    @property
    def epoch(self) -> int:
        return self.reader.epoch

    @property
    def step(self) -> int:
        return self.state.step

    @property
    def best(self) -> Best:
        return self.state.best

    # -- the state a checkpoint holds -------------------------------------------------------------------------------

    def state_dict(self, rngs: list) -> dict:
        """checkpoint_last.pt's training state: the TrainState (with the reader's data position), the optimizer's and
        the loss scaler's states, every rank's RNG states `rngs` (`rng_state`, gathered) and the options."""
        state = self.state
        state.epoch, state.pos, state.world_size = self.reader.epoch, self.reader.pos, self.rt.world_size
        return {**state.state_dict(), "optimizer": self.optimizer.state_dict(),
                "scaler": self.scaler.state_dict() if self.scaler is not None else None,
                "rng": rngs, "config": plain(self.cfg.to_dict())}

    def load_state_dict(self, model_state: dict, ts: dict) -> None:
        """Resume from `state_dict`'s dict and the weights `model_state`: this rank's RNG streams where the world
        size is the saved one (else seeded anew from the update), the probed micro-batch with --max-tokens auto."""
        try:
            self.module.load_state_dict(model_state)
            self.optimizer.load_state_dict(ts["optimizer"])
            if self.scaler is not None and ts.get("scaler"):
                self.scaler.load_state_dict(ts["scaler"])
            self.state.load_state_dict(ts)
            rngs = ts.get("rng") or []
        except (KeyError, ValueError, RuntimeError, TypeError) as exc:
            raise CheckpointError(f"{self.plan.resume_from}: training state does not fit this run "
                                  f"({str(exc).splitlines()[0][:150]}); pick another -o") from exc
        if self.cfg.max_tokens != "auto":
            self.state.probed_max_tokens = None
        if self.state.world_size != self.rt.world_size:  # the data position holds for any world size; RNGs do not
            torch.manual_seed(self.cfg.seed + 1000 * self.rt.rank + self.state.step)
        elif self.rt.rank < len(rngs):
            set_rng_state(rngs[self.rt.rank], self.rt.device)

    def _probe_batching(self) -> None:
        """--max-tokens auto on a GPU: the largest micro-batch that fits every rank's GPU (probe.py), found when the
        run started (a resumed run keeps it, and so its batches and data position); the batches packed for it."""
        if self.state.probed_max_tokens is None:
            data = self.train_data
            longest = int(max(data.src_lengths.max(), data.tgt_lengths.max())) + 1  # + EOS (BOS on the target side)
            self.state.probed_max_tokens = probe_ranks(self.module, self.optimizer, self.rt, longest, probe_cap(self.plan.batching),
                                      self.cfg.label_smoothing)
            self.probe_source = f"probed: {SAFETY:.0%} of the largest that fit, at {longest}-token sentences"
        else:
            self.probe_source = "found when the run started"
        self.plan = repacked(self.plan, probed_batching(self.cfg, self.plan.batching, self.state.probed_max_tokens), self.train_data)
        if self.rt.is_main:
            write_run_config(self.plan)  # config.json records the batch sizes used

    def _compiled(self, module: torch.nn.Module) -> torch.nn.Module:
        """torch.compile for the batches' fixed shapes (`dynamic=False`: code specialised to each, no symbolic
        sizes), with dynamo's recompile limit (process-wide) raised above their number so that none falls back to
        eager; or, with --compile-shapes dynamic, once with symbolic batch and length sizes (`dynamic=True`) for the
        eager batches, padded only to their own longest sentences (one compilation instead of one a shape, and
        less padding; whether its code is as fast is for a GPU to measure)."""
        if self.reader.batch_shape is None:
            return torch.compile(module, dynamic=True)
        torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, self.reader.shapes() + 8)
        return torch.compile(module, dynamic=False)

    # -- one update -----------------------------------------------------------------------------------------------

    def update(self, update: Update) -> UpdateStats:
        """Forward/backward every micro-batch of `update`, then one optimizer step.

        Nothing here waits for the device: the update's token totals are known on the host (reader.py), and the loss
        stays on the device until `_read_losses` (log lines, validations and saves). fp16 is the exception: whether
        the loss scaler skipped the update is read at once.
        """
        rt, model = self.rt, self.model
        model.train()
        losses = torch.zeros(2, dtype=torch.float32, device=rt.device)
        micro_batches = update.micro_batches
        for i, batch in enumerate(micro_batches):
            batch = batch.to(rt.device, non_blocking=True)
            sync = i == len(micro_batches) - 1 or not rt.distributed
            with contextlib.nullcontext() if sync else model.no_sync():
                with rt.autocast():
                    logits = model(batch.src, batch.tgt_in, batch.src_pad_mask)  # [B, T, V]
                loss, nll, _ = label_smoothed_cross_entropy(logits, batch.tgt_out, self.cfg.label_smoothing, PAD_ID)
                (self.scaler.scale(loss) if self.scaler is not None else loss).backward()
            losses += torch.stack([loss.detach(), nll])
        lr = self._step_optimizer(update.tgt_tokens)
        return UpdateStats(losses, update.tgt_tokens, update.src_tokens, skipped=lr < 0, lr=max(lr, 0.0))

    def _read_losses(self, pending: list[tuple[int, torch.Tensor]]) -> tuple[float, float]:
        """Sums over all ranks of the loss and nll of the updates in `pending` ((step, losses) pairs); the one place
        the loop waits for the device. A loss that is not finite stops the run naming its update."""
        if not pending:
            return 0.0, 0.0
        values = self.rt.all_reduce_sum(torch.stack([t for _, t in pending]).to(torch.float64)).tolist()
        for (step, _), (loss, _) in zip(pending, values, strict=True):
            if not math.isfinite(loss):
                raise TrainingError(f"the training loss became {loss} at update {step}; lower --lr, raise --warmup "
                                    "or set --clip-norm, and resume from the last checkpoint")
        pending.clear()
        return sum(v[0] for v in values), sum(v[1] for v in values)

    def _step_optimizer(self, tgt_tokens: float) -> float:
        """Normalise summed gradients by the update's target tokens, clip, set the lr, step. -1.0 if skipped."""
        if self.scaler is not None:
            self.scaler.unscale_(self.optimizer)
        grads = [p.grad for p in self.params if p.grad is not None]
        # DDP averaged the per-rank sums over ranks: x world_size / tokens turns that into the mean per token
        torch._foreach_mul_(grads, self.rt.world_size / max(tgt_tokens, 1.0))
        if self.cfg.clip_norm > 0:
            torch.nn.utils.clip_grad_norm_(self.params, self.cfg.clip_norm)
        lr = inverse_sqrt_lr(self.state.step + 1, self.plan.model_config.d_model, self.plan.warmup, self.cfg.lr)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        skipped = False
        if self.scaler is not None:
            scale = self.scaler.get_scale()
            self.scaler.step(self.optimizer)
            self.scaler.update()
            skipped = self.scaler.get_scale() < scale
            if skipped and self.scaler.get_scale() < MIN_FP16_SCALE:
                raise TrainingError(f"fp16 loss scale fell below {MIN_FP16_SCALE} at update {self.state.step + 1}: the loss "
                                    "keeps overflowing; use --precision bf16/fp32 or lower --lr")
        else:
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return -1.0 if skipped else lr

    # -- validation -----------------------------------------------------------------------------------------------

    @functools.cached_property
    def validator(self) -> Validator | PerDirection | None:
        """The valid split dealt to this rank (validate.py); None without one. Made at the first validation, after
        the batch sizes are final."""
        cfg = self.cfg
        return validator_for(self.valid_data, self.tokenizer, self.rt, self.plan.batching.max_tokens,
                             cfg.label_smoothing, self.plan.model_config.max_positions,
                             cfg.valid_beam if cfg.valid_bleu else None)

    def validate(self) -> dict | None:
        """Loss, nll and perplexity on the valid split, plus BLEU when asked: sharded over the ranks, the same
        figures on every rank (validate.py)."""
        if self.validator is None:
            return None
        self.module.eval()
        out = self.validator(self.module, self.state.step)
        self.module.train()
        return out

    def _validate_and_track(self, metrics: MetricsLog) -> dict | None:
        start = self.clock()
        valid = self.validate()
        if valid is None:
            return None
        seconds = self.clock() - start
        self.state.validations += 1
        self.state.valid_seconds += seconds
        improved = self.state.best.improved(valid, self.state.step)
        if improved and self.rt.is_main:
            start = self.clock()
            self.checkpoints.save_best(self.module.state_dict(), self._meta(valid))
            self.state.save_seconds += self.clock() - start
        record = {"kind": "valid", "step": self.state.step, "epoch": self.epoch, **valid,
                  f"best_{self.state.best.criterion}": self.state.best.value, "improved": improved,
                  "criterion": self.state.best.criterion, "seconds": round(seconds, 3)}
        metrics.write(record)
        self._emit(record)
        return valid

    # -- checkpoints ----------------------------------------------------------------------------------------------

    def save(self, periodic: bool, valid: dict | None) -> None:
        """checkpoint_last.pt (full state) and, if `periodic`, checkpoint_<step>.pt (weights). Collective. Rank 0
        counts and times it (metrics.jsonl's `save` records; the training state it writes counts it, without its
        seconds, not known yet)."""
        start = self.clock()
        rngs = self.rt.gather_objects(rng_state(self.rt.device))
        if self.rt.is_main:
            self.state.saves += 1
            path = self.checkpoints.save(self.module.state_dict(), self._meta(valid), self.state_dict(rngs), periodic)
            seconds = self.clock() - start
            self.state.save_seconds += seconds
            record = {"kind": "save", "step": self.state.step, "periodic": periodic, "seconds": round(seconds, 3)}
            if self.metrics is not None:
                self.metrics.write(record)
            self._emit({**record, "path": str(path)})

    def _meta(self, valid: dict | None) -> dict:
        return {"step": self.state.step, "epoch": self.epoch, "preset": self.cfg.preset, **(valid or {})}

    def _average_at_end(self) -> str | None:
        n = self.plan.average_last
        if not n or not self.rt.is_main:
            return None
        start = self.clock()
        path, used = self.checkpoints.average(n, lambda message: self._emit({"kind": "note", "message": message}))
        self.state.save_seconds += self.clock() - start
        self._emit({"kind": "averaged", "path": str(path), "n": used, "wanted": n})
        return str(path)

    # -- reporting ------------------------------------------------------------------------------------------------

    def _emit(self, event: dict) -> None:
        if self.progress is not None:
            self.progress(event)

    def _eta(self, seconds_per_update: float) -> float | None:
        left = [(self.plan.max_steps - self.state.step) * seconds_per_update]
        if self.cfg.max_time:
            left.append(self.cfg.max_time * 60 - self.state.elapsed)
        return max(0.0, min(left))

    # -- the loop -------------------------------------------------------------------------------------------------

    def fit(self) -> TrainResult:
        """Train to the end (see the module docstring); running out of device memory ends it with one line naming
        the options to lower."""
        with out_of_memory_advice(self._out_of_memory):
            return self._fit()

    def _out_of_memory(self) -> str:
        b = self.plan.batching
        beam = f" (or --valid-beam, now {self.cfg.valid_beam})" if self.cfg.valid_bleu else ""
        return (f"out of {self.rt.device.type.upper()} memory at update {self.state.step + 1} with micro-batches of up to "
                f"{b.max_tokens} padded tokens; lower --max-tokens{beam} (--update-freq auto keeps the update size; "
                f"with a fixed --update-freq raise it as you lower --max-tokens) and run again: it resumes from the last "
                "checkpoint")

    def _fit(self) -> TrainResult:
        cfg, plan, rt = self.cfg, self.plan, self.rt
        metrics = self.metrics = MetricsLog(self.out_dir, rt.is_main)
        if rt.is_main:  # (the other ranks neither log nor display)
            start = {**start_event(self.plan, rt, self.state, self.module.num_parameters(), self.reader,
                                   self.stale_tmp, self.probe_source), "tensorboard_note": metrics.note}
            metrics.write({"kind": "start", "step": self.state.step, **{k: v for k, v in start.items() if k != "kind"}})
            self._emit(start)
        window, history, valid, stopped_by = Window(), [], None, "max_steps"
        last_window = window
        pending: list[tuple[int, torch.Tensor]] = []  # losses not read from the device yet
        shown: dict = {}  # the last loss figures read (for the live display between log lines)
        session_start = self.session_start = self.clock()
        saves = Periodic(plan.save_every, plan.save_minutes, session_start, self.clock)  # (checkpoint_manager.py)
        valids = Periodic(plan.valid_every, plan.valid_minutes, session_start, self.clock)
        elapsed_before = self.elapsed_before = self.state.elapsed
        watch = cpus.Watch() if plan.recheck_threads and rt.device.type == "cpu" else None
        votes = Votes(rt)  # stop, save and validate, agreed by every rank (a step late where there are several)
        with StopSignals() as signals:
            while self.state.step < plan.max_steps:
                t0 = self.clock()
                self.state.elapsed = elapsed_before + t0 - session_start
                out_of_time = bool(cfg.max_time) and self.state.elapsed >= cfg.max_time * 60
                time_to_save, time_to_validate = saves.time_is_up(t0), valids.time_is_up(t0)
                update = self.reader.next_update()
                if update is None:
                    stopped_by = "max_epochs"
                    break
                stats = self.update(update)
                stop, save_now, validate_now = votes.exchange(
                    signals.signum is not None or (rt.is_main and out_of_time), rt.is_main and time_to_save,
                    rt.is_main and time_to_validate)
                if stats.skipped:
                    self.state.overflows += 1
                    self._emit({"kind": "overflow", "step": self.state.step, "overflows": self.state.overflows})
                else:
                    self.state.step += 1
                    pending.append((self.state.step, stats.losses))
                    window.add(stats.tgt_tokens, stats.src_tokens, self.clock() - t0)
                self.state.elapsed = elapsed_before + self.clock() - session_start
                if self.state.step % cfg.log_every == 0 or stop:
                    window.add_losses(*self._read_losses(pending))
                    shown = window.summary()
                    record = {"kind": "train", "step": self.state.step, "epoch": self.epoch, "lr": stats.lr,
                              "elapsed": round(self.state.elapsed, 3), "overflows": self.state.overflows, **shown}
                    metrics.write(record)
                    history.append(record)
                    last_window, window = window, Window()
                if watch is not None and (choice := watch.poll(torch.get_num_threads())) is not None:
                    torch.set_num_threads(choice.threads)  # a neighbour came or went (cpus.Watch)
                    event = {"kind": "threads", "step": self.state.step, "threads": choice.threads, "reason": choice.reason}
                    metrics.write(event)
                    self._emit(event)
                pace = window if window.updates else last_window  # a line right after a log shows the last window's
                self._emit({"kind": "train", "step": self.state.step, "epoch": self.epoch, "lr": stats.lr,
                            "elapsed": self.state.elapsed, "eta": self._eta(pace.seconds / max(pace.updates, 1)),
                            "max_steps": plan.max_steps, **shown, **pace.speed()})
                if stop:
                    stopped_by = "signal" if signals.signum is not None else "max_time"
                    break
                save_due, valid_due = saves.due(self.state.step, save_now), valids.due(self.state.step, validate_now)
                if save_due or valid_due:
                    window.add_losses(*self._read_losses(pending))  # never validate or save a diverged model
                    if valid_due:
                        valid = self._validate_and_track(metrics)
                        valids.done(self.state.step)
                    if save_due:  # (its checkpoint records the validation figures of its own update only)
                        self.save(periodic=True, valid=valid if valids.done_at == self.state.step else None)
                        saves.done(self.state.step)
                    if valid_due and cfg.patience and self.state.best.bad >= cfg.patience:
                        stopped_by = "patience"
                        break
            votes.drain()
            signum = signals.signum
            self._read_losses(pending)
            if stopped_by == "signal":
                # torchrun kills a process 30 s after SIGTERM: save the state first, and nothing else
                self.reader.close()
                if saves.done_at != self.state.step:
                    self.save(periodic=False, valid=None)
                return self._finish(metrics, stopped_by, signum, None, None, history, None)
        # the end: validate and save the final state unless that just happened
        if valids.done_at != self.state.step:
            valid = self._validate_and_track(metrics)
        if saves.done_at != self.state.step:
            self.save(periodic=True, valid=valid)
        averaged = self._average_at_end()
        digests = self.rt.gather_objects(weights_digest(self.module)) if rt.distributed else None
        return self._finish(metrics, stopped_by, signum, valid, averaged, history, digests)

    def _finish(self, metrics: MetricsLog, stopped_by: str, signum: int | None, valid: dict | None,
                averaged: str | None, history: list, digests: list | None) -> TrainResult:
        best = self.out_dir / BEST
        if self.session_start is not None:  # (the end's validation, save and averaging count in the run's time)
            self.state.elapsed = self.elapsed_before + self.clock() - self.session_start
        result = TrainResult(
            out_dir=str(self.out_dir), step=self.state.step, epoch=self.epoch, elapsed=self.state.elapsed, stopped_by=stopped_by,
            last=str(self.out_dir / LAST), best=str(best) if best.exists() else None, averaged=averaged, valid=valid,
            best_valid=self.state.best.value, criterion=self.state.best.criterion, best_step=self.state.best.step,
            overflows=self.state.overflows,
            signum=signum, history=history, ranks_agree=None if digests is None else len(set(digests)) == 1,
            validations=self.state.validations, valid_seconds=self.state.valid_seconds, saves=self.state.saves,
            save_seconds=self.state.save_seconds)
        self.reader.close()
        metrics.write({"kind": "end", "step": self.state.step, "stopped_by": stopped_by, "elapsed": self.state.elapsed,
                       f"best_{self.state.best.criterion}": self.state.best.value, "best_step": self.state.best.step,
                       "overflows": self.state.overflows, "validations": self.state.validations,
                       "valid_seconds": round(self.state.valid_seconds, 3), "saves": self.state.saves,
                       "save_seconds": round(self.state.save_seconds, 3)})
        metrics.close()
        self._emit({"kind": "end", **asdict(result)})
        return result


def _adam_impl(device: torch.device) -> dict:
    """The fastest Adam implementation available: fused kernels (CUDA, and CPU in recent torch), else foreach."""
    return {"fused": True} if device.type in ("cuda", "cpu") and _fused_adam_ok(device) else {"foreach": True}


def _fused_adam_ok(device: torch.device) -> bool:
    try:
        p = torch.zeros(1, device=device, requires_grad=True)
        torch.optim.Adam([p], fused=True)
        return True
    except (RuntimeError, TypeError, ValueError):
        return False
