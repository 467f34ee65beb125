"""Training configuration: every option of `nmt train` declared once, as a field of `TrainConfig`.

A field's declaration (`option(...)`) holds its type and default, its default per preset (`per_preset`), its help
text, its command-line flag and help group, and its place in the recipe file (`section`). From it come the
command-line options (commands/train.py: `cli_parameters`), `--print-config`, `RUN_DIR/config.yaml` and
`--config` (recipe_file.py), `config.json` (plan.py) and the checks of `TrainConfig.validate`.

Options left at None take the preset's recipe default (`recipe`) when the run is planned; the resolved values
are what `config.json` records beside the checkpoints.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

from nmt_cli.config import PRESETS
from nmt_cli.errors import ConfigError
from nmt_cli.runtime import defaults
from nmt_cli.runtime.precision import TRAIN_PRECISIONS

# The paper's batch: ~25000 source + ~25000 target tokens per update (8 GPUs together), counted as real tokens.
PAPER_UPDATE_TOKENS = 25000
PRESET_NAMES = tuple(PRESETS)  # the model sizes (nmt_cli/config.py)

# Per-preset recipe values (the fields' `per_preset`): base/big are the paper's; tiny is tuned for minutes-long CPU
# runs on the sample corpus (a short warmup and small updates learn it in a few hundred updates, where the paper's
# settings are still warming up).
# Checkpoints: the paper wrote one every 10 minutes on 8 P100s and averaged the last 5 (base) / 20 (big): at its
# speed (base 100k updates in 12 hours, big 300k in 3.5 days) that is about every 1,400 and 600 updates. Saving by
# updates keeps the averaged window the paper's on any hardware (10 minutes on a current GPU is many more updates).
CPU_MAX_TOKENS = {"tiny": 2048, "base": 8192, "big": 8192}  # the default micro-batch's cap on CPU (not an option)
AVERAGED_SHARE = 4  # a run shorter than the preset's saves at least 4 x average_last times: its average covers
# at most its last quarter (the paper's base average covers the last 7%)
# Floors on the intervals nmt chooses itself, so that saving and validating cost a run a few percent of its time
# whatever its length (docs/design.md#saving-and-validating): a shorter run averages fewer checkpoints instead.
MIN_SAVE_EVERY = 50  # updates between checkpoints, at least (--save-every is taken as given)
MIN_VALID_EVERY = 200  # updates between validations, at least (--valid-every is taken as given): a validation
# costs several updates' time, a save a fraction of one
MIN_SAVE_MINUTES = 0.5  # minutes between checkpoints by time, at least (--save-every-minutes is taken as given)
VALID_MINUTES = 5.0  # minutes between validations by time, at least (--valid-every-minutes is taken as given)
KEEP_AT_LEAST = 5  # periodic checkpoints kept by default: max(5, average_last)

# Model options a user may override on the command line (ModelConfig field names).
MODEL_OVERRIDES = ("d_model", "d_ff", "n_heads", "encoder_layers", "decoder_layers", "dropout",
                   "attention_dropout", "activation_dropout", "max_positions", "norm_first", "share_embeddings")
FINE_TUNE_OVERRIDES = ("dropout", "attention_dropout", "activation_dropout")  # what --init-from lets a run change
COMPILE_SHAPES = ("buckets", "dynamic")  # how --compile meets changing batch shapes (training/loop.py)

# Help groups of `nmt train --help` (typer's rich_help_panel)
STOP, SAVE, VALID, RECIPE, MODEL, MACHINE = (
    "Stopping", "Checkpoints", "Validation", "Recipe", "Model (overrides the preset)", "Machine")


@dataclass(frozen=True)
class Option:
    """What one TrainConfig field is to the command line and to the recipe file (see `option`)."""

    help: str
    section: str  # the recipe file's: "top", "recipe", "data", "machine"; "" (not in the file) or "model"
    flags: tuple[str, ...] = ()  # command-line names; () for none; ("ARG",) for the positional argument
    panel: str | None = None  # help group
    metavar: str | None = None
    min: float | None = None  # the least value (the command line's range and `validate`'s "must be positive")
    max: float | None = None
    show_default: str | None = None  # the help's [default: ...] where the default is not a single value
    per_preset: dict | None = None  # preset -> the value a None stands for (`recipe`)
    choices: tuple[str, ...] | None = None
    auto: bool = False  # the command line's N|auto (an integer or the word auto)
    note: str | None = None  # the recipe file's comment on the value (how a null or auto is decided)
    not_in_file: str | None = None  # why a file may not set it (the refusal's hint)
    from_cli: object = None  # the command line's value -> the field's (None: as it is)
    path: bool = False  # the command line reads a path (normalised as pathlib does: `runs/x/` is `runs/x`)


@dataclass(frozen=True)
class ModelOption:
    """A command-line option that overrides the preset's model (TrainConfig.model): the ModelConfig fields it sets
    (a later, more specific option wins: --encoder-layers over --layers)."""

    flag: str
    help: str
    type: type = int
    fields: tuple[str, ...] = ()
    metavar: str = "N"
    min: float = 1
    max: float | None = None
    show_default: str | None = None


MODEL_OPTIONS: dict[str, ModelOption] = {
    "d_model": ModelOption("--d-model", "Model width.", fields=("d_model",)),
    "d_ff": ModelOption("--d-ff", "Feed-forward width.", fields=("d_ff",)),
    "heads": ModelOption("--heads", "Attention heads.", fields=("n_heads",)),
    "layers": ModelOption("--layers", "Encoder and decoder layers.", fields=("encoder_layers", "decoder_layers")),
    "encoder_layers": ModelOption("--encoder-layers", "Encoder layers.", fields=("encoder_layers",)),
    "decoder_layers": ModelOption("--decoder-layers", "Decoder layers.", fields=("decoder_layers",)),
    "dropout": ModelOption("--dropout", "Dropout (P_drop).", float, ("dropout",), "P", 0.0, 0.99),
    "attention_dropout": ModelOption("--attention-dropout", "Dropout on attention weights.", float,
                                     ("attention_dropout",), "P", 0.0, 0.99, show_default="0"),
}


def model_overrides(values: dict) -> dict:
    """TrainConfig.model from the model options' values (name -> value or None; MODEL_OPTIONS' order: later
    options win)."""
    model = {}
    for name, spec in MODEL_OPTIONS.items():
        if values.get(name) is not None:
            model.update(dict.fromkeys(spec.fields, values[name]))
    return model


def option(default, help: str, section: str = "recipe", *, factory=None, **kw):
    """A TrainConfig field and its declaration (`Option`)."""
    meta = {"option": Option(help, section, **kw)}
    if factory is not None:
        return field(default_factory=factory, metadata=meta)
    return field(default=default, metadata=meta)


def _per_preset(tiny, base, big) -> dict:
    return {"tiny": tiny, "base": base, "big": big}


@dataclass
class TrainConfig:
    """Everything `nmt train` accepts, each option declared once (`option`). None = the preset's recipe default
    (`per_preset`, `recipe` and the `resolve_*` functions). The fields are in the order of `nmt train --help`."""

    data_dir: str = option(None, "Data directory written by nmt prepare (with --config: its data_dir when not "
                           "given).", "data", flags=("ARG",), metavar="DATA_DIR", path=True)
    out_dir: str = option(None, "Run directory for checkpoints and logs (with --config: its out_dir when not "
                          "given).", "top", flags=("-o", "--output"), metavar="RUN_DIR", path=True)
    preset: str = option("base", "Model size and recipe defaults.", "top", flags=("--preset",),
                         choices=PRESET_NAMES)
    init_from: str | None = option(
        None, "Fine-tune: start from this model's weights (a checkpoint, a MarianMT/OPUS-MT folder or hf:ORG/NAME) "
        "with a new optimizer, schedule and step count; its architecture is kept. Prepare DATA_DIR with nmt prepare "
        "--tokenizer-from MODEL.", "top", flags=("--init-from",), metavar="MODEL")
    seed: int = option(1, "Random seed.", flags=("--seed",), metavar="N")
    # stopping
    max_steps: int | None = option(None, "Stop after N updates.", flags=("--max-steps",), panel=STOP, metavar="N",
                                   min=1, per_preset=_per_preset(30000, 100000, 300000),
                                   show_default="tiny 30000, base 100000, big 300000")
    max_epochs: int | None = option(None, "Stop after N epochs.", flags=("--max-epochs",), panel=STOP, metavar="N",
                                    min=1, note="no limit")
    max_time: float | None = option(None, "Stop after this many minutes of training.", flags=("--max-time",),
                                    panel=STOP, metavar="MINUTES", min=0.01,
                                    note="no limit (minutes of training, over all resumes)")
    patience: int | None = option(None, "Stop after N validations without improvement.", flags=("--patience",),
                                  panel=STOP, metavar="N", min=1, note="no limit")
    # checkpoints
    save_every: int | None = option(
        None, "Save a checkpoint every N updates (base and big: the paper's 10 minutes at its speed).",
        flags=("--save-every",), panel=SAVE, metavar="N", min=1, per_preset=_per_preset(1000, 1400, 600),
        show_default="tiny 1000, base 1400, big 600; a shorter run: max-steps / (4 x --average-last), at least 50",
        note="a run too short for 4 x average_last of them: max_steps / (4 x average_last), at least 50")
    save_every_minutes: float | None = option(
        None, "Also save a checkpoint every this many minutes.", flags=("--save-every-minutes",), panel=SAVE,
        metavar="MINUTES", min=0.01, show_default="none; with --max-time: max-time / (4 x --average-last), from 0.5 "
        "to 10")
    keep_last: int | None = option(None, "Keep the last K checkpoint_<step>.pt files.", flags=("--keep-last",),
                                   panel=SAVE, metavar="K", min=1, show_default="max(5, --average-last)",
                                   note="max(5, average_last)")
    average_last: int | None = option(
        None, "At the end, write averaged.pt from the last N checkpoints.", flags=("--average-last",), panel=SAVE,
        metavar="N", min=1, per_preset=_per_preset(5, 5, 20), show_default="5; big 20 (the paper)",
        note="fewer where a run's last quarter holds fewer checkpoints (the run's header says so)")
    average: bool = option(True, "Write averaged.pt at the end.", flags=("--average/--no-average",), panel=SAVE)
    resume: bool | None = option(None, "Resume from RUN_DIR/checkpoint_last.pt, or start afresh.", "",
                                 flags=("--resume/--no-resume",), panel=SAVE,
                                 show_default="resume when RUN_DIR holds checkpoint_last.pt",
                                 not_in_file="whether to resume is decided by each command (--resume/--no-resume); "
                                 "remove it")
    # validation
    valid_every: int | None = option(None, "Validate every N updates (and at the end).", flags=("--valid-every",),
                                     panel=VALID, metavar="N", min=1,
                                     show_default="at the checkpoints by updates (--save-every), at least 200 apart")
    valid_every_minutes: float | None = option(
        None, "Also validate every this many minutes.", flags=("--valid-every-minutes",), panel=VALID,
        metavar="MINUTES", min=0.01,
        show_default="none; a run that saves by time: at those checkpoints, at least 5 minutes apart")
    valid_bleu: bool = option(False, "Also compute validation BLEU (beam search); best = highest BLEU.",
                              flags=("--valid-bleu",), panel=VALID)
    # multilingual data
    lang_temperature: float = option(
        5.0, "Multilingual data: each direction's share of the training pairs by its size to the power 1/T (1: as "
        "the data is; higher: more even; 5 as M2M-100 and Arivazhagan et al. 2019). The smaller directions are "
        "repeated, the larger never cut.", flags=("--lang-temperature",), panel=RECIPE, metavar="T", min=0.01)
    valid_beam: int = option(defaults.BEAM, "Beam size for --valid-bleu.", flags=("--valid-beam",), panel=VALID,
                             metavar="N", min=1)
    # optimisation (Adam(0.9, 0.98, 1e-9), inverse-square-root schedule, label smoothing 0.1)
    lr: float | None = option(None, "Peak learning rate.", flags=("--lr",), panel=RECIPE, metavar="LR", min=0.0,
                              show_default="d_model^-0.5 * warmup^-0.5", from_cli=lambda v: v or None,
                              note="d_model^-0.5 * warmup^-0.5")
    warmup: int | None = option(None, "Warmup updates.", flags=("--warmup",), panel=RECIPE, metavar="N", min=1,
                                per_preset=_per_preset(400, 4000, 4000), show_default="tiny 400, base and big 4000")
    # batching
    max_tokens: int | str | None = option(
        None, "Padded tokens per micro-batch per process; auto: the largest that fits the GPU, probed at the start "
        "(on CPU: the default).", flags=("--max-tokens",), panel=RECIPE, metavar="N|auto", auto=True,
        show_default="what holds the update's real tokens / processes, at most 8192 on CPU (tiny 2048)")
    update_freq: int | str = option(
        "auto", "Micro-batches per process per update, or auto to reach --update-tokens. Processes x update-freq "
        "fixes the update: 1 GPU with --update-freq 8 trains on the batches of 8 GPUs with 1.",
        flags=("--update-freq",), panel=RECIPE, metavar="N|auto", auto=True,
        note="auto: the micro-batches that hold update_tokens real target tokens, counted on the data")
    update_tokens: int | None = option(
        None, "Real (unpadded) target tokens per update, as the loss counts them.", flags=("--update-tokens",),
        panel=RECIPE, metavar="N", min=1, per_preset=_per_preset(2048, PAPER_UPDATE_TOKENS, PAPER_UPDATE_TOKENS),
        show_default="25000; tiny 2048")
    clip_norm: float = option(0.0, "Clip the gradient norm (0: off).", flags=("--clip-norm",), panel=RECIPE,
                              metavar="NORM", min=0.0)
    label_smoothing: float = option(0.1, "Label smoothing.", flags=("--label-smoothing",), panel=RECIPE,
                                    metavar="EPSILON", min=0.0, max=0.99)
    adam_betas: tuple[float, float] = option((0.9, 0.98), "Adam's betas.")
    adam_eps: float = option(1e-9, "Adam's epsilon.")
    model: dict = option(None, "ModelConfig overrides, e.g. {'d_model': 256} (the model options below).", "model",
                         factory=dict)
    # machine
    gpus: int | None = option(None, "GPUs, one process each (NCCL).", "machine", flags=("--gpus",), panel=MACHINE,
                              metavar="N", min=0, show_default="1 if CUDA is available, else 0: CPU")
    cpu_procs: int = option(1, "Processes on CPU, over gloo (tests, CI).", "machine", flags=("--cpu-procs",),
                            panel=MACHINE, metavar="N", min=1)
    precision: str = option(
        "auto", "auto: bf16 where the hardware runs it natively (GPUs of compute capability 8.0 or later, CPUs with "
        "AMX or AVX512-BF16), fp16 on older GPUs, else fp32.", "machine", flags=("--precision",), panel=MACHINE,
        choices=TRAIN_PRECISIONS)
    compile: bool = option(False, "Use torch.compile.", "machine", flags=("--compile",), panel=MACHINE)
    compile_shapes: str = option(
        "buckets", "With --compile: buckets pads every batch to one of a few shapes (each compiled once); dynamic "
        "compiles once for any shape (no padding beyond the batch's longest sentence, but far slower than eager: see "
        "docs/train.md).", "machine", flags=("--compile-shapes",), panel=MACHINE, choices=COMPILE_SHAPES)
    threads: int | None = option(
        None, "Torch threads per process (default: the cores not busy with other work, shared by its processes; one "
        "process counts again every 15 s).", "machine", flags=("--threads",), panel=MACHINE, metavar="N", min=1,
        show_default="the free cores / processes")
    dist_timeout: float = option(
        5.0, "With several processes: when one stops answering (dead, stopped, hung node) for this long, the others "
        "end the run with one line naming it (torchrun --max-restarts then restarts it).", "machine",
        flags=("--dist-timeout",), panel=MACHINE, metavar="MINUTES", min=0.01)
    log_every: int = option(100, "Updates between log lines.", "machine", flags=("--log-every",), panel=MACHINE,
                            metavar="N", min=1)

    def validate(self) -> TrainConfig:
        for f in dataclasses.fields(self):  # the declared choices and least values
            spec, value = declaration(f.name), getattr(self, f.name)
            if spec.choices and value not in spec.choices:
                what = {"preset": "preset", "precision": "precision"}.get(f.name, f"--{_flag(f.name)}")
                raise ConfigError(f"unknown {what} {value!r}; choose {_one_of(f.name, spec.choices)}")
            if spec.auto and isinstance(value, str) and value != "auto":
                try:
                    value = int(value)
                except ValueError as exc:
                    raise ConfigError(f"--{_flag(f.name)} must be a positive integer or 'auto', got "
                                      f"{value!r}") from exc
                setattr(self, f.name, value)
        bad = sorted(set(self.model) - set(MODEL_OVERRIDES))
        if bad:
            raise ConfigError(f"unknown model option(s) {bad}; known: {', '.join(MODEL_OVERRIDES)}")
        if self.cpu_procs < 1:
            raise ConfigError(f"--cpu-procs must be at least 1, got {self.cpu_procs}")
        for f in dataclasses.fields(self):
            spec, value = declaration(f.name), getattr(self, f.name)
            positive = (spec.min is not None and spec.min > 0) or spec.auto and f.name != "update_freq" \
                or f.name == "lr"
            if positive and value is not None and value != "auto" and value <= 0:
                raise ConfigError(f"--{_flag(f.name)} must be positive, got {value}")
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
        if self.gpus is not None and self.gpus < 0:
            raise ConfigError(f"--gpus must be >= 0, got {self.gpus}")
        if self.cpu_procs > 1 and self.gpus:
            raise ConfigError("--cpu-procs runs on CPU; it cannot be combined with --gpus")
        return self

    def recipe(self, key: str):
        """The value the preset gives option `key` (its `per_preset`), or the CPU micro-batch cap."""
        return recipe(self.preset, key)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


_DECLARED = {f.name: f.metadata["option"] for f in dataclasses.fields(TrainConfig)}


def declaration(name: str) -> Option:
    """Option `name`'s declaration."""
    return _DECLARED[name]


def declarations() -> dict[str, Option]:
    """Every TrainConfig field's declaration, in the fields' order."""
    return dict(_DECLARED)


def recipe(preset: str, key: str):
    """What preset `preset` gives option `key` where the run leaves it None (`per_preset`), or "cpu_max_tokens"."""
    if key == "cpu_max_tokens":
        return CPU_MAX_TOKENS[preset]
    return _DECLARED[key].per_preset[preset]


RECIPES: dict[str, dict] = {p: {**{k: o.per_preset[p] for k, o in _DECLARED.items() if o.per_preset},
                                "cpu_max_tokens": CPU_MAX_TOKENS[p]} for p in PRESET_NAMES}


def _flag(name: str) -> str:
    return name.replace("_", "-")


def _one_of(name: str, choices) -> str:
    if name == "compile_shapes":
        return " or ".join(choices)
    return ("one of: " if name == "preset" else "one of ") + ", ".join(choices)


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
    return cfg.keep_last if cfg.keep_last is not None else max(KEEP_AT_LEAST, resolve_average_last(cfg))
