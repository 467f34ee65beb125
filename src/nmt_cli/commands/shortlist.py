"""`nmt shortlist`: give a checkpoint (an imported MarianMT model too) a vocabulary shortlist learned from a parallel
corpus, or take its shortlist away."""

from __future__ import annotations

from pathlib import Path

import typer

from nmt_cli.commands.helpformat import usage

_SUMMARY = "Learn a checkpoint's vocabulary shortlist from a parallel corpus"
_HELP = (
    "Learn the target pieces likely in the translation of each source piece from a parallel corpus, and write the "
    "checkpoint again with them. On a CPU, nmt translate and nmt serve then score only the pieces a batch's source "
    "lists (and the most frequent ones) instead of the whole vocabulary (--no-shortlist turns it off). Checkpoints "
    "of nmt train have one already (learned by nmt prepare); this is for imported models, older checkpoints, or "
    "another corpus.\n\n"
    "PREFIX.SRC and PREFIX.TGT are plain text files, one sentence per line, as nmt prepare custom reads them (SRC and "
    "TGT: the model's languages, or --src/--tgt)."
)
_EPILOG = """\
Examples:
  nmt shortlist opus-mt-en-de.pt --train data/train -o opus-mt-en-de.sl.pt
  nmt shortlist model.pt --train corpus/ep --src en --tgt de -o model.sl.pt
  nmt shortlist model.pt --remove -o model.full.pt
"""


def register(app: typer.Typer) -> None:
    @app.command("shortlist", short_help=_SUMMARY, help=_HELP, epilog=_EPILOG,
                 cls=usage("CKPT --train PREFIX -o FILE", "CKPT --remove -o FILE"))
    def shortlist(
        checkpoint: str = typer.Argument(..., metavar="CKPT",
                                         help="A checkpoint file, a MarianMT folder or hf:ORG/NAME[@REVISION]."),
        output: Path = typer.Option(..., "-o", "--output", metavar="FILE", help="The checkpoint to write."),
        train: Path = typer.Option(None, "--train", metavar="PREFIX", help="The parallel corpus: PREFIX.SRC, PREFIX.TGT."),
        src: str = typer.Option(None, "--src", metavar="LANG", help="Source file suffix (default: the model's source language)."),
        tgt: str = typer.Option(None, "--tgt", metavar="LANG", help="Target file suffix (default: the model's target language)."),
        statistic: str = typer.Option("dice", "--statistic", metavar="NAME",
                                      help="How target pieces are ranked per source piece: dice or cond."),
        max_pairs: int = typer.Option(200_000, "--max-pairs", min=1, metavar="N",
                                      help="Sentence pairs counted at most (spread evenly over the corpus)."),
        remove: bool = typer.Option(False, "--remove", help="Write the checkpoint without a shortlist."),
    ) -> None:
        from nmt_cli.checkpoints.format import save
        from nmt_cli.commands.messages import note_line, usage_error
        from nmt_cli.data import shortlist as learned
        from nmt_cli.inference.translate import load_checkpoints

        if remove == (train is not None):
            raise usage_error("give either --train PREFIX (learn a shortlist) or --remove (drop it)")
        if statistic not in learned.STATISTICS:
            raise usage_error(f"--statistic {statistic}: choose one of {', '.join(learned.STATISTICS)}")
        if Path(checkpoint).exists() and output.resolve() == Path(checkpoint).resolve():
            raise usage_error(f"-o {output} is the input checkpoint; write to another file")
        ckpt = load_checkpoints([checkpoint], note=note_line)[0]
        if remove:
            ckpt.shortlist = None
            save(ckpt, output)
            typer.echo(f"{output}: without a shortlist", err=True)
            return
        src = src or ckpt.langs.get("src")
        tgt = tgt or ckpt.langs.get("tgt")
        if not src or not tgt:
            raise usage_error("the checkpoint does not record its languages; give --src LANG and --tgt LANG")
        pairs = read_pairs(train, src, tgt, ckpt.tokenizer_obj(), max_pairs)
        found = learned.learn(pairs, ckpt.model_config.vocab_size, statistic, max_pairs=max_pairs)
        ckpt.shortlist = found.to_dict()
        save(ckpt, output)
        typer.echo(f"{output}: a shortlist of {found.stored} target pieces per source piece and "
                   f"{found.frequent.numel()} frequent ones, learned ({statistic}) from {found.pairs} sentence pairs "
                   f"of {train}.{src}/.{tgt}", err=True)


def read_pairs(prefix: Path, src: str, tgt: str, tokenizer, max_pairs: int) -> list:
    """Up to `max_pairs` pairs of PREFIX.SRC / PREFIX.TGT, spread evenly, as (source ids, target ids) arrays."""
    import numpy as np

    from nmt_cli.data.readers import TextPairSource
    from nmt_cli.data.shortlist import evenly

    source = TextPairSource("train", f"{prefix}.{src}", f"{prefix}.{tgt}")
    chosen = set(evenly(source.count(), max_pairs).tolist())
    lines: tuple[list[str], list[str]] = ([], [])
    seen = 0
    for s, t in source.chunks(10_000):
        for i, (a, b) in enumerate(zip(s, t, strict=True)):
            if seen + i in chosen:
                lines[0].append(a)
                lines[1].append(b)
        seen += len(s)
    ids_src = tokenizer.encode(lines[0])
    ids_tgt = tokenizer.encode(lines[1], side="target")
    return [(np.asarray(a, dtype=np.int64), np.asarray(b, dtype=np.int64)) for a, b in zip(ids_src, ids_tgt, strict=True)]
