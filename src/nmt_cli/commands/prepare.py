"""`nmt prepare`: raw parallel text -> a binarized data directory that `nmt train` reads fast."""

from __future__ import annotations

import io
import threading
from enum import Enum

import typer

from nmt_cli.commands.helpformat import usage
from nmt_cli.commands.messages import usage_error


class ErrorMode(str, Enum):
    strict = "strict"
    replace = "replace"

_SUMMARY = "Download or read a corpus, clean it, learn BPE, binarize it"
_HELP = (
    "Prepare a corpus for training: download or read it, clean it (counts reported), learn a joint "
    "sentencepiece BPE, encode it on all cores and binarize it into OUT_DIR with a manifest.\n\n"
    "NAME is a known corpus (nmt prepare --list: wmt14-en-de, wmt14-en-fr, wmt16-en-ro, wmt17-en-de, "
    "iwslt17-de-en, their reverses, sample) or 'custom' with your own files: --train, --valid and --test PREFIX "
    "read PREFIX.<src-lang> and PREFIX.<tgt-lang>. Several directions make the data of one multilingual model: "
    "named corpora joined by commas (wmt14-en-de,wmt14-en-fr) or custom --pairs en-de,en-fr; one BPE model over "
    "all languages, learned on a sample balanced across them (temperature 5). Hub corpora are pinned to a revision and cached where "
    "huggingface_hub caches (HF_HUB_CACHE, HF_HOME); a cached file is checked before use. Running again with the "
    "same options reuses the finished steps; --force redoes them."
)
_EPILOG = """\
Examples:
  nmt prepare sample -o data/sample
  nmt prepare wmt14-en-de -o data/ende
  nmt prepare wmt16-ro-en -o data/roen                    # reverse direction
  HF_HUB_OFFLINE=1 nmt prepare wmt14-en-de -o data/ende   # from the cache
  nmt prepare wmt14-en-de --from-dir ~/wmt14 -o data/ende # downloaded files
  nmt prepare custom --src-lang en --tgt-lang de --train corpus/train \\
      --valid corpus/valid --test corpus/test --vocab-size 8000 -o data/mine
  nmt prepare custom --src-lang en --tgt-lang de --train med/train \\
      --valid med/valid -o data/med \\
      --tokenizer-from hf:Helsinki-NLP/opus-mt-en-de  # to fine-tune it
  nmt prepare custom --pairs en-de,en-fr,en-cs --train multi30k/train \\
      --valid multi30k/valid -o data/multi    # one model, three targets
  nmt prepare wmt14-en-de,wmt14-en-fr -o data/en-defr
  nmt prepare --list
"""
_DATA, _CLEAN = "Input", "Cleaning and BPE"


def register(app: typer.Typer) -> None:
    @app.command("prepare", short_help=_SUMMARY, help=_HELP, epilog=_EPILOG,
                 cls=usage("NAME -o OUT_DIR [OPTIONS]",
                           "custom --src-lang LANG --tgt-lang LANG --train PREFIX -o OUT_DIR [OPTIONS]",
                           "custom --pairs PAIRS --train PREFIX -o OUT_DIR [OPTIONS]", "--list"))
    def prepare(
        name: str = typer.Argument(None, metavar="NAME", help="Corpus name (see --list) or custom."),
        out_dir: str = typer.Option(None, "-o", "--out", "--output", metavar="OUT_DIR",
                                    help="Output data directory."),
        list_corpora: bool = typer.Option(False, "--list", help="List the known corpora and exit."),
        force: bool = typer.Option(False, "--force", help="Redo every step, even a finished one that matches."),
        src_lang: str = typer.Option(None, "--src-lang", metavar="LANG", rich_help_panel=_DATA,
                                     help="Source language code (custom; or pick a direction of a named corpus)."),
        tgt_lang: str = typer.Option(None, "--tgt-lang", metavar="LANG", rich_help_panel=_DATA,
                                     help="Target language code."),
        pairs: str = typer.Option(None, "--pairs", metavar="PAIRS", rich_help_panel=_DATA,
                                  help="custom: several directions SRC-TGT,SRC-TGT into one data directory, for one multilingual "
                                       "model (e.g. en-de,en-fr: PREFIX.en, PREFIX.de, PREFIX.fr); with several "
                                       "targets each source starts with its target's >>xx<< tag."),
        train: str = typer.Option(None, "--train", metavar="PREFIX", rich_help_panel=_DATA,
                                  help="Training files: PREFIX.<src-lang> and PREFIX.<tgt-lang>."),
        valid: str = typer.Option(None, "--valid", metavar="PREFIX", rich_help_panel=_DATA,
                                  help="Validation files."),
        test: str = typer.Option(None, "--test", metavar="PREFIX", rich_help_panel=_DATA, help="Test files."),
        from_dir: str = typer.Option(
            None, "--from-dir", metavar="DIR", rich_help_panel=_DATA,
            help="Downloaded files of a named corpus: {train,valid,test}.<lang>, or the hub layout "
                 "(de-en/*.parquet), as `hf download wmt/wmt14 --repo-type dataset --include 'de-en/*' "
                 "--local-dir DIR` writes it (--list names each corpus's repository)."),
        reverse: bool = typer.Option(False, "--reverse", rich_help_panel=_DATA,
                                     help="Swap the direction (wmt14-en-de becomes de-en)."),
        errors: ErrorMode = typer.Option(ErrorMode.strict, "--errors", rich_help_panel=_DATA,
                                         help="Invalid UTF-8: strict (an error naming the file and line) or "
                                              "replace (by U+FFFD)."),
        vocab_size: int = typer.Option(None, "--vocab-size", min=16, metavar="N", rich_help_panel=_CLEAN,
                                       show_default="per corpus, see --list; custom 8000",
                                       help="Joint BPE vocabulary size."),
        tokenizer_from: str = typer.Option(
            None, "--tokenizer-from", metavar="MODEL", rich_help_panel=_CLEAN,
            help="Encode with this model's own tokenizer and vocabulary instead of learning BPE (a checkpoint, a "
                 "MarianMT/OPUS-MT folder or hf:ORG/NAME): the data to fine-tune it with nmt train --init-from."),
        max_len: int = typer.Option(250, "--max-len", min=1, metavar="N", rich_help_panel=_CLEAN,
                                    help="Drop training pairs with a side longer than N BPE tokens."),
        ratio: float = typer.Option(1.5, "--ratio", min=1.0, metavar="RATIO", rich_help_panel=_CLEAN,
                                    help="Drop training pairs whose longer side has more than RATIO times the BPE "
                                         "tokens of the shorter."),
        normalize_punct: bool = typer.Option(False, "--normalize-punct", rich_help_panel=_CLEAN,
                                             help="Moses punctuation normalization."),
        bpe_sample: int = typer.Option(None, "--bpe-sample", min=2, metavar="N", rich_help_panel=_CLEAN,
                                       show_default="2000000",
                                       help="Learn BPE from at most N sentences (both sides)."),
        seed: int = typer.Option(1, "--seed", metavar="N", rich_help_panel=_CLEAN,
                                 help="Seed of the BPE training sample."),
        workers: int = typer.Option(0, "--workers", min=0, metavar="N", help="Encoding threads (0: the cores not busy with other work)."),
    ) -> None:
        if list_corpora:
            _print_list()
            return
        if not name:
            raise usage_error("missing argument NAME: a corpus name (nmt prepare --list shows them) or custom")
        if not out_dir:
            raise usage_error("missing option -o OUT_DIR: the data directory to write")
        from nmt_cli.data.prepare import PrepareOptions
        from nmt_cli.data.prepare import prepare as run

        opts = PrepareOptions(
            corpus=name, out_dir=out_dir, src_lang=src_lang, tgt_lang=tgt_lang, pairs=pairs, train=train, valid=valid,
            test=test, from_dir=from_dir, reverse=reverse, vocab_size=vocab_size, tokenizer_from=tokenizer_from,
            max_len=max_len, ratio=ratio,
            normalize_punct=normalize_punct, bpe_sample=bpe_sample, workers=workers, errors=errors.value, force=force,
            seed=seed,
        )
        with _RichProgress() as progress:
            result = run(opts, progress=progress, warn=progress.warn)
        _print_summary(result)


def _print_list() -> None:
    """One block per corpus (readable at any terminal width): name, reverse, sizes, test set, results, source."""
    from rich.console import Console
    from rich.markup import escape

    from nmt_cli.data.corpora import corpus_table

    console = Console(highlight=False, soft_wrap=True)
    console.print("corpora for [bold]nmt prepare NAME[/] (pairs: training pairs before cleaning)\n")
    for row in corpus_table():
        if row["source"].startswith("= "):  # a reverse: listed with its corpus
            continue
        reverse = next((r["name"] for r in corpus_table() if r["source"] == f"= {row['name']} --reverse"), None)
        console.print(f"[bold]{row['name']}[/]  {escape(row['direction'])}"
                      + (f"  (reverse: [bold]{reverse}[/])" if reverse else ""))
        console.print(f"  {row['description']}")
        for label in ("pairs", "valid / test", "vocab", "published results", "source"):
            console.print(f"  {label + ':':<19}{escape(str(row[label]))}")
        console.print()


class _RichProgress:
    """A callable (stage, done, total) that renders rich progress bars on stderr, one task per stage. The bars
    start with the first stage, so an error before any progress is the first line on stderr; on an error the
    bars are removed and only the error line stays."""

    def __enter__(self):
        from rich.console import Console

        self._console = Console(stderr=True, highlight=False, soft_wrap=True)
        self._progress = None
        self._tasks: dict[str, int] = {}
        self._lock = threading.Lock()  # downloads report from a polling thread
        return self

    def _start(self):
        from rich.progress import (
            BarColumn,
            DownloadColumn,
            MofNCompleteColumn,
            Progress,
            SpinnerColumn,
            TextColumn,
            TimeElapsedColumn,
        )

        class _Count(MofNCompleteColumn):  # bytes for downloads and checks, counts otherwise
            def render(self, task):
                if task.fields.get("bytes"):
                    return DownloadColumn().render(task)
                return super().render(task)

        self._progress = Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), _Count(),
                                  TimeElapsedColumn(), console=self._console, transient=False)
        self._progress.__enter__()

    def __call__(self, stage: str, done: int, total: int | None) -> None:
        with self._lock:
            if self._progress is None:
                self._start()
            if stage not in self._tasks:
                for other in self._tasks.values():  # a new stage finishes the previous ones
                    task = self._progress.tasks[other]
                    if task.total is None:
                        self._progress.update(other, total=max(task.completed, 1), completed=max(task.completed, 1))
                is_bytes = stage.startswith(("download", "verify"))
                self._tasks[stage] = self._progress.add_task(stage, total=total, bytes=is_bytes)
            self._progress.update(self._tasks[stage], completed=done, total=total)

    def warn(self, message: str) -> None:
        from rich.markup import escape

        self._console.print(f"[yellow]warning:[/] {escape(message)}")

    def __exit__(self, *exc):
        if self._progress is None:
            return False
        if exc[0] is not None:  # on an error, leave only the error line: erase the bars on a terminal, and
            self._progress.live.transient = True  # print no final render (a blank line) elsewhere
            if not self._console.is_terminal:
                self._console.file = io.StringIO()
        for task in self._progress.tasks:
            if task.total is None and not exc[0]:
                self._progress.update(task.id, total=max(task.completed, 1), completed=max(task.completed, 1))
        return self._progress.__exit__(*exc)


def _print_summary(result) -> None:
    from rich.console import Console
    from rich.table import Table

    m = result.manifest
    console = Console(stderr=True)
    if "directions" in m:
        _print_directions(console, result)
        return
    table = Table(title=f"{m['corpus']} ({m['src_lang']} -> {m['tgt_lang']}), vocabulary {m['vocab_size']}")
    for col in ("split", "read", "kept", "empty", "too long", "ratio", "src tokens", "tgt tokens"):
        table.add_column(col, justify="right" if col != "split" else "left")
    for split, s in m["splits"].items():
        d = s["dropped"]
        table.add_row(split, f"{s['read']:,}", f"{s['kept']:,}", f"{d['empty']:,}", f"{d['too_long']:,}",
                      f"{d['ratio']:,}", f"{s['src_tokens']:,}", f"{s['tgt_tokens']:,}")
    console.print(table)
    reused = f"; reused: {', '.join(result.reused)}" if result.reused else ""
    console.print(f"wrote {result.out_dir} in {result.timings['total']:.1f}s{reused}")


def _print_directions(console, result) -> None:
    """A multilingual data directory: one line per direction and split."""
    from rich.table import Table

    m = result.manifest
    tags = ", ".join((m.get("tags") or {}).get("tags", {}).values()) or "none (one target language)"
    table = Table(title=f"{len(m['directions'])} directions, vocabulary {m['vocab_size']}, tags {tags}")
    for col in ("direction", "split", "read", "kept", "empty", "too long", "ratio", "src tokens", "tgt tokens"):
        table.add_column(col, justify="left" if col in ("direction", "split") else "right")
    for d in m["directions"]:
        for split, s in d["splits"].items():
            dr = s["dropped"]
            table.add_row(f"{d['src']}-{d['tgt']}", split, f"{s['read']:,}", f"{s['kept']:,}", f"{dr['empty']:,}",
                          f"{dr['too_long']:,}", f"{dr['ratio']:,}", f"{s['src_tokens']:,}", f"{s['tgt_tokens']:,}")
    console.print(table)
    reused = f"; reused: {', '.join(result.reused)}" if result.reused else ""
    console.print(f"wrote {result.out_dir} in {result.timings['total']:.1f}s{reused}")
