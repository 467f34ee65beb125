"""`nmt translate`: raw text in (one sentence a line), raw translations out, in input order, streaming."""

from __future__ import annotations

import os
import sys
from contextlib import ExitStack
from enum import Enum
from pathlib import Path

import typer

from nmt_cli.commands.helpformat import Command
from nmt_cli.commands.options import int_or_auto
from nmt_cli.lines import open_input
from nmt_cli.runtime import defaults
from nmt_cli.runtime.precision import TranslatePrecision

_SUMMARY = "Translate text, one sentence a line, with a checkpoint"
_HELP = (
    "Translate raw text, one sentence a line, with a checkpoint (its tokenizer encodes and detokenizes), from "
    "INPUT or stdin to stdout or -o FILE.\n\n"
    f"Batched beam search (beam {defaults.BEAM}, GNMT length penalty alpha {defaults.LENPEN}, max length = source + "
    f"{defaults.MAX_LEN_B} by default); input is "
    "read and written chunk by chunk, so output appears early and memory stays bounded. Several -m ensemble "
    "(average of log-probabilities); a run directory with --average-last N averages its last N checkpoints."
)
_EPILOG = """\
Examples:
  nmt translate -m runs/base/checkpoint_best.pt < input.en > out.de
  nmt translate input.en -o out.de -m a.pt -m b.pt --beam 5 --lenpen 1.0 \\
      --lenpen-form fairseq
  nmt translate -m runs/base --average-last 5 --nbest 4 < input.en > nbest.tsv
  nmt translate -m model.pt --precision bf16 --threads 2 < input.en
  nmt translate -m de-en.pt --sampling --topk 10 --seed 1 < mono.de \\
      > synthetic.en                                # back-translation
  nmt translate -m model.pt --prefix starts.de --print-alignment words \\
      < input.en
  nmt translate -m hf:my-org/nmt-en-de@v1.0 < input.en
"""
_SEARCH, _SAMPLING, _OUTPUT, _MACHINE = "Search", "Sampling", "Output", "Machine"


class Device(str, Enum):
    auto = "auto"
    cpu = "cpu"
    cuda = "cuda"


class LengthPenalty(str, Enum):
    gnmt = "gnmt"
    fairseq = "fairseq"


class Stop(str, Enum):
    beam = "beam"
    top = "top"


class Alignment(str, Enum):
    words = "words"
    pieces = "pieces"


# The options `nmt translate` and `nmt serve` share (one definition: each call makes a fresh typer.Option).
OPTIONS = {
    "beam": lambda: typer.Option(defaults.BEAM, "-b", "--beam", min=1, metavar="N", rich_help_panel=_SEARCH,
        help="Beam size; 1 is greedy search."),
    "lenpen": lambda: typer.Option(defaults.LENPEN, "--lenpen", "--alpha", min=0.0, metavar="ALPHA", rich_help_panel=_SEARCH,
        help="Length penalty exponent."),
    "lenpen_form": lambda: typer.Option(
        LengthPenalty(defaults.LENPEN_FORM), "--lenpen-form", rich_help_panel=_SEARCH,
        help="gnmt: ((5+len)/6)^alpha, the paper's; fairseq: len^alpha, as fairseq, CTranslate2 and Hugging Face."
        ),
    "stop": lambda: typer.Option(
        Stop(defaults.STOP), "--stop", rich_help_panel=_SEARCH,
        help="When a sentence's search ends: beam: once BEAM hypotheses have ended (fairseq, CTranslate2), and with "
        "--lenpen 0 and --nbest 1 once the best-ranked candidate has (the same output, sooner); top: once the "
        "best-ranked candidate has ended (OpenNMT-py; fewer steps).",
        ),
    "max_len_a": lambda: typer.Option(defaults.MAX_LEN_A, "--max-len-a", min=0.0, metavar="A", rich_help_panel=_SEARCH,
        help="Max output tokens = A * source tokens + B."),
    "max_len_b": lambda: typer.Option(defaults.MAX_LEN_B, "--max-len-b", min=0, metavar="B", rich_help_panel=_SEARCH,
        help="Max output tokens = A * source tokens + B."),
    "min_len": lambda: typer.Option(0, "--min-len", min=0, metavar="N", rich_help_panel=_SEARCH,
        help="No end of sentence before N generated tokens."),
    "no_repeat_ngram": lambda: typer.Option(
        0, "--no-repeat-ngram", min=0, metavar="N", rich_help_panel=_SEARCH,
        help="No n-gram of size N twice in an output (0: off)."
        ),
    "sampling": lambda: typer.Option(
        False, "--sampling", rich_help_panel=_SAMPLING,
        help="Sample instead of searching (back-translation); --nbest N draws N samples."
        ),
    "topk": lambda: typer.Option(0, "--topk", min=0, metavar="K", rich_help_panel=_SAMPLING,
        help="Sample from the K most probable tokens (0: all)."),
    "topp": lambda: typer.Option(
        1.0, "--topp", min=0.0, max=1.0, metavar="P", rich_help_panel=_SAMPLING,
        help="Sample from the most probable tokens holding probability P (1: all)."
        ),
    "temperature": lambda: typer.Option(1.0, "--temperature", min=0.0, metavar="T", rich_help_panel=_SAMPLING,
        help="Divide the logits by T."),
    "seed": lambda: typer.Option(None, "--seed", metavar="N", rich_help_panel=_SAMPLING,
        help="Random seed (same seed, input and batching: same output)."),
    "max_tokens": lambda: typer.Option(
        None, "--max-tokens", callback=int_or_auto, metavar="N|auto", rich_help_panel=_MACHINE,
        show_default=defaults.max_tokens_help(),
        help="Padded source tokens per batch; auto: the largest that fits the GPU, probed once at the start (on "
        "CPU: the default)."
        ),
    "device": lambda: typer.Option(Device.auto, "--device", rich_help_panel=_MACHINE,
        help="auto picks cuda when available."),
    "precision": lambda: typer.Option(
        TranslatePrecision.fp32, "--precision", rich_help_panel=_MACHINE,
        help="Model precision; bf16 is fast on CPUs with AMX or AVX512-BF16 and on GPUs of compute capability "
        "8.0 or later; fp16 is for GPUs only; int8 (CPU only: int8 linear layers, as CTranslate2's int8) "
        "is the fastest on CPUs without them."
        ),
    "threads": lambda: typer.Option(None, "--threads", min=1, metavar="N", rich_help_panel=_MACHINE,
        show_default="the cores not busy with other work",
        help="CPU threads."),
    "shortlist": lambda: typer.Option(
        True, "--shortlist/--no-shortlist", rich_help_panel=_SEARCH, show_default="on, on a CPU",
        help="On a CPU, score only the target pieces the model's vocabulary shortlist lists for a batch's source "
        "pieces (learned from its training data; nmt shortlist adds one); --no-shortlist scores the whole vocabulary."
        ),
    "shortlist_size": lambda: typer.Option(
        None, "--shortlist-size", min=1, metavar="N", rich_help_panel=_SEARCH, show_default=str(defaults.SHORTLIST_SIZE),
        help="Target pieces taken per source piece from the shortlist (at most what it stores)."
        ),
}


def register(app: typer.Typer) -> None:
    @app.command("translate", cls=Command, short_help=_SUMMARY, help=_HELP, epilog=_EPILOG)
    def translate(
        input_file: Path = typer.Argument(None, metavar="INPUT", help="Input text file (none, or '-': stdin)."),
        models: list[str] = typer.Option(
            ..., "-m", "--model", metavar="CKPT",
            help="Checkpoint file, or hf:ORG/NAME[@REVISION] (a hub model repository's checkpoint.pt, through the "
                 "hub cache), or a run directory with --average-last; repeat to ensemble.",
        ),
        input_opt: Path = typer.Option(None, "-i", "--input", metavar="FILE", help="Input text file (as INPUT)."),
        output: Path = typer.Option(None, "-o", "--output", metavar="FILE", help="Output file (default: stdout)."),
        tgt_lang: str = typer.Option(
            None, "--tgt-lang", metavar="LANG",
            help="A multilingual model's target language: its >>LANG<< tag starts each line that has none (a line "
                 "that starts with a tag keeps it)."),
        split_sentences: bool = typer.Option(
            False, "--split-sentences",
            help="Each line is a paragraph: its sentences are translated one by one and joined back with the line's "
                 "spacing (one line in, one line out). Needs sentencex: pip install 'nmt-cli[sentences]'."),
        average_last: int = typer.Option(
            None, "--average-last", min=1, metavar="N", help="Average the last N checkpoints of each -m run directory."
        ),
        beam: int = OPTIONS["beam"](),
        lenpen: float = OPTIONS["lenpen"](),
        lenpen_form: LengthPenalty = OPTIONS["lenpen_form"](),
        stop: Stop = OPTIONS["stop"](),
        max_len_a: float = OPTIONS["max_len_a"](),
        max_len_b: int = OPTIONS["max_len_b"](),
        min_len: int = OPTIONS["min_len"](),
        no_repeat_ngram: int = OPTIONS["no_repeat_ngram"](),
        prefix: Path = typer.Option(
            None, "--prefix", metavar="FILE", rich_help_panel=_SEARCH,
            help="One target prefix per input line (empty: none); each output starts with it verbatim.",
        ),
        sampling: bool = OPTIONS["sampling"](),
        topk: int = OPTIONS["topk"](),
        topp: float = OPTIONS["topp"](),
        temperature: float = OPTIONS["temperature"](),
        seed: int = OPTIONS["seed"](),
        nbest: int = typer.Option(
            1, "--nbest", min=1, metavar="N", rich_help_panel=_OUTPUT,
            help="Output the N best as TSV: line number, rank, score, text (N <= beam)."
        ),
        scores: bool = typer.Option(False, "--scores", rich_help_panel=_OUTPUT,
                                    help="Prefix each line with the best score and a TAB."),
        token_scores: bool = typer.Option(
            False, "--token-scores", rich_help_panel=_OUTPUT,
            help="Add a column: the log-probability of each output piece and of the end of sentence."
        ),
        print_alignment: Alignment = typer.Option(
            None, "--print-alignment", rich_help_panel=_OUTPUT,
            help="Add a column of source-target links (Pharaoh i-j) between words or sentencepiece pieces.",
        ),
        alignment_layer: int = typer.Option(
            -1, "--alignment-layer", metavar="N", rich_help_panel=_OUTPUT,
            help="Decoder layer whose attention gives the links (-1: the last)."
        ),
        replace_unk: bool = typer.Option(
            False, "--replace-unk", rich_help_panel=_OUTPUT,
            help="Replace unknown output tokens by the aligned source word."
        ),
        buffer_size: int = typer.Option(2000, "--buffer-size", min=1, metavar="N", rich_help_panel=_MACHINE,
                                        help="Input lines read (and output flushed) per chunk."),
        max_tokens: str = OPTIONS["max_tokens"](),
        device: Device = OPTIONS["device"](),
        precision: TranslatePrecision = OPTIONS["precision"](),
        threads: int = OPTIONS["threads"](),
        workers: int = typer.Option(
            None, "--workers", min=1, metavar="N", rich_help_panel=_MACHINE,
            show_default="2 on a CPU with 2 threads or more for a model under 10M parameters, else 1",
            help="CPU decoding streams, each on threads/N threads (as CTranslate2's inter_threads); sampling uses 1. "
                 "2 are faster beside other busy processes, and for small models, at more memory.",
        ),
        cuda_graphs: bool = typer.Option(
            None, "--cuda-graphs/--no-cuda-graphs", rich_help_panel=_MACHINE, show_default="on a GPU",
            help="On a GPU, replay each decoding step as a CUDA graph (one launch instead of hundreds). "
                 "--no-cuda-graphs launches them one by one.",
        ),
        shortlist: bool = OPTIONS["shortlist"](),
        shortlist_size: int = OPTIONS["shortlist_size"](),
    ) -> None:
        from nmt_cli.atomic import atomic_write
        from nmt_cli.commands.messages import note_line, usage_error, warning_line
        from nmt_cli.inference import translate as core
        from nmt_cli.runtime import cpus

        if input_file is not None and input_opt is not None:
            raise usage_error("give the input either as INPUT or with -i, not both")
        if nbest > beam and not sampling:
            raise usage_error(f"--nbest {nbest} exceeds --beam {beam}; raise --beam (with --sampling, --nbest is the "
                              "number of samples)")
        if split_sentences and (token_scores or print_alignment is not None or replace_unk or prefix is not None):
            raise usage_error("--split-sentences translates a line's sentences one by one; --token-scores, "
                              "--print-alignment, --replace-unk and --prefix need the whole line as one translation")
        if split_sentences:
            from nmt_cli.segments import require

            require()  # before the input is read and the model loads
        source = input_file or input_opt
        with ExitStack() as stack:  # inputs are checked before the model loads, the output opened after
            from_stdin = source is None or str(source) == "-"
            src = sys.stdin.buffer if from_stdin else stack.enter_context(open_input(source))
            prefixes = stack.enter_context(open_input(prefix, "prefix file")) if prefix is not None else None
            core.set_threads(threads)
            sampler = cpus.start() if threads is None else None  # the free cores, sampled while the model loads
            translator = core.Translator.load(
                models, average_last=average_last, device=device.value, precision=precision.value,
                warn=core.Warner(warning_line), note=note_line, beam=beam, lenpen=lenpen, lenpen_form=lenpen_form.value,
                max_len_a=max_len_a, max_len_b=max_len_b, stop=stop.value, buffer_size=buffer_size,
                max_tokens=max_tokens, nbest=nbest, scores=scores, min_len=min_len, no_repeat_ngram=no_repeat_ngram,
                sampling=sampling, topk=topk, topp=topp, temperature=temperature, seed=seed, token_scores=token_scores,
                alignment=print_alignment.value if print_alignment is not None else None,
                alignment_layer=alignment_layer, replace_unk=replace_unk, workers=workers, cuda_graphs=cuda_graphs,
                tgt_lang=tgt_lang, split_sentences=split_sentences, shortlist=shortlist, shortlist_size=shortlist_size,
            )
            if translator.max_tokens_reason is not None:
                note_line(f"--max-tokens auto: {translator.max_tokens_reason}")
            if cuda_graphs is True and translator.graphs is None:
                note_line("--cuda-graphs has no effect here: it replays a GPU's decoding steps, for one model (not "
                          "on a CPU, not for an ensemble)")
            if output is not None:
                _check_output(output)
            if sampler is not None and translator.device.type == "cpu":
                choice = sampler.threads()
                core.set_threads(choice.threads)
                if choice.threads < cpus.core_count():
                    note_line(f"threads: {choice.reason} (--threads N to choose)")
            if output is not None:  # whole or not at all: a failure or a kill leaves the previous file
                atomic_write(output, lambda f: core.translate_stream(translator, src, f, prefixes=prefixes),
                             _output_error)
                return
            try:
                core.translate_stream(translator, src, sys.stdout.buffer, prefixes=prefixes)
            except BrokenPipeError:  # the reader went away (`| head`): stop quietly, as other Unix tools do
                os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
                raise typer.Exit(0) from None


def _check_output(path: Path) -> None:
    from nmt_cli.errors import DataError

    if path.is_dir():
        raise DataError(f"cannot write {path}: it is a directory; give a file name")
    if not path.parent.is_dir():
        raise DataError(f"cannot write {path}: no such directory; check the directory exists and is writable")


def _output_error(path: Path, exc: OSError):
    from nmt_cli.errors import DataError

    kept = f"{path.name} keeps its previous content" if path.exists() else f"{path.name} was not written"
    return DataError(f"cannot write {path}: {exc.strerror or exc}; {kept}. Free disk space or make {path.parent} "
                     "writable, then run the same command again")
