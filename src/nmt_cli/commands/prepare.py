"""`nmt prepare`: raw parallel text -> a binarized data directory that `nmt train` reads fast."""

from __future__ import annotations

from enum import Enum

import typer


class ErrorMode(str, Enum):
    strict = "strict"
    replace = "replace"

_HELP = (
    "Prepare a corpus for training: download or read it, clean it (counts reported), learn a joint "
    "sentencepiece BPE, encode on all cores and binarize it into OUT_DIR with a manifest.\n\n"
    "NAME is a known corpus (nmt prepare --list: wmt14-en-de, wmt14-en-fr, their reverses, sample) or 'custom' "
    "with your own files (--train/--valid/--test PREFIX read PREFIX.<src-lang> and PREFIX.<tgt-lang>). "
    "Re-running with the same options reuses finished steps; --force redoes them."
)
_EPILOG = (
    "Examples:\n\n"
    "  nmt prepare sample -o data/sample\n\n"
    "  nmt prepare wmt14-en-de -o data/ende\n\n"
    "  nmt prepare wmt14-en-de --from-dir ~/wmt14 -o data/ende     # pre-downloaded files\n\n"
    "  nmt prepare custom --src-lang en --tgt-lang de --train corpus/train --valid corpus/valid "
    "--test corpus/test --vocab-size 8000 -o data/mine\n\n"
    "  nmt prepare --list"
)


def register(app: typer.Typer) -> None:
    @app.command("prepare", help=_HELP, epilog=_EPILOG)
    def prepare(
        name: str = typer.Argument(None, metavar="NAME", help="Corpus name (see --list) or 'custom'."),
        out_dir: str = typer.Option(None, "-o", "--out", "--output", help="Output data directory."),
        list_corpora: bool = typer.Option(False, "--list", help="List the known corpora and exit."),
        src_lang: str = typer.Option(None, "--src-lang", help="Source language code (custom; or pick a direction)."),
        tgt_lang: str = typer.Option(None, "--tgt-lang", help="Target language code."),
        train: str = typer.Option(None, "--train", help="Training files prefix: PREFIX.<src> and PREFIX.<tgt>."),
        valid: str = typer.Option(None, "--valid", help="Validation files prefix."),
        test: str = typer.Option(None, "--test", help="Test files prefix."),
        from_dir: str = typer.Option(
            None, "--from-dir", help="Pre-downloaded files of a named corpus: {train,valid,test}.<lang> or the "
                                     "hub layout (de-en/*.parquet)."),
        reverse: bool = typer.Option(False, "--reverse", help="Swap the direction (wmt14-en-de -> de->en)."),
        vocab_size: int = typer.Option(
            None, "--vocab-size", min=16, help="Joint BPE vocabulary (default: 37000 en-de, 32000 en-fr, "
                                               "2000 sample, 8000 custom)."),
        max_len: int = typer.Option(250, "--max-len", min=1, help="Drop training pairs with a side longer than "
                                                                  "this many BPE tokens."),
        ratio: float = typer.Option(1.5, "--ratio", min=1.0, help="Drop training pairs whose longer side has more "
                                                                  "than RATIO times the BPE tokens of the shorter."),
        normalize_punct: bool = typer.Option(False, "--normalize-punct", help="Moses punctuation normalization."),
        bpe_sample: int = typer.Option(
            None, "--bpe-sample", min=2, help="Max sentences (both sides) to learn BPE from (default 2000000)."),
        workers: int = typer.Option(0, "--workers", min=0, help="Encoding threads (0: all cores)."),
        errors: ErrorMode = typer.Option(ErrorMode.strict, "--errors", help="Invalid UTF-8: strict (error with "
                                                                            "file and line) or replace (U+FFFD)."),
        force: bool = typer.Option(False, "--force", help="Redo every step even when a finished one matches."),
        seed: int = typer.Option(1, "--seed", help="Seed of the BPE training sample."),
    ) -> None:
        if list_corpora:
            _print_list()
            return
        if not name:
            raise typer.BadParameter("pass a corpus NAME (nmt prepare --list shows them)", param_hint="'NAME'")
        if not out_dir:
            raise typer.BadParameter("pass the output directory: -o OUT_DIR", param_hint="'-o'")
        from nmt_cli.data.prepare import PrepareOptions
        from nmt_cli.data.prepare import prepare as run

        opts = PrepareOptions(
            corpus=name, out_dir=out_dir, src_lang=src_lang, tgt_lang=tgt_lang, train=train, valid=valid,
            test=test, from_dir=from_dir, reverse=reverse, vocab_size=vocab_size, max_len=max_len, ratio=ratio,
            normalize_punct=normalize_punct, bpe_sample=bpe_sample, workers=workers, errors=errors.value, force=force,
            seed=seed,
        )
        with _RichProgress() as progress:
            result = run(opts, progress=progress)
        _print_summary(result)


def _print_list() -> None:
    from rich.console import Console
    from rich.table import Table

    from nmt_cli.data.corpora import corpus_table

    table = Table(title="corpora for nmt prepare NAME")
    rows = corpus_table()
    for col in ("name", "direction", "pairs", "valid/test", "vocab", "source"):
        table.add_column(col)
    for row in rows:
        table.add_row(*(str(row[c]) for c in ("name", "direction", "pairs", "valid/test", "vocab", "source")))
    Console(soft_wrap=True).print(table)


class _RichProgress:
    """A callable (stage, done, total) that renders rich progress bars on stderr, one task per stage."""

    def __enter__(self):
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            SpinnerColumn,
            TextColumn,
            TimeElapsedColumn,
        )

        self._progress = Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(),
                                  MofNCompleteColumn(), TimeElapsedColumn(),
                                  console=Console(stderr=True), transient=False)
        self._tasks: dict[str, int] = {}
        self._progress.__enter__()
        return self

    def __call__(self, stage: str, done: int, total: int | None) -> None:
        if stage not in self._tasks:
            for other in self._tasks.values():  # a new stage finishes the previous ones
                task = self._progress.tasks[other]
                if task.total is None:
                    self._progress.update(other, total=max(task.completed, 1), completed=max(task.completed, 1))
            self._tasks[stage] = self._progress.add_task(stage, total=total)
        self._progress.update(self._tasks[stage], completed=done, total=total)

    def __exit__(self, *exc):
        if exc[0] is not None:  # on an error, leave only the error line on the terminal
            self._progress.live.transient = True
        for task in self._progress.tasks:
            if task.total is None and not exc[0]:
                self._progress.update(task.id, total=max(task.completed, 1), completed=max(task.completed, 1))
        return self._progress.__exit__(*exc)


def _print_summary(result) -> None:
    from rich.console import Console
    from rich.table import Table

    m = result.manifest
    console = Console(stderr=True)
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
