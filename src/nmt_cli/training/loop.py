"""One training process: `Trainer.fit()` runs the recipe of "Attention Is All You Need".

    for each update:
        accumulate update_freq micro-batches (DDP gradient sync only on the last), label-smoothed loss summed
        one all-reduce of [loss, nll, tokens, stop?, save?] so every rank agrees on what happens next
        gradients /= total target tokens; optional clipping; lr = d^-0.5 min(step^-0.5, step warmup^-1.5); Adam
        validate / save / stop as agreed

Only rank 0 logs and writes files; an update's batches are dealt to the ranks (`batching.deal`). The run around
it: `plan.py` (checks before anything is written, the batches), `launch.py` (one process, spawned processes or
torchrun's), `signals.py`, `metrics_log.py`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import math
import random
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field

import numpy as np
import torch

from nmt_cli import cpus
from nmt_cli.checkpoint import Checkpoint, load, remove_stale_tmp, save
from nmt_cli.config import PAD_ID
from nmt_cli.data.batching import (
    LengthOrder,
    bucket_shape,
    deal,
    epoch_order,
    flat_padding_efficiency,
    padding_efficiency,
    split,
)
from nmt_cli.data.store import Batch, ParallelData, collate, load_manifest, read_tokenizer
from nmt_cli.errors import CheckpointError, TrainingError
from nmt_cli.memory import SAFETY, OutOfMemory, out_of_memory_advice
from nmt_cli.precision import slow_bf16_warning
from nmt_cli.training.checkpoints import (
    AVERAGED,
    BEST,
    LAST,
    average_checkpoints,
    last_checkpoints,
    periodic_name,
    prune_periodic,
    rng_state,
    set_rng_state,
)
from nmt_cli.training.loss import label_smoothed_cross_entropy
from nmt_cli.training.metrics_log import MetricsLog, Window
from nmt_cli.training.plan import RunPlan, _plain, train_batches, write_run_config
from nmt_cli.training.runtime import DTYPES, Runtime
from nmt_cli.training.schedule import inverse_sqrt_lr, peak_lr
from nmt_cli.training.signals import StopSignals
from nmt_cli.training.validate import Validator

Progress = Callable[[dict], None]
MIN_FP16_SCALE = 2.0**-10


@dataclass
class UpdateStats:
    """One update: this rank's loss sums (a device tensor, read only when needed), the token totals over all ranks
    and the flags every rank agreed on."""

    losses: torch.Tensor  # [2] this rank's sums of the label-smoothed loss and the nll, on the training device
    tgt_tokens: float
    src_tokens: float
    stop: bool
    save: bool
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
    already: str | None = None  # the run had reached this stop before this command: nothing was trained


class Trainer:
    """One training process: model, optimizer, data position and the loop."""

    def __init__(self, plan: RunPlan, rt: Runtime, progress: Progress | None = None):
        self.plan, self.cfg, self.rt = plan, plan.cfg, rt
        self.progress = progress if rt.is_main else None
        self.out_dir = plan.out_dir
        cfg, device = self.cfg, rt.device
        self.tokenizer = read_tokenizer(cfg.data_dir)
        manifest = load_manifest(cfg.data_dir)
        self.train_data = ParallelData(cfg.data_dir, "train", manifest)
        self.batch_shape: Callable[[np.ndarray], tuple[int, int]] | None = None  # compiled: (rows, length) of a batch
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
        self.step, self.epoch = 0, 1
        self.pos = 0  # the data position: batches of this epoch's order (`epoch_order`, all ranks') trained on
        self.elapsed, self.best, self.bad_valids, self.overflows = 0.0, None, 0, 0
        self.best_step: int | None = None
        self.probed: int | None = None  # --max-tokens auto: the micro-batch the probe found (probe.py)
        self.probe_source = ""  # where `probed` came from, for the run's header
        self.criterion = "valid_bleu" if cfg.valid_bleu else "valid_nll"  # what "best" means
        if plan.resume_from:
            self._restore(load(plan.resume_from))
        elif plan.init_from:  # fine-tuning: the weights only (a new optimizer, schedule and step counter)
            self.module.load_state_dict(load(plan.init_from, map_location=device).model_state)
        if plan.batching.probe:
            self._probe_batching()
        self._make_batches(repack=plan.batching.probe)
        self.model = self._compiled(self.module) if cfg.compile else self.module
        if rt.distributed:  # DDP around the compiled model: see `data_parallel`
            self.model = data_parallel(self.model, rt)
        # what a killed save left behind (kill -9 during torch.save: NAME.XXXX.tmp files of up to a checkpoint each)
        self._stale = remove_stale_tmp(self.out_dir) if rt.is_main and self.out_dir.is_dir() else (0, 0)
        self._epoch_cache: dict[int, list] = {}
        self._loader = ThreadPoolExecutor(max_workers=1, thread_name_prefix="nmt-batches")
        self._prefetch = None  # ((epoch, pos) the batches start at, Future of their collation)

    # -- batches --------------------------------------------------------------------------------------------------

    def _probe_batching(self) -> None:
        """--max-tokens auto on a GPU: try micro-batches at the data's longest sentences on this process's GPU
        (probe.py; before DDP and torch.compile wrap the model), take the smallest answer of all ranks, and plan
        the batches with it."""
        from nmt_cli.training.config import probe_cap, probed_batching
        from nmt_cli.training.probe import largest_train_batch

        if self.probed is not None:  # resumed: the run's first probe, so the batches (and the data position) stay
            self.probe_source = "found when the run started"
            self.plan = dataclasses.replace(self.plan, batching=probed_batching(self.cfg, self.plan.batching,
                                                                                self.probed))
            return
        data = self.train_data
        longest = int(max(data.src_lengths.max(), data.tgt_lengths.max())) + 1  # + EOS (BOS on the target side)
        found = largest_train_batch(self.module, self.optimizer, self.rt.autocast, longest,
                                    probe_cap(self.plan.batching), self.cfg.label_smoothing,
                                    extra_param_copies=1 if self.rt.distributed else 0)
        answers = self.rt.gather_objects(found)
        if any(a is None for a in answers):
            raise OutOfMemory(f"--max-tokens auto: not even one sentence of {longest} tokens fits in GPU memory "
                              "for a training step; use a smaller model (--preset, --d-model) or --precision bf16")
        self.probed = min(answers)
        self.probe_source = f"probed: {SAFETY:.0%} of the largest that fit, at {longest}-token sentences"
        self.plan = dataclasses.replace(self.plan, batching=probed_batching(self.cfg, self.plan.batching,
                                                                            self.probed))

    def _make_batches(self, repack: bool) -> None:
        """The training batches plan_run packed (`plan.batches`), or, with `repack` (--max-tokens auto's probe
        changed the micro-batch), packed again here (and --update-freq auto counted again: `real_update_freq`)."""
        plan, data = self.plan, self.train_data
        max_positions = plan.model_config.max_positions if self.cfg.compile and self.cfg.compile_shapes == "buckets" \
            else None
        if max_positions is not None:  # compiled: batches of a few shapes, `batch_shape(indices)` each
            src, tgt, max_tokens = data.src_lengths, data.tgt_lengths, plan.batching.max_tokens
            self.batch_shape = lambda idx: bucket_shape(src[idx], tgt[idx], max_tokens, max_positions)
        if not repack:
            self.batches = split(*plan.batches)
        else:
            from nmt_cli.training.config import real_update_freq

            self.batches = train_batches(LengthOrder(data.src_lengths, data.tgt_lengths), plan.batching.max_tokens,
                                         max_positions)
            batching = plan.batching
            if self.cfg.update_freq == "auto":
                batching = dataclasses.replace(batching, update_freq=real_update_freq(
                    batching, float(data.tgt_lengths.sum()) / len(self.batches)))
            sizes = np.array([len(b) for b in self.batches])
            self.plan = dataclasses.replace(plan, batching=batching, batches=(np.concatenate(self.batches), sizes),
                                            mean_tgt_tokens=float(data.tgt_lengths.sum()) / len(self.batches),
                                            mean_src_tokens=float(data.src_lengths.sum()) / len(self.batches))
            if self.rt.is_main:
                write_run_config(self.plan)  # config.json records the batch sizes used

    def _compiled(self, module: torch.nn.Module) -> torch.nn.Module:
        """torch.compile for the batches' fixed shapes (`dynamic=False`: code specialised to each, no symbolic
        sizes), with dynamo's recompile limit (process-wide) raised above their number so that none falls back to
        eager; or, with --compile-shapes dynamic, once with symbolic batch and length sizes (`dynamic=True`) for the
        eager batches, padded only to their own longest sentences (one compilation instead of one a shape, and
        less padding; whether its code is as fast is for a GPU to measure)."""
        if self.batch_shape is None:
            return torch.compile(module, dynamic=True)
        shapes = len({self.batch_shape(idx) for idx in self.batches})
        torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, shapes + 8)
        return torch.compile(module, dynamic=False)

    # -- state ----------------------------------------------------------------------------------------------------

    def _restore(self, ckpt: Checkpoint) -> None:
        ts = ckpt.train_state
        try:
            self.module.load_state_dict(ckpt.model_state)
            self.optimizer.load_state_dict(ts["optimizer"])
            if self.scaler is not None and ts.get("scaler"):
                self.scaler.load_state_dict(ts["scaler"])
            self.step, self.epoch, self.pos = int(ts["step"]), int(ts["epoch"]), int(ts["pos"])
            self.elapsed, self.best, self.best_step = float(ts["elapsed"]), ts.get("best"), ts.get("best_step")
            self.bad_valids, self.overflows = int(ts.get("bad_valids", 0)), int(ts.get("overflows", 0))
            saved_world = int(ts.get("world_size", 1))
            rngs = ts.get("rng") or []
            self.probed = ts.get("probed_max_tokens") if self.cfg.max_tokens == "auto" else None
        except (KeyError, ValueError, RuntimeError, TypeError) as exc:
            raise CheckpointError(f"{self.plan.resume_from}: training state does not fit this run "
                                  f"({str(exc).splitlines()[0][:150]}); pick another -o") from exc
        if not ts.get("pos_global"):  # an older nmt counted each rank's own batches: about the same place
            self.pos *= saved_world
        if saved_world != self.rt.world_size:  # the data position holds for any world size; RNG streams do not
            torch.manual_seed(self.cfg.seed + 1000 * self.rt.rank + self.step)
        elif self.rt.rank < len(rngs):
            set_rng_state(rngs[self.rt.rank], self.rt.device)

    def _train_state(self, rngs: list) -> dict:
        return {
            "step": self.step, "epoch": self.epoch, "pos": self.pos, "pos_global": True, "elapsed": self.elapsed,
            "best": self.best,
            "best_step": self.best_step,
            "bad_valids": self.bad_valids, "overflows": self.overflows, "world_size": self.rt.world_size,
            "optimizer": self.optimizer.state_dict(),
            "scaler": self.scaler.state_dict() if self.scaler is not None else None,
            "rng": rngs, "config": _plain(self.cfg.to_dict()), "probed_max_tokens": self.probed,
        }

    # -- data -----------------------------------------------------------------------------------------------------

    def _epoch_list(self, epoch: int) -> list:
        """All the batches of `epoch`, every rank's, in training order (the current and the next epoch are kept)."""
        if epoch not in self._epoch_cache:
            self._epoch_cache = {e: v for e, v in self._epoch_cache.items() if e >= epoch - 1}
            self._epoch_cache[epoch] = epoch_order(self.batches, epoch, self.cfg.seed)
        return self._epoch_cache[epoch]

    def _indices_after(self, epoch: int, pos: int) -> tuple[list, int, int] | None:
        """This rank's batch indices of the next update from data position (epoch, pos), and the position after
        the update; None after --max-epochs. An update is the next processes x update-freq batches of the epoch's
        order, dealt to the ranks (`deal`): the same sentences for any processes x update-freq of the same product,
        and a position that holds for any number of processes (resume after a change of machines)."""
        if pos >= len(self._epoch_list(epoch)):
            epoch, pos = epoch + 1, 0
        if self.cfg.max_epochs and epoch > self.cfg.max_epochs:
            return None
        b = self.plan.batching
        update = self._epoch_list(epoch)[pos : pos + b.update_freq * b.world_size]
        return deal(update, self.rt.rank, self.rt.world_size), epoch, pos + len(update)

    def _collate(self, chosen: list) -> list[Batch]:
        """Padded micro-batches of `chosen`, in pinned memory when training on a GPU (asynchronous copies)."""
        shape = self.batch_shape or (lambda idx: None)
        # an empty micro-batch (`deal`) is one row of padding; compiled, in the shape of a batch that exists
        batches = [collate([self.train_data[int(i)] for i in idx], shape=shape(idx if len(idx) else self.batches[0]))
                   for idx in chosen]
        return [b.pin_memory() for b in batches] if self.rt.device.type == "cuda" else batches

    def _next_micro_batches(self) -> list[Batch] | None:
        """The next update's micro-batches (fewer at the end of an epoch); None after --max-epochs.

        They were collated in a background thread while the previous update computed; this call starts
        collating the update after them. The data position (epoch, pos) advances only as batches are taken, so
        a checkpoint records exactly what was trained on."""
        nxt = self._indices_after(self.epoch, self.pos)
        if nxt is None:  # past --max-epochs: the run ends at the start of that epoch
            self.epoch, self.pos = self.epoch + 1, 0
            return None
        chosen, self.epoch, self.pos = nxt
        pending, self._prefetch = self._prefetch, None
        batches = pending[1].result() if pending is not None and pending[0] == (self.epoch, self.pos) else None
        if batches is None:
            batches = self._collate(chosen)
        following = self._indices_after(self.epoch, self.pos)
        if following is not None:
            self._prefetch = ((following[1], following[2]), self._loader.submit(self._collate, following[0]))
        return batches

    # -- one update -----------------------------------------------------------------------------------------------

    def update(self, micro_batches: list[Batch], stop: bool = False, save_now: bool = False) -> UpdateStats:
        """Forward/backward every micro-batch, agree on token totals and flags, then one optimizer step.

        Nothing here waits for the device: the batches' token counts are known on the host, the flags are agreed
        over the host-side process group, and the loss stays on the device until `_read_losses` (log lines,
        validations and saves). fp16 is the exception: whether the loss scaler skipped the update is read at once.
        """
        rt, model = self.rt, self.model
        model.train()
        losses = torch.zeros(2, dtype=torch.float32, device=rt.device)
        for i, batch in enumerate(micro_batches):
            batch = batch.to(rt.device, non_blocking=True)
            sync = i == len(micro_batches) - 1 or not rt.distributed
            with contextlib.nullcontext() if sync else model.no_sync():
                with rt.autocast():
                    logits = model(batch.src, batch.tgt_in, batch.src_pad_mask)  # [B, T, V]
                loss, nll, _ = label_smoothed_cross_entropy(logits, batch.tgt_out, self.cfg.label_smoothing, PAD_ID)
                (self.scaler.scale(loss) if self.scaler is not None else loss).backward()
            losses += torch.stack([loss.detach(), nll])
        tgt, src, stop_votes, save_votes = rt.agree_sum([sum(b.n_tgt_tokens for b in micro_batches),
                                                        sum(b.n_src_tokens for b in micro_batches),
                                                        float(stop), float(save_now)])
        stats = UpdateStats(losses, tgt, src, stop_votes > 0, save_votes > 0)
        stats.lr = self._step_optimizer(tgt)
        if stats.lr < 0:
            stats.skipped, stats.lr = True, 0.0
        return stats

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
        lr = inverse_sqrt_lr(self.step + 1, self.plan.model_config.d_model, self.plan.warmup, self.cfg.lr)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        skipped = False
        if self.scaler is not None:
            scale = self.scaler.get_scale()
            self.scaler.step(self.optimizer)
            self.scaler.update()
            skipped = self.scaler.get_scale() < scale
            if skipped and self.scaler.get_scale() < MIN_FP16_SCALE:
                raise TrainingError(f"fp16 loss scale fell below {MIN_FP16_SCALE} at update {self.step + 1}: the loss "
                                    "keeps overflowing; use --precision bf16/fp32 or lower --lr")
        else:
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return -1.0 if skipped else lr

    # -- validation -----------------------------------------------------------------------------------------------

    @functools.cached_property
    def validator(self) -> Validator | None:
        """The valid split dealt to this rank (validate.py); None without one. Made at the first validation, after
        the batch sizes are final."""
        if self.valid_data is None or not len(self.valid_data):
            return None
        cfg = self.cfg
        return Validator(self.valid_data, self.tokenizer, self.rt, self.plan.batching.max_tokens, cfg.label_smoothing,
                         self.plan.model_config.max_positions, cfg.valid_beam if cfg.valid_bleu else None)

    def validate(self) -> dict | None:
        """Loss, nll and perplexity on the valid split, plus BLEU when asked: sharded over the ranks, the same
        figures on every rank (validate.py)."""
        if self.validator is None:
            return None
        self.module.eval()
        out = self.validator(self.module, self.step)
        self.module.train()
        return out

    def _improved(self, valid: dict) -> bool:
        if self.cfg.valid_bleu:
            value, better = valid["valid_bleu"], (lambda a, b: a > b)
        else:
            value, better = valid["valid_nll"], (lambda a, b: a < b)
        if self.best is None or better(value, self.best):
            self.best, self.best_step, self.bad_valids = value, self.step, 0
            return True
        self.bad_valids += 1
        return False

    # -- checkpoints ----------------------------------------------------------------------------------------------

    def weights_digest(self) -> str:
        """SHA-1 of all weights, bitwise (to check that data-parallel ranks stayed identical)."""
        h = hashlib.sha1()
        for name, tensor in sorted(self.module.state_dict().items()):
            h.update(name.encode())
            h.update(tensor.detach().to("cpu").contiguous().view(torch.uint8).numpy().tobytes())
        return h.hexdigest()

    def _weights(self) -> dict:
        return {k: v.detach().to("cpu") for k, v in self.module.state_dict().items()}

    def save(self, periodic: bool, valid: dict | None) -> None:
        """checkpoint_last.pt (full state) and, if `periodic`, checkpoint_<step>.pt (weights). Collective."""
        rngs = self.rt.gather_objects(rng_state(self.rt.device))
        if not self.rt.is_main:
            return
        meta = {"step": self.step, "epoch": self.epoch, "preset": self.cfg.preset, **(valid or {})}
        weights = self._weights()
        save(self._checkpoint(weights, meta, self._train_state(rngs)), self.out_dir / LAST)
        if periodic:
            save(self._checkpoint(weights, meta), self.out_dir / periodic_name(self.step))
            prune_periodic(self.out_dir, self.plan.keep_last)
        self._emit({"kind": "save", "step": self.step, "path": str(self.out_dir / LAST), "periodic": periodic})

    def save_best(self, valid: dict) -> None:
        if self.rt.is_main:
            meta = {"step": self.step, "epoch": self.epoch, "preset": self.cfg.preset, **valid}
            save(self._checkpoint(self._weights(), meta), self.out_dir / BEST)

    def _checkpoint(self, weights: dict, meta: dict, train_state: dict | None = None) -> Checkpoint:
        tok = self.tokenizer
        return Checkpoint(self.plan.model_config, weights, tok.model_bytes, self.plan.langs, train_state, meta,
                          tok.target_bytes, tok.vocab)

    # -- reporting ------------------------------------------------------------------------------------------------

    def _emit(self, event: dict) -> None:
        if self.progress is not None:
            self.progress(event)

    def _start_event(self) -> dict:
        plan, b = self.plan, self.plan.batching
        return {
            "kind": "start", "preset": self.cfg.preset, "params": self.module.num_parameters(),
            "device": self.rt.device.type, "world_size": self.rt.world_size, "precision": self.rt.precision,
            "max_tokens": b.max_tokens, "update_freq": b.update_freq,
            "max_tokens_auto": self._auto_reason() if self.cfg.max_tokens == "auto" else None,
            "max_tokens_per_update": b.max_tokens_per_update, "update_tokens": b.update_tokens,
            # real (unpadded) tokens per update expected from the batches' average (metrics' "train" records: seen)
            "tgt_tokens_per_update": plan.mean_tgt_tokens * b.update_freq * b.world_size,
            "src_tokens_per_update": plan.mean_src_tokens * b.update_freq * b.world_size,
            "batches_per_epoch": len(self.batches), "padding_efficiency": self._padding_efficiency(),
            "peak_lr": peak_lr(plan.model_config.d_model, plan.warmup, self.cfg.lr), "warmup": plan.warmup,
            "max_steps": plan.max_steps, "max_time": self.cfg.max_time, "max_epochs": self.cfg.max_epochs,
            "save_every": plan.save_every, "save_minutes": plan.save_minutes, "average_last": plan.average_last,
            "lr_at_end": inverse_sqrt_lr(plan.max_steps, plan.model_config.d_model, plan.warmup, self.cfg.lr),
            "slow_precision": slow_bf16_warning(DTYPES.get(self.rt.precision), self.rt.device),
            "resumed_at": self.step if plan.resume_from else None,
            "stale_tmp_removed": self._stale[0], "stale_tmp_bytes": self._stale[1],
            "out_dir": str(self.out_dir), "threads": plan.threads, "threads_reason": plan.threads_reason,
        }

    def _padding_efficiency(self) -> float:
        src, tgt = self.train_data.src_lengths, self.train_data.tgt_lengths
        if self.batch_shape is not None:
            return padding_efficiency(self.batches, src, tgt, self.batch_shape)
        return flat_padding_efficiency(*self.plan.batches, src, tgt)  # (the flat form: no list to concatenate)

    def _auto_reason(self) -> str:
        """How --max-tokens auto chose this run's micro-batch (the run's header prints it)."""
        if self.probed is None:
            return "the default micro-batch (the probe needs a CUDA GPU)"
        return f"micro-batches of at most {self.probed} tokens fit ({self.probe_source})"

    def _eta(self, seconds_per_update: float) -> float | None:
        left = [(self.plan.max_steps - self.step) * seconds_per_update]
        if self.cfg.max_time:
            left.append(self.cfg.max_time * 60 - self.elapsed)
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
        return (f"out of {self.rt.device.type.upper()} memory at update {self.step + 1} with micro-batches of up to "
                f"{b.max_tokens} padded tokens; lower --max-tokens{beam} (--update-freq auto keeps the update size; "
                f"with a fixed --update-freq raise it as you lower --max-tokens) and run again: it resumes from the last "
                "checkpoint")

    def _fit(self) -> TrainResult:
        cfg, plan, rt = self.cfg, self.plan, self.rt
        metrics = MetricsLog(self.out_dir, rt.is_main)
        if rt.is_main:  # (the other ranks neither log nor display)
            start = {**self._start_event(), "tensorboard_note": metrics.note}
            metrics.write({"kind": "start", "step": self.step, **{k: v for k, v in start.items() if k != "kind"}})
            self._emit(start)
        window, history, valid, stopped_by = Window(), [], None, "max_steps"
        last_window = window
        pending: list[tuple[int, torch.Tensor]] = []  # losses not read from the device yet
        shown: dict = {}  # the last loss figures read (for the live display between log lines)
        session_start = last_save = time.monotonic()
        elapsed_before = self.elapsed
        saved_at = validated_at = -1
        watch = cpus.Watch() if plan.recheck_threads and rt.device.type == "cpu" else None
        with StopSignals() as signals:
            while self.step < plan.max_steps:
                t0 = time.monotonic()
                self.elapsed = elapsed_before + t0 - session_start
                out_of_time = bool(cfg.max_time) and self.elapsed >= cfg.max_time * 60
                time_to_save = plan.save_minutes is not None and t0 - last_save >= plan.save_minutes * 60
                micro = self._next_micro_batches()
                if micro is None:
                    stopped_by = "max_epochs"
                    break
                stats = self.update(micro, stop=signals.signum is not None or (rt.is_main and out_of_time),
                                    save_now=rt.is_main and time_to_save)
                if stats.skipped:
                    self.overflows += 1
                    self._emit({"kind": "overflow", "step": self.step, "overflows": self.overflows})
                else:
                    self.step += 1
                    pending.append((self.step, stats.losses))
                    window.add(stats.tgt_tokens, stats.src_tokens, time.monotonic() - t0)
                self.elapsed = elapsed_before + time.monotonic() - session_start
                if self.step % cfg.log_every == 0 or stats.stop:
                    window.add_losses(*self._read_losses(pending))
                    shown = window.summary()
                    record = {"kind": "train", "step": self.step, "epoch": self.epoch, "lr": stats.lr,
                              "elapsed": round(self.elapsed, 3), "overflows": self.overflows, **shown}
                    metrics.write(record)
                    history.append(record)
                    last_window, window = window, Window()
                if watch is not None and (choice := watch.poll(torch.get_num_threads())) is not None:
                    torch.set_num_threads(choice.threads)  # a neighbour came or went (cpus.Watch)
                    event = {"kind": "threads", "step": self.step, "threads": choice.threads, "reason": choice.reason}
                    metrics.write(event)
                    self._emit(event)
                pace = window if window.updates else last_window  # a line right after a log shows the last window's
                self._emit({"kind": "train", "step": self.step, "epoch": self.epoch, "lr": stats.lr,
                            "elapsed": self.elapsed, "eta": self._eta(pace.seconds / max(pace.updates, 1)),
                            "max_steps": plan.max_steps, **shown, **pace.speed()})
                if stats.stop:
                    stopped_by = "signal" if signals.signum is not None else "max_time"
                    break
                save_due = stats.save or self.step % plan.save_every == 0
                if save_due or (cfg.valid_every and self.step % cfg.valid_every == 0):
                    window.add_losses(*self._read_losses(pending))  # never validate or save a diverged model
                    valid, validated_at = self._validate_and_track(metrics), self.step
                    if save_due:
                        self.save(periodic=True, valid=valid)
                        saved_at, last_save = self.step, time.monotonic()
                    if cfg.patience and self.bad_valids >= cfg.patience:
                        stopped_by = "patience"
                        break
            signum = signals.signum
            self._read_losses(pending)
            if stopped_by == "signal":
                # torchrun kills a process 30 s after SIGTERM: save the state first, and nothing else
                self._loader.shutdown(wait=False, cancel_futures=True)
                if saved_at != self.step:
                    self.save(periodic=False, valid=None)
                return self._finish(metrics, stopped_by, signum, None, None, history, None)
        # the end: validate and save the final state unless that just happened
        if validated_at != self.step:
            valid = self._validate_and_track(metrics)
        if saved_at != self.step:
            self.save(periodic=True, valid=valid)
        averaged = self._average_at_end()
        digests = self.rt.gather_objects(self.weights_digest()) if rt.distributed else None
        return self._finish(metrics, stopped_by, signum, valid, averaged, history, digests)

    def _finish(self, metrics: MetricsLog, stopped_by: str, signum: int | None, valid: dict | None,
                averaged: str | None, history: list, digests: list | None) -> TrainResult:
        best = self.out_dir / BEST
        result = TrainResult(
            out_dir=str(self.out_dir), step=self.step, epoch=self.epoch, elapsed=self.elapsed, stopped_by=stopped_by,
            last=str(self.out_dir / LAST), best=str(best) if best.exists() else None, averaged=averaged, valid=valid,
            best_valid=self.best, criterion=self.criterion, best_step=self.best_step, overflows=self.overflows,
            signum=signum, history=history, ranks_agree=None if digests is None else len(set(digests)) == 1)
        self._loader.shutdown(wait=False, cancel_futures=True)
        metrics.write({"kind": "end", "step": self.step, "stopped_by": stopped_by, "elapsed": self.elapsed,
                       f"best_{self.criterion}": self.best, "best_step": self.best_step, "overflows": self.overflows})
        metrics.close()
        self._emit({"kind": "end", **asdict(result)})
        return result

    def _validate_and_track(self, metrics: MetricsLog) -> dict | None:
        valid = self.validate()
        if valid is None:
            return None
        improved = self._improved(valid)
        if improved:
            self.save_best(valid)
        record = {"kind": "valid", "step": self.step, "epoch": self.epoch, **valid,
                  f"best_{self.criterion}": self.best, "improved": improved, "criterion": self.criterion}
        metrics.write(record)
        self._emit(record)
        return valid

    def _average_at_end(self) -> str | None:
        n = self.plan.average_last
        if not n or not self.rt.is_main:
            return None
        paths = last_checkpoints(self.out_dir, n, lambda message: self._emit({"kind": "note", "message": message}))
        ckpt = average_checkpoints(paths)
        save(ckpt, self.out_dir / AVERAGED)
        self._emit({"kind": "averaged", "path": str(self.out_dir / AVERAGED), "n": len(paths), "wanted": n})
        return str(self.out_dir / AVERAGED)


def data_parallel(module: torch.nn.Module, rt: Runtime) -> torch.nn.Module:
    """DDP around the model, compiled or not. With --compile the order is DDP(torch.compile(model)), the one PyTorch's
    "Where to apply torch.compile?" recommends ("torch.compile specifically doesn't handle distributed wrapper modules
    like DDP or FSDP very well, so consider applying torch.compile to the inner module passed to the wrapper"). The
    backward still overlaps the all-reduce: DDP runs its module inside `_inside_ddp_forward`, and dynamo, compiling
    under an active DDP module, splits the graph at DDP's bucket boundaries (DDPOptimizer, torch/_dynamo/
    convert_frame.py), so each bucket's compiled backward hands its gradients to the reducer as it finishes
    (tests/test_train.py checks that DDPOptimizer compiles the model's graphs in this order). The only buffer is the
    constant position table: it is not broadcast before every forward."""
    import inspect

    from torch.nn.parallel import DistributedDataParallel as DDP

    no_sync = ({"forward_sync_buffers": False} if "forward_sync_buffers" in inspect.signature(DDP).parameters
               else {"broadcast_buffers": False})  # (torch >= 2.13 renamed the option)
    return DDP(module, device_ids=[rt.local_rank] if rt.device.type == "cuda" else None,
               gradient_as_bucket_view=True, **no_sync)


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
