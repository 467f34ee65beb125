"""Training configuration: one dataclass, per-preset recipe defaults, and resolution against the machine.

Options left at None take the preset's recipe default (`RECIPES`) when the run is planned; the resolved values
are what `config.json` records beside the checkpoints.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

from nmt_cli.errors import ConfigError
from nmt_cli.runtime import defaults
from nmt_cli.runtime.precision import TRAIN_PRECISIONS

# The paper's batch: ~25000 source + ~25000 target tokens per update (8 GPUs together), counted as real tokens.
PAPER_UPDATE_TOKENS = 25000

# Recipe defaults per model preset. base/big are the paper's; tiny is tuned for minutes-long CPU runs on the
# sample corpus (a short warmup and small updates learn it in a few hundred updates, where the paper's settings
# are still warming up).
# Checkpoints: the paper wrote one every 10 minutes on 8 P100s and averaged the last 5 (base) / 20 (big): at its
# speed (base 100k updates in 12 hours, big 300k in 3.5 days) that is about every 1,400 and 600 updates. Saving by
# updates keeps the averaged window the paper's on any hardware (10 minutes on a current GPU is many more updates).
RECIPES: dict[str, dict] = {
    "tiny": dict(warmup=400, update_tokens=2048, max_steps=30000, cpu_max_tokens=2048, save_every=1000,
                 average_last=5),
    "base": dict(warmup=4000, update_tokens=PAPER_UPDATE_TOKENS, max_steps=100000, cpu_max_tokens=8192,
                 save_every=1400, average_last=5),
    "big": dict(warmup=4000, update_tokens=PAPER_UPDATE_TOKENS, max_steps=300000, cpu_max_tokens=8192,
                save_every=600, average_last=20),
}
AVERAGED_SHARE = 4  # a run shorter than the preset's saves at least 4 x average_last times: its average covers
# at most its last quarter (the paper's base average covers the last 7%)
# Floors on the intervals nmt chooses itself, so that saving and validating cost a run a few percent of its time
# whatever its length (docs/design.md#saving-and-validating): a shorter run averages fewer checkpoints instead.
MIN_SAVE_EVERY = 50  # updates between checkpoints, at least (--save-every is taken as given)
MIN_VALID_EVERY = 200  # updates between validations, at least (--valid-every is taken as given): a validation
# costs several updates' time, a save a fraction of one
MIN_SAVE_MINUTES = 0.5  # minutes between checkpoints by time, at least (--save-every-minutes is taken as given)
VALID_MINUTES = 5.0  # minutes between validations by time, at least (--valid-every-minutes is taken as given)

# Model options a user may override on the command line (ModelConfig field names).
MODEL_OVERRIDES = ("d_model", "d_ff", "n_heads", "encoder_layers", "decoder_layers", "dropout",
                   "attention_dropout", "activation_dropout", "max_positions", "norm_first", "share_embeddings")
FINE_TUNE_OVERRIDES = ("dropout", "attention_dropout", "activation_dropout")  # what --init-from lets a run change


@dataclass
class TrainConfig:
    """Everything `nmt train` accepts. None = the preset's recipe default (see RECIPES and `resolve_*`)."""

    data_dir: str
    out_dir: str
    preset: str = "base"
    model: dict = field(default_factory=dict)  # ModelConfig overrides, e.g. {"d_model": 256}
    init_from: str | None = None  # start from these weights (checkpoint, MarianMT folder, hf:...): fine-tuning
    # optimisation (Adam(0.9, 0.98, 1e-9), inverse-square-root schedule, label smoothing 0.1)
    lr: float | None = None  # peak learning rate; None = d_model^-0.5 * warmup^-0.5 (the paper's formula)
    warmup: int | None = None
    adam_betas: tuple[float, float] = (0.9, 0.98)
    adam_eps: float = 1e-9
    label_smoothing: float = 0.1
    clip_norm: float = 0.0  # 0 = no clipping
    # batching
    max_tokens: int | str | None = None  # padded source (and target) tokens per micro-batch per process; "auto":
    # the largest that fits the GPU, probed at the start (training/probe.py); on CPU the default
    update_freq: int | str = "auto"  # micro-batches accumulated per update, or "auto" (reach update_tokens)
    update_tokens: int | None = None  # real (unpadded) target tokens per update (the paper: 25000); sizes the
    # default max_tokens and update_freq "auto"
    # stopping
    max_steps: int | None = None
    max_epochs: int | None = None
    max_time: float | None = None  # minutes of training (cumulative over resumes)
    patience: int | None = None  # validations without improvement before stopping
    # checkpoints
    save_every: int | None = None  # updates; None: the preset's (resolve_save_every)
    save_every_minutes: float | None = None  # None: none by time, or with max_time: resolve_save_minutes
    keep_last: int | None = None  # periodic checkpoints kept; None: max(5, average_last)
    average_last: int | None = None  # write averaged.pt from the last N checkpoints at the end; None: the preset's
    average: bool = True  # False (--no-average): no averaged.pt
    resume: bool | None = None  # None: resume when out_dir has checkpoint_last.pt
    # validation
    valid_every: int | None = None  # updates; None: at every checkpoint saved by updates (resolve_valid_every)
    valid_every_minutes: float | None = None  # None: none by time, or at the checkpoints by time, at least
    # VALID_MINUTES apart, when the run saves by time (resolve_valid_minutes)
    valid_bleu: bool = False
    valid_beam: int = defaults.BEAM
    # multilingual data
    lang_temperature: float = 5.0  # directions sampled by size ** (1 / T) (data/multilingual.py); 1: as the data is
    # machine
    precision: str = "auto"  # one of precision.TRAIN_PRECISIONS
    gpus: int | None = None  # None: 1 GPU when CUDA is available, else CPU
    cpu_procs: int = 1  # processes on CPU (gloo), e.g. 2 to test distributed code without GPUs
    threads: int | None = None  # torch threads per process; None: the free cores / processes (cpus.py)
    dist_timeout: float = 5.0  # minutes a rank may stop answering before the others end the run (watchdog.py)
    compile: bool = False
    compile_shapes: str = "buckets"  # with compile: "buckets" (a few fixed batch shapes) or "dynamic" (symbolic sizes)
    seed: int = 1
    log_every: int = 100  # updates between metric log lines

    def validate(self) -> TrainConfig:
        from nmt_cli.config import PRESETS

        if self.preset not in PRESETS:
            raise ConfigError(f"unknown preset {self.preset!r}; choose one of: {', '.join(PRESETS)}")
        if self.compile_shapes not in COMPILE_SHAPES:
            raise ConfigError(f"unknown --compile-shapes {self.compile_shapes!r}; choose {' or '.join(COMPILE_SHAPES)}")
        bad = sorted(set(self.model) - set(MODEL_OVERRIDES))
        if bad:
            raise ConfigError(f"unknown model option(s) {bad}; known: {', '.join(MODEL_OVERRIDES)}")
        if isinstance(self.update_freq, str) and self.update_freq != "auto":
            try:
                self.update_freq = int(self.update_freq)
            except ValueError as exc:
                raise ConfigError(f"--update-freq must be a positive integer or 'auto', got {self.update_freq!r}") from exc
        if isinstance(self.max_tokens, str) and self.max_tokens != "auto":
            try:
                self.max_tokens = int(self.max_tokens)
            except ValueError as exc:
                raise ConfigError(f"--max-tokens must be a positive integer or 'auto', got {self.max_tokens!r}") from exc
        positive = ("lr", "warmup", "max_tokens", "update_tokens", "max_steps", "max_epochs", "max_time", "patience",
                    "save_every", "save_every_minutes", "keep_last", "average_last", "valid_every",
                    "valid_every_minutes", "threads",
                    "dist_timeout", "lang_temperature")
        for name in positive:
            value = getattr(self, name)
            if value is not None and value != "auto" and value <= 0:
                raise ConfigError(f"--{name.replace('_', '-')} must be positive, got {value}")
        if isinstance(self.update_freq, int) and self.update_freq < 1:
            raise ConfigError(f"--update-freq must be at least 1, got {self.update_freq}")
        if self.init_from is not None:
            if self.resume:
                raise ConfigError("--init-from starts a new run from a model's weights and --resume continues "
                                  "RUN_DIR's run; drop one of them")
            fixed = sorted(set(self.model) - set(FINE_TUNE_OVERRIDES))
            if fixed:
                raise ConfigError(f"--init-from takes the architecture from the model it starts from; drop "
                                  f"{', '.join('--' + k.replace('_', '-') for k in fixed)} (dropout may be set)")
        if not 0.0 <= self.label_smoothing < 1.0:
            raise ConfigError(f"--label-smoothing must be in [0, 1), got {self.label_smoothing}")
        if self.clip_norm < 0:
            raise ConfigError(f"--clip-norm must be >= 0 (0 disables clipping), got {self.clip_norm}")
        if self.precision not in TRAIN_PRECISIONS:
            raise ConfigError(f"unknown precision {self.precision!r}; choose one of {', '.join(TRAIN_PRECISIONS)}")
        if self.cpu_procs < 1:
            raise ConfigError(f"--cpu-procs must be at least 1, got {self.cpu_procs}")
        if self.gpus is not None and self.gpus < 0:
            raise ConfigError(f"--gpus must be >= 0, got {self.gpus}")
        if self.cpu_procs > 1 and self.gpus:
            raise ConfigError("--cpu-procs runs on CPU; it cannot be combined with --gpus")
        return self

    def recipe(self, key: str):
        return RECIPES[self.preset][key]

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


@dataclass
class BatchPlan:
    """How the tokens of one update are made: max_tokens x update_freq x processes."""

    max_tokens: int  # padded tokens per micro-batch (source and target each), per process
    update_freq: int
    world_size: int
    update_tokens: int  # the real (unpadded) target tokens per update that "auto" aims at
    probe: bool = False  # --max-tokens auto on a GPU: max_tokens is provisional until the run probes (training/probe.py)
    fill: float = 1.0  # real target tokens per token of max_tokens, measured on the data (plan.py); 1: not measured

    @property
    def max_tokens_per_update(self) -> int:
        return self.max_tokens * self.update_freq * self.world_size


def train_memory_bytes(model, tokens: int, precision: str = "bf16") -> float:
    """Estimated peak GPU memory of one training micro-batch of `tokens` padded tokens: 16 bytes per parameter
    (fp32 weights, gradients and Adam's two moments) plus activations of ~38 bytes per layer and d_model unit and
    ~6 bytes per vocabulary entry per token (logits and their gradient); twice that in fp32, and 4 more per
    vocabulary entry in fp16 (the loss gradient stays float32 until scaled). Fitted to the peaks measured on an
    H200 in bf16 (base: 2.2 GiB at 3125 tokens, 11.6 at 25000; big: 4.9 and 19.2), within 7%."""
    d, f, v = model.d_model, model.d_ff, model.vocab_size
    params = v * d + model.encoder_layers * (4 * d * d + 2 * d * f) + model.decoder_layers * (8 * d * d + 2 * d * f)
    per_token = 38 * (model.encoder_layers + model.decoder_layers) * d + 6 * v
    if precision == "fp32":
        per_token *= 2
    elif precision == "fp16":
        per_token += 4 * v
    return 16 * params + tokens * per_token


COMPILE_SHAPES = ("buckets", "dynamic")  # how --compile meets changing batch shapes (training/loop.py)
GPU_MEMORY_SHARE = 0.8  # of the smallest GPU's memory, for the default micro-batch


def resolve_batching(cfg: TrainConfig, world_size: int, device_type: str, model=None,
                     gpu_memory: int | None = None, precision: str = "bf16", fill: float = 1.0) -> BatchPlan:
    """Per-process micro-batch size and accumulation steps, for updates of --update-tokens real target tokens.

    `fill`: the real target tokens that a token of the --max-tokens budget holds on this data (padding, and source
    sides longer than their targets, take the rest: ~0.7; plan.py measures it by packing the data once). Each
    process's share of an update is then update_tokens / (processes x fill) budget tokens.
    Default --max-tokens: that share, in one micro-batch, or in the fewest equal micro-batches that fit: on a GPU in
    GPU_MEMORY_SHARE of its memory (`train_memory_bytes`; one H200 takes base's or big's update at once, a 16 GB GPU
    runs big in 2 halves), on CPU in the recipe's cpu_max_tokens (smaller micro-batches are as fast there and use
    less memory). With a fixed --update-freq F the default is the share / F (at most cpu_max_tokens on CPU), so that
    P processes with F micro-batches each get the same micro-batches as any P' x F' = P x F.
    --update-freq auto: round(share / max_tokens), >= 1; plan.py replaces it by the count of the data's real
    target tokens (`real_update_freq`) once the batches are made.
    --max-tokens auto: the default on CPU; on a GPU the default above, marked `probe`, until the run replaces it by
    what fits (`probed_batching`, training/probe.py).
    """
    update_tokens = cfg.update_tokens or cfg.recipe("update_tokens")
    max_tokens = cfg.max_tokens
    probe = max_tokens == "auto" and device_type == "cuda"
    if max_tokens == "auto":  # on a GPU, the estimate below until the probe's answer (`probed_batching`)
        max_tokens = None
    auto = cfg.update_freq == "auto"
    share = math.ceil(update_tokens / (world_size * fill * (1 if auto else int(cfg.update_freq))))
    if max_tokens is None:
        max_tokens = share
        if device_type == "cpu":
            cap = cfg.recipe("cpu_max_tokens")
            max_tokens = math.ceil(share / math.ceil(share / cap)) if auto else min(share, cap)
        elif model is not None and gpu_memory and auto:
            parts = 1
            while parts < 64 and train_memory_bytes(model, math.ceil(share / parts), precision) > \
                    GPU_MEMORY_SHARE * gpu_memory:
                parts += 1
            max_tokens = math.ceil(share / parts)
    update_freq = max(1, round(share / max_tokens)) if auto else int(cfg.update_freq)
    return BatchPlan(max_tokens, update_freq, world_size, update_tokens, probe, fill)


def real_update_freq(plan: BatchPlan, mean_tgt_tokens: float) -> int:
    """--update-freq auto once the batches are made: the micro-batches per process whose real target tokens, on
    average `mean_tgt_tokens` each (as the loss counts them: with EOS), come nearest to the update size."""
    return max(1, round(plan.update_tokens / (plan.world_size * max(mean_tgt_tokens, 1.0))))


def probe_cap(plan: BatchPlan) -> int:
    """The largest micro-batch `--max-tokens auto` looks for: one process's share of the update (a larger one would
    only make the update larger than the recipe's)."""
    return math.ceil(plan.update_tokens / (plan.world_size * plan.fill))


def probed_batching(cfg: TrainConfig, plan: BatchPlan, fits: int) -> BatchPlan:
    """The batch plan once the probe found that micro-batches of `fits` tokens fit: with --update-freq auto, the
    process's share of the update split into the fewest equal micro-batches of at most `fits` tokens (25000 on a GPU
    that fits 14000: 2 x 12500, the update size kept); with a fixed --update-freq, micro-batches of `fits`. The
    run then counts the real target tokens of its batches again (`real_update_freq`)."""
    share = probe_cap(plan)
    if cfg.update_freq != "auto":
        return dataclasses.replace(plan, max_tokens=fits, probe=False)
    parts = math.ceil(share / max(1, min(fits, share)))
    max_tokens = math.ceil(share / parts)
    return dataclasses.replace(plan, max_tokens=max_tokens, update_freq=max(1, round(share / max_tokens)), probe=False)


def resolve_average_last(cfg: TrainConfig) -> int:
    """Checkpoints averaged into averaged.pt at the end: --average-last, else the preset's (5, big 20); 0 with
    --no-average."""
    if not cfg.average:
        return 0
    return cfg.average_last or cfg.recipe("average_last")


def resolve_save_every(cfg: TrainConfig, max_steps: int) -> int:
    """Updates between checkpoints: --save-every, else the preset's (the paper's ~10 minutes at its speed), or
    fewer in a run too short for that to leave AVERAGED_SHARE x its averaged checkpoints (a 1200-update tiny run
    averaging 5 saves every 60), but never fewer than MIN_SAVE_EVERY: a shorter run averages fewer checkpoints
    (`resolve_averaging`) rather than saving and validating every few updates."""
    if cfg.save_every is not None:
        return cfg.save_every
    wanted = max(resolve_average_last(cfg), 1) * AVERAGED_SHARE
    return min(cfg.recipe("save_every"), max(MIN_SAVE_EVERY, max_steps // wanted))


def resolve_save_minutes(cfg: TrainConfig) -> float | None:
    """Minutes between time-based checkpoints (besides those by updates): --save-every-minutes, or, when --max-time
    is set, max-time / (AVERAGED_SHARE x its averaged checkpoints) (--max-time 20 averaging 5: every minute), at
    least MIN_SAVE_MINUTES and at most 10, since the updates of a run stopped by time are not known in advance; else
    None (the presets save by updates)."""
    if cfg.save_every_minutes is not None:
        return cfg.save_every_minutes
    if cfg.max_time is not None:
        wanted = max(resolve_average_last(cfg), 1) * AVERAGED_SHARE
        return min(10.0, max(MIN_SAVE_MINUTES, cfg.max_time / wanted))
    return None


def resolve_averaging(cfg: TrainConfig, max_steps: int, save_every: int,
                      save_minutes: float | None) -> tuple[int, str | None]:
    """Checkpoints averaged into averaged.pt at the end, and why fewer than asked (None: as asked).

    Where nmt chose the interval (no --save-every, no --save-every-minutes), the average covers at most the run's
    last quarter: the checkpoints that fit there at the floors (MIN_SAVE_EVERY updates, MIN_SAVE_MINUTES) apart. A
    run too short for two of them gets averaged.pt all the same, holding its final weights, and says so."""
    asked = resolve_average_last(cfg)
    fits = []
    if cfg.save_every is None:
        fits.append((max_steps // AVERAGED_SHARE // save_every + 1, f"{max_steps} updates",
                     f"{save_every} updates"))
    if cfg.max_time is not None and cfg.save_every_minutes is None and save_minutes:
        fits.append((int(cfg.max_time / AVERAGED_SHARE / save_minutes + 1e-9) + 1, _minutes(cfg.max_time),
                     _minutes(save_minutes)))
    if asked <= 1 or not fits:
        return asked, None
    n, length, apart = min(fits)
    if n >= asked:
        return asked, None
    if n == 1:
        return 1, (f"a run of {length} is too short to average: checkpoints {apart} apart leave one in its last "
                   "quarter, so averaged.pt holds the final weights (--save-every or --save-every-minutes to average)")
    return n, (f"a run of {length} averages its last {n} checkpoints, not {asked}: checkpoints {apart} apart fit "
               f"{n} in its last quarter (--save-every or --save-every-minutes to average more)")


def _minutes(value: float) -> str:
    return f"{value:g} minute" + ("" if value == 1 else "s")


def resolve_valid_every(cfg: TrainConfig, save_every: int) -> int:
    """Updates between validations: --valid-every, else at the checkpoints saved by updates (`save_every`), or
    at every few of them in a short run, so that validations are at least MIN_VALID_EVERY updates apart (the
    1200-update tiny demo saves every 60 and validates every 240)."""
    if cfg.valid_every is not None:
        return cfg.valid_every
    return save_every * math.ceil(MIN_VALID_EVERY / save_every)


def resolve_valid_minutes(cfg: TrainConfig, save_minutes: float | None) -> float | None:
    """Minutes between validations by time: --valid-every-minutes, else, in a run that saves by time, every
    `save_minutes` but at least VALID_MINUTES apart (a validation of the valid split takes seconds to minutes, a
    checkpoint far less: --save-every-minutes 0.5 must not validate every 30 s); else None."""
    if cfg.valid_every_minutes is not None:
        return cfg.valid_every_minutes
    return None if save_minutes is None else max(save_minutes, VALID_MINUTES)


def resolve_keep_last(cfg: TrainConfig) -> int:
    return cfg.keep_last if cfg.keep_last is not None else max(5, resolve_average_last(cfg))
