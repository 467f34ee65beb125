"""`nmt train`: train the Transformer on a directory written by `nmt prepare`."""

from __future__ import annotations

import dataclasses
import inspect
import signal
import sys
import time
import typing
from enum import Enum
from pathlib import Path

import typer

from nmt_cli.commands.helpformat import usage
from nmt_cli.commands.messages import usage_error
from nmt_cli.commands.options import int_or_auto
from nmt_cli.runtime import defaults
from nmt_cli.runtime.precision import TrainPrecision
from nmt_cli.training.config import (
    COMPILE_SHAPES,
    MODEL,
    MODEL_OPTIONS,
    PRESET_NAMES,
    ModelOption,
    Option,
    TrainConfig,
    declaration,
    model_overrides,
)

_SUMMARY = "Train a Transformer on a prepared data directory"
_HELP = (
    "Train the Transformer on a directory written by nmt prepare, with the recipe of 'Attention Is All You Need': "
    "Adam (0.9, 0.98, 1e-9), the inverse-square-root schedule, label smoothing 0.1 and about 25000 real (unpadded) "
    "target tokens per update (--max-tokens x --update-freq x processes; the defaults reach it).\n\n"
    "RUN_DIR gets checkpoint_last.pt (to resume), checkpoint_best.pt (lowest validation loss, or highest BLEU with "
    "--valid-bleu), a checkpoint_<step>.pt every --save-every updates (the last --keep-last kept), averaged.pt "
    "(the mean of the last --average-last: the paper's 5, big 20), metrics.jsonl and train.log. A run resumes by "
    "itself when RUN_DIR holds checkpoint_last.pt; one that already reached its stop is left as it is. Ctrl-C "
    "saves a checkpoint and exits.\n\n"
    "RUN_DIR/config.yaml gets the run's recipe (model, recipe, data, machine): --config FILE reads such a file, "
    "whose values options given on the command line override, and --print-config prints the one a run would use."
)
_EPILOG = """\
Examples:
  nmt train data/ende -o runs/base --preset base
  nmt train data/ende -o runs/big --preset big --gpus 8 --precision bf16
  nmt train data/sample -o runs/tiny --preset tiny --max-time 5
  nmt train data/ende -o runs/b1 --gpus 1 --update-freq auto  # 8 GPUs' batch
  nmt train --print-config --preset big > big.yaml  # edit it, then:
  nmt train --config big.yaml data/ende -o runs/big2
  nmt train --config runs/base/config.yaml -o runs/b2 --seed 2  # run it again
  nmt train data/med -o runs/ft --init-from hf:Helsinki-NLP/opus-mt-en-de \\
      --lr 5e-5 --warmup 500 --max-steps 5000  # fine-tune an OPUS-MT model

  torchrun --nnodes 2 --nproc-per-node 8 --rdzv-backend c10d \\
      --rdzv-endpoint HOST:29500 -m nmt_cli.cli train data/ende -o runs/big \\
      --preset big
"""
CHILD_MAIN = "nmt_cli.training.launch:child_main"  # what the ranks nmt spawns run (distributed/spawn.py)


def _choice_enum(name: str, choices: tuple[str, ...]) -> type[Enum]:
    return Enum(name, {c: c for c in choices}, type=str)


Preset = _choice_enum("Preset", PRESET_NAMES)
CompileShapes = _choice_enum("CompileShapes", COMPILE_SHAPES)
_ENUMS = {"preset": Preset, "precision": TrainPrecision, "compile_shapes": CompileShapes}  # choices' declared names
_COMMAND_ONLY = {  # the command's own parameters (not recipe options), after DATA_DIR and -o
    "config": (Path, typer.Option(None, "--config", metavar="FILE",
                                  help="Read the recipe from this YAML file (a run's config.yaml, or what "
                                       "--print-config prints); options given here override it.")),
    "print_config": (bool, typer.Option(False, "--print-config",
                                        help="Print the recipe a run would use as YAML (the preset's, with the "
                                             "options given) and exit; DATA_DIR is not needed.")),
}


def _parameter(name: str, spec: Option, default, hint) -> inspect.Parameter:
    """One typer parameter from a TrainConfig field's declaration (training/config.py)."""
    if spec.choices:
        hint, default = _ENUMS[name], _ENUMS[name](default)
    elif spec.auto:
        hint = str
    elif spec.path:
        hint = Path
    else:
        hint = next((a for a in typing.get_args(hint) if a is not type(None)), hint)
    show = spec.show_default if spec.show_default is not None else default is not None
    common = dict(metavar=spec.metavar, help=spec.help, show_default=show)
    if spec.flags == ("ARG",):
        info = typer.Argument(default, **common)
    else:
        ranges = {k: v for k, v in (("min", spec.min), ("max", spec.max)) if v is not None}
        info = typer.Option(default, *spec.flags, rich_help_panel=spec.panel, callback=int_or_auto if spec.auto
                            else None, **ranges, **common)
    return inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=info, annotation=hint)


def _model_parameter(name: str, spec: ModelOption) -> inspect.Parameter:
    ranges = {k: v for k, v in (("min", spec.min), ("max", spec.max)) if v is not None}
    info = typer.Option(None, spec.flag, metavar=spec.metavar, rich_help_panel=MODEL, help=spec.help,
                        show_default=spec.show_default or True, **ranges)
    return inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=info, annotation=spec.type)


def cli_parameters() -> list[inspect.Parameter]:
    """`nmt train`'s parameters, in --help's order: every TrainConfig field declared with a flag, the command's own
    --config and --print-config after -o, the model options (MODEL_OPTIONS) where TrainConfig.model is."""
    hints = typing.get_type_hints(TrainConfig)
    params = [inspect.Parameter("ctx", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=typer.Context)]
    for f in dataclasses.fields(TrainConfig):
        spec = declaration(f.name)
        if f.name == "model":
            params += [_model_parameter(name, m) for name, m in MODEL_OPTIONS.items()]
        elif spec.flags:
            params.append(_parameter(f.name, spec, f.default, hints[f.name]))
        if f.name == "out_dir":
            params += [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=info, annotation=hint)
                       for name, (hint, info) in _COMMAND_ONLY.items()]
    return params


def _options(values: dict) -> dict:
    """TrainConfig's keyword arguments from the command line's values."""
    options = {}
    for f in dataclasses.fields(TrainConfig):
        if f.name in values:
            spec, value = declaration(f.name), values[f.name]
            if isinstance(value, Enum):
                value = value.value
            elif isinstance(value, Path):
                value = str(value)
            options[f.name] = spec.from_cli(value) if spec.from_cli is not None else value
    options["model"] = model_overrides(values)
    return options


def register(app: typer.Typer) -> None:
    def train(ctx: typer.Context, **values) -> None:
        config, print_config = values["config"], values["print_config"]
        from nmt_cli.runtime import cpus
        from nmt_cli.training import recipe_file
        from nmt_cli.training.distributed.spawn import Ranks, early_world_size

        options = _options(values)

        if config is not None:
            options = _over_file(recipe_file.read(config), options, _typed_options(ctx))
        if print_config:
            typer.echo(recipe_file.preview(TrainConfig(**options).validate()), nl=False)
            return
        for key, what in (("data_dir", "argument DATA_DIR"), ("out_dir", "option -o / --output RUN_DIR")):
            if options[key] is None:
                where = f"; {config} has no {'data.' if key == 'data_dir' else ''}{key}" if config else ""
                raise usage_error(f"missing {what}{where}")
        if options["threads"] is None:
            cpus.start()  # the free cores, sampled while the run is planned
        ranks, world = None, early_world_size(options["gpus"], options["cpu_procs"])
        if world is not None:  # the other processes start first: their imports overlap this one's (distributed/spawn.py)
            if options["threads"] is None:
                cpus.start().others_busy()  # (the free cores, counted before they load them)
            ranks = Ranks(world, CHILD_MAIN)  # (launch.CHILD_MAIN, named here without importing torch)
        try:
            from nmt_cli.training.launch import train as run_training
        except BaseException:
            if ranks is not None:
                ranks.cancel()
            raise

        cfg = TrainConfig(**options)
        display = Display(live=sys.stderr.isatty(), log_every=cfg.log_every)
        run_dir = Path(cfg.out_dir)
        try:
            result = run_training(cfg, progress=display, ranks=ranks)
        except KeyboardInterrupt:  # a second Ctrl-C/SIGTERM: stop at once (checkpoint files are written atomically)
            display.close()
            held = (f"still holds update {display.last_saved}" if display.last_saved is not None
                    else "was not written by this run")
            display.line(f"error: interrupted again before the run could save; {run_dir / 'checkpoint_last.pt'} {held} "
                         "(a checkpoint being written is discarded whole); run the same command to resume")
            raise typer.Exit(130) from None
        finally:
            display.close()
        if result.already is not None:
            display.line(f"{run_dir} already reached its stop ({result.already}); nothing done: raise that stop "
                         "(--max-steps, --max-time, --max-epochs or --patience) to train further")
            return
        if result.ranks_agree is False:
            display.line("warning: the processes ended with different weights (a bug); please report it")
        if result.signum is not None:
            name = signal.Signals(result.signum).name
            display.line(f"stopped by {name} at update {result.step}; saved {result.last}; "
                         "run the same command to resume")
            raise typer.Exit(128 + result.signum)

    train.__signature__ = inspect.Signature(cli_parameters())
    train.__annotations__ = {p.name: p.annotation for p in train.__signature__.parameters.values()}
    app.command("train", cls=usage("DATA_DIR -o RUN_DIR [OPTIONS]", "--config FILE [DATA_DIR] [-o RUN_DIR] [OPTIONS]",
                                   "--print-config [--preset P] [OPTIONS]"),
                short_help=_SUMMARY, help=_HELP, epilog=_EPILOG)(train)


def _typed_options(ctx: typer.Context) -> set[str]:
    """The TrainConfig fields the command line gave explicitly (not left at their defaults)."""
    typed = set()
    for name in ctx.params:
        source = ctx.get_parameter_source(name)
        if source is not None and source.name not in ("DEFAULT", "DEFAULT_MAP") and name not in MODEL_OPTIONS:
            typed.add(name)
    return typed


def _over_file(file: dict, options: dict, typed: set[str]) -> dict:
    """The file's values, overridden by the options typed on the command line (model options: those given)."""
    merged = {**options, **{k: v for k, v in file.items() if k not in typed}}
    merged["model"] = {**file.get("model", {}), **options["model"]}
    return merged


def _fmt_time(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    seconds = int(seconds)
    h, rest = divmod(seconds, 3600)
    return f"{h}:{rest // 60:02d}:{rest % 60:02d}"


def _fmt_interval(seconds: float) -> str:
    return f"{seconds:.3g} s" if seconds < 60 else f"{seconds / 60:.3g} min"


def _fmt_overhead(e: dict) -> str:
    """The end summary's second line: what validating and saving cost the run, over all its resumes."""
    elapsed = max(e["elapsed"], 1e-9)
    return (f"validation: {e['validations']} in {_fmt_interval(e['valid_seconds'])} "
            f"({100 * e['valid_seconds'] / elapsed:.1f}% of the run); saving: {e['saves']} in "
            f"{_fmt_interval(e['save_seconds'])} ({100 * e['save_seconds'] / elapsed:.1f}%)")


def _fmt_valid(e: dict) -> str:
    """The validation figures under the names metrics.jsonl uses (valid_nll is what "best" tracks unless
    --valid-bleu)."""
    text = f"valid_nll {e['valid_nll']:.4f}  valid_ppl {e['valid_ppl']:.2f}  valid_loss {e['valid_loss']:.4f}"
    if e.get("valid_bleu") is not None:
        text += f"  valid_bleu {e['valid_bleu']:.2f}"
    for key, d in (e.get("directions") or {}).items():  # a multilingual run: the figures above are the means
        text += f"  | {key} nll {d['valid_nll']:.4f}" + (f" bleu {d['valid_bleu']:.2f}" if "valid_bleu" in d else "")
    return text + (f"  (best {e['criterion']} so far)" if e.get("improved") else "")




class Display:
    """Renders training events: a rich live panel on a terminal, plain lines (every --log-every updates or 30 s)
    otherwise. Everything goes to stderr, and from the run's start on also to RUN_DIR/train.log (each line with
    its time; the status every --log-every updates)."""

    def __init__(self, live: bool, log_every: int):
        from rich.console import Console

        self.console = Console(stderr=True, highlight=False, soft_wrap=True)
        self.log_every, self.live, self._live = log_every, live, None
        self._last_plain = time.monotonic()
        self._last_render = 0.0
        self.last_saved: int | None = None  # the update checkpoint_last.pt holds (this run's saves, or resumed)
        self.log_path: Path | None = None  # train.log, once the run has started

    def line(self, text: str) -> None:
        self.console.print(text, markup=False) if self._live is None else self._live.console.print(text, markup=False)
        self._log(text)

    def _log(self, text: str) -> None:
        if self.log_path is None:
            return
        try:
            with open(self.log_path, "a", encoding="utf-8") as f:
                f.write(f"{time.strftime('%Y-%m-%d %H:%M:%S')} | {text}\n")
        except OSError:  # a full disk must not stop training (metrics.jsonl and the checkpoints say the rest)
            self.log_path = None

    def __call__(self, e: dict) -> None:
        kind = e["kind"]
        if kind == "start":
            self._start(e)
        elif kind == "train":
            self._train(e)
        elif kind == "valid":
            self.line(f"update {e['step']} epoch {e['epoch']}: {_fmt_valid(e)} ({_fmt_interval(e['seconds'])})")
        elif kind == "save":
            self.last_saved = e["step"]
            if e.get("periodic"):
                self.line(f"update {e['step']}: saved checkpoint_{e['step']}.pt and checkpoint_last.pt "
                          f"({_fmt_interval(e['seconds'])})")
        elif kind == "overflow":
            self.line(f"update {e['step']}: fp16 gradient overflow, update skipped ({e['overflows']} so far)")
        elif kind == "threads":
            self.line(f"update {e['step']}: threads: {e['reason']} (the load changed)")
        elif kind == "note":
            self.line(f"note: {e['message']}")
        elif kind == "averaged":
            self.line(f"averaged the last {e['n']} checkpoints -> {e['path']}" if e["n"] > 1 else
                      f"the final weights (nothing to average) -> {e['path']}")
        elif kind == "end":
            self.close()
            best = (f", best {e['criterion']} {e['best_valid']:.4f} at update {e['best_step']}"
                    if e.get("best_valid") is not None else "")
            self.line(f"done: {e['step']} updates in {_fmt_time(e['elapsed'])} (stopped by {e['stopped_by']})"
                      f"{best}; checkpoints in {e['out_dir']}")
            self.line(_fmt_overhead(e))

    def _start(self, e: dict) -> None:
        from nmt_cli.training.files import TRAIN_LOG

        self.log_path = Path(e["out_dir"]) / TRAIN_LOG
        where = f"{e['world_size']} x {e['device']}" if e["world_size"] > 1 else e["device"]
        if e.get("stale_tmp_removed"):
            self.line(f"removed {e['stale_tmp_removed']} temporary file(s) ({e['stale_tmp_bytes'] / 2**20:.0f} MB) "
                      "that an interrupted save left in the run directory")
        if e["resumed_at"] is not None:
            self.last_saved = e["resumed_at"]
            self.line(f"resuming {e['out_dir']} at update {e['resumed_at']}")
        threads = f"; threads: {e['threads_reason']}" if e.get("threads_reason") else ""
        self.line(f"training {e['preset']} ({e['params'] / 1e6:.1f}M parameters) on {where}, {e['precision']}"
                  f"{threads}")
        self.line(f"batch: --max-tokens {e['max_tokens']} x --update-freq {e['update_freq']} x {e['world_size']} "
                  f"process(es): ~{e['tgt_tokens_per_update']:.0f} target and ~{e['src_tokens_per_update']:.0f} source "
                  f"tokens per update, real ones (--update-tokens {e['update_tokens']}); at most "
                  f"{e['max_tokens_per_update']} padded ({e['batches_per_epoch']} batches/epoch, "
                  f"{100 * e['padding_efficiency']:.0f}% non-pad)")
        if e.get("max_tokens_auto"):
            self.line(f"--max-tokens auto: {e['max_tokens_auto']}")
        if e["device"] == "cuda" and e["max_tokens"] < defaults.MAX_TOKENS_PER_DEVICE["cuda"]:
            self.line(f"note: micro-batches of {e['max_tokens']} tokens keep a large GPU waiting for kernel launches; "
                      "docs/train.md says how to use larger ones")
        stops = [f"{e['max_steps']} updates"]
        if e["max_time"]:
            stops.append(f"{e['max_time']:g} minutes")
        if e["max_epochs"]:
            stops.append(f"{e['max_epochs']} epochs")
        if e["warmup"] <= e["max_steps"]:
            lr = f"lr rises to its peak {e['peak_lr']:.3g} at update {e['warmup']}, then falls as 1/sqrt(update)"
        else:
            lr = (f"lr rises over {e['warmup']} warmup updates, past this run's {e['max_steps']}: it ends at "
                  f"{e['lr_at_end']:.3g}, below the peak {e['peak_lr']:.3g}")
        self.line(f"{lr}; stop at {' or '.join(stops)}")
        saves = f"a checkpoint every {e['save_every']} updates"
        if e.get("save_minutes"):
            saves += f" and every {_fmt_interval(e['save_minutes'] * 60)}"
        valids = "no validation (no valid split)"
        if e.get("has_valid", True):
            valids = f"validation every {e['valid_every']} updates"
            if e.get("valid_minutes"):
                valids += f", every {_fmt_interval(e['valid_minutes'] * 60)}"
            valids += " and at the end"
        average = "no averaged.pt (--no-average)"
        if e.get("average_last"):
            average = (f"averaged.pt from the last {e['average_last']} at the end" if e["average_last"] > 1
                       else "averaged.pt from the last checkpoint at the end")
        self.line(f"{saves}; {valids}; {average}")
        if e.get("average_note"):
            self.line(f"note: {e['average_note']}")
        if e.get("slow_precision"):
            self.line(f"warning: {e['slow_precision']}")
        if e.get("tensorboard_note"):
            self.line(f"note: {e['tensorboard_note']}")
        if self.live:
            from rich.live import Live

            self._live = Live(console=self.console, refresh_per_second=4, transient=True)
            self._live.start()

    def _status(self, e: dict) -> str:
        # the loss is read from the device at log lines only: between them it is the last one read
        losses = f"loss {e['loss']:.3f}  ppl {e['ppl']:.2f}" if "loss" in e else "loss -  ppl -"
        return (f"update {e['step']}/{e['max_steps']}  epoch {e['epoch']}  {losses}  "
                f"lr {e['lr']:.2e}  {e['tgt_tokens_per_s']:.0f} tgt tok/s  elapsed {_fmt_time(e['elapsed'])}  "
                f"ETA {_fmt_time(e['eta'])}")

    def _train(self, e: dict) -> None:
        now = time.monotonic()
        if self._live is not None:
            if now - self._last_render > 0.25:
                from rich.text import Text

                self._live.update(Text(self._status(e)))
                self._last_render = now
            if e["step"] % self.log_every == 0:
                self.line(self._status(e))
        elif e["step"] % self.log_every == 0 or now - self._last_plain >= 30:
            self.line(self._status(e))
            self._last_plain = now

    def close(self) -> None:
        if self._live is not None:
            self._live.stop()
            self._live = None
