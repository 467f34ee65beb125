"""Run planning: every check before anything is written (`plan_run`), the resolved run configuration
(`config.json`, and the recipe as `config.yaml`: recipe_file.py), and the resume decision."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from nmt_cli import __version__
from nmt_cli.atomic import write_text
from nmt_cli.checkpoints.format import load, write_error
from nmt_cli.config import ModelConfig, preset
from nmt_cli.data import multilingual
from nmt_cli.data.batching import LengthOrder, shape_batches
from nmt_cli.data.store import SPM_MODEL, ParallelData, check_vocab_size, load_manifest, read_tokenizer
from nmt_cli.errors import CheckpointError, ConfigError, DataError, TrainingError
from nmt_cli.runtime import cpus
from nmt_cli.training import recipe_file
from nmt_cli.training.config import (
    BatchPlan,
    TrainConfig,
    real_update_freq,
    resolve_averaging,
    resolve_batching,
    resolve_keep_last,
    resolve_save_every,
    resolve_save_minutes,
    resolve_valid_every,
    resolve_valid_minutes,
)
from nmt_cli.training.distributed.process import Runtime
from nmt_cli.training.distributed.world import Launch, plan_launch, torchrun_env
from nmt_cli.training.files import CONFIG_JSON, CONFIG_YAML, LAST
from nmt_cli.training.schedule import peak_lr
from nmt_cli.training.state import plain


@dataclass
class RunPlan:
    """What `plan_run` decided; picklable, handed to every process."""

    cfg: TrainConfig
    launch: Launch
    model_config: ModelConfig
    batching: BatchPlan
    warmup: int
    max_steps: int
    save_every: int  # updates between checkpoints
    save_minutes: float | None  # and minutes, when the run saves by time too (--save-every-minutes, --max-time)
    keep_last: int
    average_last: int  # checkpoints averaged into averaged.pt at the end (0: none)
    average_note: str | None  # why fewer than --average-last (a short run: resolve_averaging), for the header
    valid_every: int  # updates between validations (and one at the end)
    valid_minutes: float | None  # and minutes, when the run validates by time too
    langs: dict
    rows: np.ndarray | None  # a multilingual run's training rows of an epoch (sampled by --lang-temperature); None: all
    resume_from: str | None
    finished: dict | None  # RUN_DIR's run already reached this run's stop (nothing is trained): `_finished`
    init_from: str | None  # a checkpoint file whose weights start the run (fine-tuning), when not resuming
    has_valid: bool
    mean_tgt_tokens: float  # real target tokens per micro-batch, on average (as the loss counts them: with EOS)
    mean_src_tokens: float  # real source tokens per micro-batch, on average (with EOS)
    batches: tuple[np.ndarray, np.ndarray]  # the training batches, flat: (sentence indices, sizes); `train_batches`
    threads: int | None = None  # torch threads per process (None: torch's own default, on GPUs)
    threads_reason: str = ""  # how `threads` was chosen, for the run's header
    recheck_threads: bool = False  # count the free cores again during the run (cpus.Watch): one automatic process

    @property
    def out_dir(self) -> Path:
        return Path(self.cfg.out_dir)


def plan_run(cfg: TrainConfig) -> RunPlan:
    """Validate the request against the data, the machine and the output directory; write nothing."""
    cfg.validate()
    data_dir = Path(cfg.data_dir)
    manifest = load_manifest(data_dir)
    for key in ("src_lang", "tgt_lang", "vocab_size", "splits"):
        if key not in manifest:
            raise DataError(f"{data_dir}/manifest.json has no '{key}' (not written by nmt prepare?); re-run nmt prepare")
    if "train" not in manifest["splits"]:
        raise DataError(f"{data_dir} has no train split; re-run nmt prepare")
    tokenizer = read_tokenizer(data_dir)
    check_vocab_size(data_dir, manifest, tokenizer)
    launch = plan_launch(cfg.gpus, cfg.cpu_procs, cfg.precision)
    init_from = None
    if cfg.init_from is not None:
        model_config, init_from = _init_from(cfg, tokenizer)
    else:
        model_config = preset(cfg.preset, vocab_size=int(manifest["vocab_size"]), **cfg.model)
    train = ParallelData(data_dir, "train", manifest)
    if len(train) == 0:
        raise DataError(f"{data_dir}: the train split is empty; re-run nmt prepare with more data")
    longest = int(max(train.src_lengths.max(), train.tgt_lengths.max()))
    if longest > model_config.max_positions:
        raise ConfigError(f"{data_dir} has a sentence of {longest} tokens but the model takes at most "
                          f"{model_config.max_positions}; prepare with a lower --max-len or raise --max-positions")
    rows = multilingual.sampled_rows(manifest, cfg.lang_temperature, cfg.seed)
    batching, batches = _batch(cfg, launch, model_config, train, rows)
    if "valid" in manifest["splits"]:
        ParallelData(data_dir, "valid", manifest)  # present and consistent
    sizes = np.fromiter(map(len, batches), dtype=np.int64, count=len(batches))
    out_dir = Path(cfg.out_dir)
    if out_dir.exists() and not out_dir.is_dir():
        raise ConfigError(f"-o {out_dir} is a file; pass a directory for the run")
    _check_writable(out_dir)
    env = torchrun_env()
    # Rank 0 decides whether and from where to resume (`agree_on_resume`): the other ranks' run directories may
    # not be the same storage (several nodes), and a rank refusing here would leave the others waiting for it.
    max_steps = cfg.max_steps or cfg.recipe("max_steps")
    save_every, save_minutes = resolve_save_every(cfg, max_steps), resolve_save_minutes(cfg)
    average_last, average_note = resolve_averaging(cfg, max_steps, save_every, save_minutes)
    resume_from, state = (_check_resume(cfg, out_dir, model_config, tokenizer.key())
                          if env is None or env[0] == 0 else (None, None))
    return RunPlan(
        cfg=cfg, launch=launch, model_config=model_config, batching=batching,
        warmup=cfg.warmup or cfg.recipe("warmup"), max_steps=max_steps,
        save_every=save_every, save_minutes=save_minutes, keep_last=resolve_keep_last(cfg),
        average_last=average_last, average_note=average_note, valid_every=resolve_valid_every(cfg, save_every),
        valid_minutes=resolve_valid_minutes(cfg, save_minutes),
        langs=_langs(manifest), rows=rows, resume_from=resume_from,
        finished=_finished(cfg, state, max_steps),
        init_from=init_from, has_valid="valid" in manifest["splits"],
        mean_tgt_tokens=float(_order(train, rows).tgt.sum()) / len(batches),
        mean_src_tokens=float(_order(train, rows).src.sum()) / len(batches),
        batches=(np.concatenate(batches), sizes),
        **_threads(cfg, launch, env),
    )


def _langs(manifest: dict) -> dict:
    """The run's languages, as checkpoints record them: {src, tgt} and, for a multilingual model, its directions
    and tags ({"directions": [["en", "de"], ...], "tags": {"de": ">>de<<", ...}})."""
    langs = {"src": manifest["src_lang"], "tgt": manifest["tgt_lang"]}
    if "directions" in manifest:
        langs["directions"] = [[d["src"], d["tgt"]] for d in manifest["directions"]]
        langs["tags"] = (manifest.get("tags") or {}).get("tags", {})
    return langs


def _order(train: ParallelData, rows: np.ndarray | None) -> LengthOrder:
    """The lengths of the rows an epoch trains on (`rows`: sampled by direction; None: every row once)."""
    if rows is None:
        return LengthOrder(train.src_lengths, train.tgt_lengths)
    return LengthOrder(train.src_lengths[rows], train.tgt_lengths[rows])


def _rows(batches: list[np.ndarray], rows: np.ndarray | None) -> list[np.ndarray]:
    """Batches of positions in `rows` -> batches of rows of the data."""
    return batches if rows is None else [rows[b] for b in batches]


def _batch(cfg: TrainConfig, launch: Launch, model_config: ModelConfig, train: ParallelData,
           rows: np.ndarray | None = None) -> tuple[BatchPlan, list[np.ndarray]]:
    """The batch plan and the training batches (packed once here; every process gets them with the plan).

    A default micro-batch (no --max-tokens, or auto) is sized in real target tokens. How many real target tokens
    a token of budget holds (`fill`) is first taken as what the budget's max(source, target) leaves alone (padding
    aside), then measured where the micro-batch lands, by packing the data there once (it is lower in smaller
    micro-batches: docs/results.md#training-start-up has how close the update comes); the data is then packed at
    the budget that holds the update's share. --update-freq auto counts the real target tokens of the batches
    made (`real_update_freq`)."""
    gpu_memory = _gpu_memory(launch)

    lengths = _order(train, rows)
    tgt_tokens, longest = float(lengths.tgt.sum()), int(lengths.key.max())
    default = cfg.max_tokens in (None, "auto")

    def plan_for(fill: float) -> BatchPlan:
        b = resolve_batching(cfg, launch.world_size, launch.device_type, model_config, gpu_memory, launch.precision,
                             fill)
        if default and b.max_tokens < longest:  # a default micro-batch holds the longest sentence at least
            b = dataclasses.replace(b, max_tokens=longest)
        return b

    batching = plan_for(1.0)
    if default:
        batching = plan_for(tgt_tokens / float(lengths.key.sum()))
        n = len(lengths.sizes(batching.max_tokens))
        batching = plan_for(tgt_tokens / (n * batching.max_tokens))
    batches = _rows(train_batches(lengths, batching.max_tokens, model_config.max_positions
                                  if cfg.compile and cfg.compile_shapes == "buckets" else None), rows)
    if cfg.update_freq == "auto":
        batching = dataclasses.replace(batching, update_freq=real_update_freq(batching, tgt_tokens / len(batches)))
    return batching, batches


def repacked(plan: RunPlan, batching: BatchPlan, train: ParallelData) -> RunPlan:
    """`plan` with the training batches packed again for `batching` (--max-tokens auto's probe found another
    micro-batch), and --update-freq auto counted again (`real_update_freq`)."""
    lengths = _order(train, plan.rows)
    batches = _rows(train_batches(lengths, batching.max_tokens, bucket_positions(plan)), plan.rows)
    mean_tgt = float(lengths.tgt.sum()) / len(batches)
    if plan.cfg.update_freq == "auto":
        batching = dataclasses.replace(batching, update_freq=real_update_freq(batching, mean_tgt))
    sizes = np.fromiter(map(len, batches), dtype=np.int64, count=len(batches))
    return dataclasses.replace(plan, batching=batching, batches=(np.concatenate(batches), sizes),
                               mean_tgt_tokens=mean_tgt, mean_src_tokens=float(lengths.src.sum()) / len(batches))


def bucket_positions(plan: RunPlan) -> int | None:
    """Compiled training with shape buckets (--compile --compile-shapes buckets): the longest position a batch shape
    may have; else None (batches padded to their own longest sentences)."""
    cfg = plan.cfg
    return plan.model_config.max_positions if cfg.compile and cfg.compile_shapes == "buckets" else None


def train_batches(lengths: LengthOrder, max_tokens: int, max_positions: int | None) -> list[np.ndarray]:
    """Eager: batches padded to their longest sentence (`make_batches`). Compiled (`max_positions` given): batches
    of a few shapes (batching.shape_batches), so that torch.compile reuses its code."""
    if max_positions is None:
        return lengths.batches(max_tokens)
    return shape_batches(lengths.src, lengths.tgt, max_tokens, max_positions)


def _threads(cfg: TrainConfig, launch: Launch, env) -> dict:
    """Torch threads per process on CPU: --threads, or the free cores shared by this machine's processes
    (cpus.py). Under torchrun the ranks start together and would see each other's start-up as load: there each
    takes cores / local processes."""
    if cfg.threads is not None:
        return {"threads": cfg.threads, "threads_reason": f"--threads {cfg.threads}"}
    if launch.device_type != "cpu":
        return {}
    if env is not None:
        local = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
        cores = cpus.core_count()
        n = max(1, cores // max(1, local))
        return {"threads": n, "threads_reason": f"torchrun: {cores} cores / {local} local processes: {n}"}
    choice = cpus.default_threads(launch.world_size)
    return {"threads": choice.threads, "threads_reason": choice.reason, "recheck_threads": launch.world_size == 1}


def _gpu_memory(launch: Launch) -> int | None:
    """Bytes of memory of the smallest GPU this run uses (None on CPU)."""
    if launch.device_type != "cuda":
        return None
    env = torchrun_env()
    indices = [env[2]] if env is not None else range(launch.world_size)
    return min(torch.cuda.get_device_properties(i).total_memory for i in indices)


def _check_writable(out_dir: Path) -> None:
    """The run directory (or the nearest existing parent it would be created in) must be writable."""
    existing = out_dir
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not os.access(existing, os.W_OK | os.X_OK):
        raise ConfigError(f"-o {out_dir}: {existing} is not writable (read-only storage or permissions); "
                          "pick another -o or fix the permissions")


def _init_from(cfg: TrainConfig, tokenizer) -> tuple[ModelConfig, str]:
    """--init-from: the model configuration (this run's dropout) and the checkpoint file holding the weights (a
    MarianMT model converted once, pretrained.py). The data must be encoded with that model's own tokenizer."""
    from nmt_cli.importers import pretrained

    ckpt, origin = pretrained.load(cfg.init_from)
    if ckpt.tokenizer_key() != tokenizer.key():
        raise DataError(f"{cfg.data_dir} was encoded with another tokenizer than {cfg.init_from}'s; prepare the data "
                        f"with that model's own: nmt prepare ... --tokenizer-from {cfg.init_from}")
    return dataclasses.replace(ckpt.model_config, **cfg.model).validate(), origin["path"]


def _check_resume(cfg: TrainConfig, out_dir: Path, model_config: ModelConfig,
                  tokenizer: tuple) -> tuple[str | None, dict | None]:
    """(the checkpoint to resume from, its training state) or (None, None) for a new run; one-line errors when
    RUN_DIR's run cannot be resumed as asked."""
    last = out_dir / LAST
    if not last.exists():
        if cfg.resume:
            raise CheckpointError(f"--resume: {last} does not exist; drop --resume to start a new run")
        return None, None
    if cfg.resume is False:
        raise ConfigError(f"--no-resume: {out_dir} already holds a run ({LAST}), which nmt never overwrites; "
                          "pick another -o, remove that directory, or drop --no-resume to resume it")
    ckpt = load(last, mmap=True)  # the configuration only; mapped, so unchecked (the resume checks the CRC-32s)
    if ckpt.train_state is None:
        raise CheckpointError(f"{last} has no training state (an averaged or exported checkpoint?); "
                              "it cannot be resumed; pick another -o")
    if ckpt.model_config != model_config:
        diff = [f"{k} {v} (checkpoint) vs {getattr(model_config, k)}" for k, v in ckpt.model_config.to_dict().items()
                if getattr(model_config, k) != v]
        raise CheckpointError(f"{last} was trained with another model ({'; '.join(diff)}); "
                              "use the same preset/options to resume, or another -o")
    if ckpt.tokenizer_key() != tokenizer:
        raise CheckpointError(f"{last} was trained with another tokenizer than {cfg.data_dir}/{SPM_MODEL}; "
                              "resume with the same data directory, or pick another -o")
    return str(last), ckpt.train_state


def _finished(cfg: TrainConfig, state: dict | None, max_steps: int) -> dict | None:
    """{"reason", "step", "epoch", "elapsed"} of a run that already reached one of `cfg`'s stops, else None."""
    reason = None if state is None else finished_stop(cfg, state, max_steps)
    if reason is None:
        return None
    return {"reason": reason, "step": int(state["step"]), "epoch": int(state.get("epoch", 1)),
            "elapsed": float(state.get("elapsed", 0.0))}


def finished_stop(cfg: TrainConfig, state: dict, max_steps: int) -> str | None:
    """Whether a run at training state `state` has already reached one of `cfg`'s stops: the reason in words, or
    None. Such a run is left as it is (re-running its command changes nothing); raising the stop continues it."""
    step, elapsed = int(state["step"]), float(state.get("elapsed", 0.0))
    if step >= max_steps:
        return f"update {step} of --max-steps {max_steps}"
    if cfg.max_time and elapsed >= cfg.max_time * 60:
        return f"{elapsed / 60:.2f} minutes of training of --max-time {cfg.max_time:g}"
    if cfg.max_epochs and int(state.get("epoch", 1)) > cfg.max_epochs:
        return f"the end of epoch {cfg.max_epochs} of --max-epochs {cfg.max_epochs}"
    if cfg.patience and int(state.get("bad_valids", 0)) >= cfg.patience:
        return f"{state.get('bad_valids')} validations without improvement of --patience {cfg.patience}"
    return None




def file_sha256(path: str | os.PathLike) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 24), b""):
            h.update(block)
    return h.hexdigest()


def agree_on_resume(plan: RunPlan, rt: Runtime) -> RunPlan:
    """After the process group starts: every rank resumes from the checkpoint rank 0 chose or starts fresh as rank
    0 does. A rank that cannot read that very file stops the whole run, every rank raising the same one-line error
    (without this, a node that does not share the run directory would restart at update 0 with fresh Adam state
    while the others resume: the weights drift apart and the collectives hang).

    "That very file": the same size and modification time as rank 0's (shared storage: nothing is read), else the
    same sha256 (a copy on a node's own disk): then rank 0 hashes its file once and only those ranks hash theirs."""
    if not rt.distributed:
        return plan
    decision = None
    if rt.is_main and plan.finished:  # nothing to train: every rank ends (`run_process`)
        decision = {"finished": plan.finished}
    elif rt.is_main and plan.resume_from is not None:
        decision = {"path": plan.resume_from, **_size_and_time(Path(plan.resume_from))}
    decision = rt.broadcast_object(decision)
    if decision is not None and "finished" in decision:
        return dataclasses.replace(plan, finished=decision["finished"])
    problem, unsure = None, False
    if decision is not None and not rt.is_main:
        path = Path(decision["path"])
        if not path.is_file():
            problem = (f"rank {rt.rank} cannot see {path}, the checkpoint rank 0 resumes from; put the run "
                       "directory (-o) on storage every node shares (or copy it to every node) and start again")
        else:
            unsure = _size_and_time(path) != {k: decision[k] for k in ("size", "mtime_ns")}
    if any(rt.gather_objects(unsure)):
        sha256 = rt.broadcast_object(file_sha256(decision["path"]) if rt.is_main else None)
        if unsure and file_sha256(decision["path"]) != sha256:
            problem = (f"rank {rt.rank} sees another {decision['path']} than rank 0 (different bytes); put the run "
                       "directory (-o) on storage every node shares (or copy rank 0's to every node) and start again")
    problems = [p for p in rt.gather_objects(problem) if p]
    if problems:
        raise TrainingError(problems[0])
    return dataclasses.replace(plan, resume_from=None if decision is None else decision["path"])


def _size_and_time(path: Path) -> dict:
    st = path.stat()
    return {"size": st.st_size, "mtime_ns": st.st_mtime_ns}


def write_run_config(plan: RunPlan) -> None:
    """RUN_DIR/config.json: the options as given and as resolved on this machine; RUN_DIR/config.yaml: the recipe
    that repeats the run (`nmt train --config`)."""
    out = plan.out_dir
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"cannot create the run directory {out}: {exc.strerror or exc}; pick another -o") from exc
    resolved = {
        "nmt_version": __version__, "torch_version": torch.__version__,
        "options": plain(plan.cfg.to_dict()), "model": plan.model_config.to_dict(),
        "device": plan.launch.device_type, "world_size": plan.launch.world_size, "precision": plan.launch.precision,
        "max_tokens": plan.batching.max_tokens, "update_freq": plan.batching.update_freq,
        "update_tokens": plan.batching.update_tokens, "max_tokens_per_update": plan.batching.max_tokens_per_update,
        "warmup": plan.warmup, "peak_lr": peak_lr(plan.model_config.d_model, plan.warmup, plan.cfg.lr),
        "max_steps": plan.max_steps, "save_every": plan.save_every, "save_every_minutes": plan.save_minutes,
        "keep_last": plan.keep_last, "average_last": plan.average_last, "valid_every": plan.valid_every,
        "valid_every_minutes": plan.valid_minutes,
        "langs": plan.langs, "resumed_from": plan.resume_from,
    }
    write_text(out / CONFIG_JSON, json.dumps(resolved, indent=2) + "\n", write_error)
    write_text(out / CONFIG_YAML, recipe_file.for_run(plan), write_error)
