"""`nmt train`: train the Transformer on a directory written by `nmt prepare`."""

from __future__ import annotations

import signal
import sys
import time
from enum import Enum
from pathlib import Path

import typer

from nmt_cli.commands.helpformat import usage
from nmt_cli.commands.messages import usage_error
from nmt_cli.commands.options import int_or_auto
from nmt_cli.runtime import defaults
from nmt_cli.runtime.precision import TrainPrecision

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
# Option groups in --help
_STOP, _SAVE, _VALID, _RECIPE, _MODEL, _MACHINE = (
    "Stopping", "Checkpoints", "Validation", "Recipe", "Model (overrides the preset)", "Machine")


class Preset(str, Enum):
    tiny = "tiny"
    base = "base"
    big = "big"


class CompileShapes(str, Enum):  # training/config.py's COMPILE_SHAPES
    buckets = "buckets"
    dynamic = "dynamic"


def register(app: typer.Typer) -> None:
    @app.command("train", cls=usage("DATA_DIR -o RUN_DIR [OPTIONS]", "--config FILE [DATA_DIR] [-o RUN_DIR] [OPTIONS]",
                                    "--print-config [--preset P] [OPTIONS]"),
                 short_help=_SUMMARY, help=_HELP, epilog=_EPILOG)
    def train(
        ctx: typer.Context,
        data_dir: Path = typer.Argument(None, metavar="DATA_DIR", show_default=False,
                                        help="Data directory written by nmt prepare (with --config: its data_dir "
                                             "when not given)."),
        output: Path = typer.Option(None, "-o", "--output", metavar="RUN_DIR", show_default=False,
                                    help="Run directory for checkpoints and logs (with --config: its out_dir when "
                                         "not given)."),
        config: Path = typer.Option(None, "--config", metavar="FILE",
                                    help="Read the recipe from this YAML file (a run's config.yaml, or what "
                                         "--print-config prints); options given here override it."),
        print_config: bool = typer.Option(False, "--print-config",
                                          help="Print the recipe a run would use as YAML (the preset's, with the "
                                               "options given) and exit; DATA_DIR is not needed."),
        preset: Preset = typer.Option(Preset.base, "--preset", help="Model size and recipe defaults."),
        init_from: str = typer.Option(
            None, "--init-from", metavar="MODEL",
            help="Fine-tune: start from this model's weights (a checkpoint, a MarianMT/OPUS-MT folder or "
                 "hf:ORG/NAME) with a new optimizer, schedule and step count; its architecture is kept. Prepare "
                 "DATA_DIR with nmt prepare --tokenizer-from MODEL."),
        seed: int = typer.Option(1, "--seed", metavar="N", help="Random seed."),
        max_steps: int = typer.Option(None, "--max-steps", min=1, metavar="N", rich_help_panel=_STOP,
                                      show_default="tiny 30000, base 100000, big 300000",
                                      help="Stop after N updates."),
        max_epochs: int = typer.Option(None, "--max-epochs", min=1, metavar="N", rich_help_panel=_STOP,
                                       help="Stop after N epochs."),
        max_time: float = typer.Option(None, "--max-time", min=0.01, metavar="MINUTES", rich_help_panel=_STOP,
                                       help="Stop after this many minutes of training."),
        patience: int = typer.Option(None, "--patience", min=1, metavar="N", rich_help_panel=_STOP,
                                     help="Stop after N validations without improvement."),
        save_every: int = typer.Option(
            None, "--save-every", min=1, metavar="N", rich_help_panel=_SAVE,
            show_default="tiny 1000, base 1400, big 600; a shorter run: max-steps / (4 x --average-last), at least 50",
            help="Save a checkpoint every N updates (base and big: the paper's 10 minutes at its speed)."),
        save_every_minutes: float = typer.Option(
            None, "--save-every-minutes", min=0.01, metavar="MINUTES", rich_help_panel=_SAVE,
            show_default="none; with --max-time: max-time / (4 x --average-last), from 0.5 to 10",
            help="Also save a checkpoint every this many minutes."),
        keep_last: int = typer.Option(None, "--keep-last", min=1, metavar="K", rich_help_panel=_SAVE,
                                      show_default="max(5, --average-last)",
                                      help="Keep the last K checkpoint_<step>.pt files."),
        average_last: int = typer.Option(None, "--average-last", min=1, metavar="N", rich_help_panel=_SAVE,
                                         show_default="5; big 20 (the paper)",
                                         help="At the end, write averaged.pt from the last N checkpoints."),
        average: bool = typer.Option(True, "--average/--no-average", rich_help_panel=_SAVE,
                                     help="Write averaged.pt at the end."),
        resume: bool = typer.Option(None, "--resume/--no-resume", rich_help_panel=_SAVE,
                                    show_default="resume when RUN_DIR holds checkpoint_last.pt",
                                    help="Resume from RUN_DIR/checkpoint_last.pt, or start afresh."),
        valid_every: int = typer.Option(None, "--valid-every", min=1, metavar="N", rich_help_panel=_VALID,
                                        show_default="at the checkpoints by updates (--save-every), at least "
                                                     "200 apart",
                                        help="Validate every N updates (and at the end)."),
        valid_every_minutes: float = typer.Option(
            None, "--valid-every-minutes", min=0.01, metavar="MINUTES", rich_help_panel=_VALID,
            show_default="none; a run that saves by time: at those checkpoints, at least 5 minutes apart",
            help="Also validate every this many minutes."),
        valid_bleu: bool = typer.Option(False, "--valid-bleu", rich_help_panel=_VALID,
                                        help="Also compute validation BLEU (beam search); best = highest BLEU."),
        lang_temperature: float = typer.Option(
            5.0, "--lang-temperature", min=0.01, metavar="T", rich_help_panel=_RECIPE,
            help="Multilingual data: each direction's share of the training pairs by its size to the power 1/T (1: "
                 "as the data is; higher: more even; 5 as M2M-100 and Arivazhagan et al. 2019). The smaller "
                 "directions are repeated, the larger never cut."),
        valid_beam: int = typer.Option(defaults.BEAM, "--valid-beam", min=1, metavar="N", rich_help_panel=_VALID,
                                       help="Beam size for --valid-bleu."),
        lr: float = typer.Option(None, "--lr", min=0.0, metavar="LR", rich_help_panel=_RECIPE,
                                 show_default="d_model^-0.5 * warmup^-0.5", help="Peak learning rate."),
        warmup: int = typer.Option(None, "--warmup", min=1, metavar="N", rich_help_panel=_RECIPE,
                                   show_default="tiny 400, base and big 4000", help="Warmup updates."),
        max_tokens: str = typer.Option(
            None, "--max-tokens", callback=int_or_auto, metavar="N|auto", rich_help_panel=_RECIPE,
            show_default="what holds the update's real tokens / processes, at most 8192 on CPU (tiny 2048)",
            help="Padded tokens per micro-batch per process; auto: the largest that fits the GPU, probed at the "
                 "start (on CPU: the default)."),
        update_freq: str = typer.Option("auto", "--update-freq", callback=int_or_auto, metavar="N|auto",
                                        rich_help_panel=_RECIPE,
                                        help="Micro-batches per process per update, or auto to reach "
                                             "--update-tokens. Processes x update-freq fixes the update: 1 GPU with "
                                             "--update-freq 8 trains on the batches of 8 GPUs with 1."),
        update_tokens: int = typer.Option(None, "--update-tokens", min=1, metavar="N", rich_help_panel=_RECIPE,
                                          show_default="25000; tiny 2048",
                                          help="Real (unpadded) target tokens per update, as the loss counts them."),
        clip_norm: float = typer.Option(0.0, "--clip-norm", min=0.0, metavar="NORM", rich_help_panel=_RECIPE,
                                        help="Clip the gradient norm (0: off)."),
        label_smoothing: float = typer.Option(0.1, "--label-smoothing", min=0.0, max=0.99, metavar="EPSILON",
                                              rich_help_panel=_RECIPE, help="Label smoothing."),
        d_model: int = typer.Option(None, "--d-model", min=1, metavar="N", rich_help_panel=_MODEL,
                                    help="Model width."),
        d_ff: int = typer.Option(None, "--d-ff", min=1, metavar="N", rich_help_panel=_MODEL,
                                 help="Feed-forward width."),
        heads: int = typer.Option(None, "--heads", min=1, metavar="N", rich_help_panel=_MODEL,
                                  help="Attention heads."),
        layers: int = typer.Option(None, "--layers", min=1, metavar="N", rich_help_panel=_MODEL,
                                   help="Encoder and decoder layers."),
        encoder_layers: int = typer.Option(None, "--encoder-layers", min=1, metavar="N", rich_help_panel=_MODEL,
                                           help="Encoder layers."),
        decoder_layers: int = typer.Option(None, "--decoder-layers", min=1, metavar="N", rich_help_panel=_MODEL,
                                           help="Decoder layers."),
        dropout: float = typer.Option(None, "--dropout", min=0.0, max=0.99, metavar="P", rich_help_panel=_MODEL,
                                      help="Dropout (P_drop)."),
        attention_dropout: float = typer.Option(None, "--attention-dropout", min=0.0, max=0.99, metavar="P",
                                                rich_help_panel=_MODEL, show_default="0",
                                                help="Dropout on attention weights."),
        gpus: int = typer.Option(None, "--gpus", min=0, metavar="N", rich_help_panel=_MACHINE,
                                 show_default="1 if CUDA is available, else 0: CPU",
                                 help="GPUs, one process each (NCCL)."),
        cpu_procs: int = typer.Option(1, "--cpu-procs", min=1, metavar="N", rich_help_panel=_MACHINE,
                                      help="Processes on CPU, over gloo (tests, CI)."),
        precision: TrainPrecision = typer.Option(
            TrainPrecision.auto, "--precision", rich_help_panel=_MACHINE,
            help="auto: bf16 where the hardware runs it natively (GPUs of compute capability 8.0 or later, CPUs "
                 "with AMX or AVX512-BF16), fp16 on older GPUs, else fp32."),
        compile: bool = typer.Option(False, "--compile", rich_help_panel=_MACHINE, help="Use torch.compile."),
        compile_shapes: CompileShapes = typer.Option(
            CompileShapes.buckets, "--compile-shapes", rich_help_panel=_MACHINE,
            help="With --compile: buckets pads every batch to one of a few shapes (each compiled once); dynamic "
                 "compiles once for any shape (no padding beyond the batch's longest sentence, but far slower than "
                 "eager: see docs/train.md)."),
        threads: int = typer.Option(None, "--threads", min=1, metavar="N", rich_help_panel=_MACHINE,
                                    show_default="the free cores / processes",
                                    help="Torch threads per process (default: the cores not busy with other "
                                         "work, shared by its processes; one process counts again every 15 s)."),
        dist_timeout: float = typer.Option(
            5.0, "--dist-timeout", min=0.01, metavar="MINUTES", rich_help_panel=_MACHINE,
            help="With several processes: when one stops answering (dead, stopped, hung node) for this long, the "
                 "others end the run with one line naming it (torchrun --max-restarts then restarts it)."),
        log_every: int = typer.Option(100, "--log-every", min=1, metavar="N", rich_help_panel=_MACHINE,
                                      help="Updates between log lines."),
    ) -> None:
        from nmt_cli.runtime import cpus
        from nmt_cli.training import recipe_file
        from nmt_cli.training.config import TrainConfig
        from nmt_cli.training.spawn import Ranks, early_world_size

        model = {"d_model": d_model, "d_ff": d_ff, "n_heads": heads, "dropout": dropout,
                 "attention_dropout": attention_dropout,
                 "encoder_layers": encoder_layers or layers, "decoder_layers": decoder_layers or layers}
        options = dict(
            data_dir=None if data_dir is None else str(data_dir), out_dir=None if output is None else str(output),
            preset=preset.value, init_from=init_from, model={k: v for k, v in model.items() if v is not None},
            lr=lr or None, warmup=warmup, label_smoothing=label_smoothing, clip_norm=clip_norm,
            max_tokens=max_tokens, update_freq=update_freq, update_tokens=update_tokens,
            max_steps=max_steps, max_epochs=max_epochs, max_time=max_time, patience=patience,
            save_every=save_every, save_every_minutes=save_every_minutes, keep_last=keep_last,
            average_last=average_last, average=average, resume=resume, valid_every=valid_every,
            valid_every_minutes=valid_every_minutes, valid_bleu=valid_bleu,
            valid_beam=valid_beam, lang_temperature=lang_temperature, precision=precision.value, gpus=gpus, cpu_procs=cpu_procs, threads=threads,
            compile=compile, compile_shapes=compile_shapes.value, seed=seed, log_every=log_every,
            dist_timeout=dist_timeout,
        )
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
        if world is not None:  # the other processes start first: their imports overlap this one's (spawn.py)
            if options["threads"] is None:
                cpus.start().others_busy()  # (the free cores, counted before they load them)
            ranks = Ranks(world)
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


_OPTION_FIELD = {"output": "out_dir"}  # command-line parameters named otherwise than their TrainConfig field
_MODEL_OPTIONS = ("d_model", "d_ff", "heads", "layers", "encoder_layers", "decoder_layers", "dropout",
                  "attention_dropout")  # go to TrainConfig.model, where they are given only when typed


def _typed_options(ctx: typer.Context) -> set[str]:
    """The TrainConfig fields the command line gave explicitly (not left at their defaults)."""
    typed = set()
    for name in ctx.params:
        source = ctx.get_parameter_source(name)
        if source is not None and source.name not in ("DEFAULT", "DEFAULT_MAP") and name not in _MODEL_OPTIONS:
            typed.add(_OPTION_FIELD.get(name, name))
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


TRAIN_LOG = "train.log"


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
