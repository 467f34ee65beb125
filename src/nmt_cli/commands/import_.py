"""`nmt import`: a MarianMT (OPUS-MT) model, local or on the hub, written as an nmt checkpoint."""

from __future__ import annotations

from pathlib import Path

import typer

from nmt_cli.commands.helpformat import usage

_SUMMARY = "Convert an OPUS-MT (MarianMT) model into an nmt checkpoint"
_HELP = (
    "Convert a MarianMT model (the format of the ~1,400 OPUS-MT models on the Hugging Face hub) into an nmt "
    "checkpoint, exactly: the same weights, the same tokenizer (its source and target sentencepiece models and "
    "vocabulary travel inside the checkpoint). nmt translate -m and Translator.load take such models directly "
    "(converted once and cached); nmt import writes the checkpoint where you want it, e.g. to fine-tune it "
    "(nmt prepare --tokenizer-from, nmt train --init-from).\n\n"
    "MODEL is a local folder holding a MarianMT model (config.json, source.spm, target.spm, vocab.json and the "
    "weights) or hf:ORG/NAME[@REVISION]. What nmt cannot represent exactly is refused in one line naming the field."
)
_EPILOG = """\
Examples:
  nmt import hf:Helsinki-NLP/opus-mt-en-de -o opus-en-de.pt
  nmt import ./opus-mt-en-de -o opus-en-de.pt
  echo "Hello world" | nmt translate -m opus-en-de.pt
"""


def register(app: typer.Typer) -> None:
    @app.command("import", short_help=_SUMMARY, help=_HELP, epilog=_EPILOG, cls=usage("MODEL -o FILE"))
    def import_(
        model: str = typer.Argument(..., metavar="MODEL", help="MarianMT folder or hf:ORG/NAME[@REVISION]."),
        output: Path = typer.Option(..., "-o", "--output", metavar="FILE", help="The nmt checkpoint to write."),
    ) -> None:
        from nmt_cli.checkpoints.format import save
        from nmt_cli.commands.messages import note_line, usage_error
        from nmt_cli.hub import pull as hub
        from nmt_cli.importers import marian, pretrained

        if not hub.is_hub_ref(model) and not marian.is_marian(model):
            raise usage_error(f"{model} is not a MarianMT model folder (no config.json with model_type marian); "
                              "pass the folder of an OPUS-MT model or hf:ORG/NAME")
        ckpt, origin = pretrained.load(model, note_line)
        if "converted" not in origin:
            raise usage_error(f"{model} is already an nmt checkpoint; nothing to import")
        ckpt.meta.setdefault("imported_from", {})["origin"] = {k: v for k, v in origin.items() if k != "converted"}
        save(ckpt, output)
        c = ckpt.model_config
        typer.echo(f"imported {model} -> {output} ({c.encoder_layers}+{c.decoder_layers} layers, d_model "
                   f"{c.d_model}, {c.vocab_size} tokens, {c.activation}; {ckpt.langs.get('src')}->"
                   f"{ckpt.langs.get('tgt')})", err=True)
