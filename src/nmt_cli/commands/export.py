"""`nmt export ctranslate2|huggingface CKPT -o DIR`: the checkpoint as a model folder of another engine."""

from __future__ import annotations

from enum import Enum
from pathlib import Path

import typer

from nmt_cli.commands.helpformat import Command, Group
from nmt_cli.commands.messages import note_line

_SUMMARY = "Export a checkpoint to CTranslate2 or Hugging Face"
_HELP = (
    "Export a checkpoint (a file or hf:ORG/NAME[@REVISION]) to the engines models are deployed with: CTranslate2 "
    "(fast CPU/GPU inference, int8) or Hugging Face transformers (MarianMTModel). Needs the export extra: "
    "pip install 'nmt-cli[export]'."
)
_CT2_SUMMARY = "A CTranslate2 model directory"
_CT2_HELP = (
    "Export a checkpoint to a CTranslate2 model directory: model.bin, the vocabulary, sentencepiece.model and a "
    "README.md with the Python lines that translate with it. Post-LN and pre-LN models; --quantization sets the "
    "weights' type on disk."
)
_CT2_EPILOG = """\
Examples:
  nmt export ctranslate2 runs/base/averaged.pt -o exports/ende-ct2
  nmt export ctranslate2 runs/base/averaged.pt -o exports/ende-ct2-int8 \\
      --quantization int8
  nmt export ctranslate2 hf:my-org/nmt-en-de@v1.0 -o ende-ct2
"""
_HF_SUMMARY = "A Hugging Face transformers model folder (MarianMTModel)"
_HF_HELP = (
    "Export a checkpoint to a Hugging Face folder: MarianMTModel weights and config (model.safetensors, "
    "config.json, generation_config.json), a MarianTokenizer (source.spm, target.spm, vocab.json) and a model "
    "card (README.md). Post-LN models with shared embeddings (nmt's default)."
)
_HF_EPILOG = """\
Examples:
  nmt export huggingface runs/base/averaged.pt -o exports/ende-hf
  nmt score -r test.de --json < test.hyp.de > test.scores.json
  nmt export huggingface runs/base/averaged.pt -o exports/ende-hf \\
      --license cc-by-4.0 --scores test.scores.json \\
      --training-data 'Multi30k en-de train (29,000 pairs)'
"""
_CARD = "Model card"


class Quantization(str, Enum):
    int8 = "int8"
    int8_float32 = "int8_float32"
    int8_float16 = "int8_float16"
    int8_bfloat16 = "int8_bfloat16"
    int16 = "int16"
    float16 = "float16"
    bfloat16 = "bfloat16"
    float32 = "float32"


QUANTIZATIONS = ", ".join(q.value for q in Quantization)


def quiet_transformers() -> None:
    """No progress bars from transformers' save_pretrained on the command line."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()


def card_info(license_id: str, training_data: str | None, scores: Path | None):
    from nmt_cli.export.card import CardInfo, load_scores

    return CardInfo(license=license_id, training_data=training_data,
                    scores=load_scores(scores) if scores is not None else None)


# Model card options, shared by both exports and `nmt push`.
LICENSE = typer.Option("unknown", "--license", metavar="ID", rich_help_panel=_CARD,
                       help="Licence identifier, e.g. apache-2.0 or cc-by-4.0.")
TRAINING_DATA = typer.Option(None, "--training-data", metavar="TEXT", rich_help_panel=_CARD,
                             help="What the model was trained on.")
SCORES = typer.Option(None, "--scores", metavar="FILE", rich_help_panel=_CARD,
                      help="The output of nmt score --json: BLEU and its sacreBLEU signature.")


def register(app: typer.Typer) -> None:
    export_app = typer.Typer(cls=Group, help=_HELP, short_help=_SUMMARY, no_args_is_help=True, rich_markup_mode=None,
                             context_settings={"help_option_names": ["-h", "--help"]})
    app.add_typer(export_app, name="export")

    @export_app.command("ctranslate2", cls=Command, short_help=_CT2_SUMMARY, help=_CT2_HELP, epilog=_CT2_EPILOG)
    def ctranslate2(
        model: str = typer.Argument(..., metavar="CKPT", help="Checkpoint file or hf:ORG/NAME[@REVISION]."),
        output: Path = typer.Option(..., "-o", "--output", metavar="DIR", help="The model directory to write."),
        quantization: Quantization = typer.Option(
            None, "-q", "--quantization", metavar="TYPE", show_default="float32, as trained",
            help=f"Weight type on disk: {QUANTIZATIONS}."),
        force: bool = typer.Option(False, "--force", help="Replace a non-empty output directory."),
        license_id: str = LICENSE,
        training_data: str = TRAINING_DATA,
        scores: Path = SCORES,
    ) -> None:
        from nmt_cli.export import ctranslate2 as core
        from nmt_cli.export import require
        from nmt_cli.importers import pretrained

        require("ctranslate2", "nmt export ctranslate2")
        ckpt, origin = pretrained.load(model, note_line, digest=True)
        card = card_info(license_id, training_data, scores)
        core.export(ckpt, output, quantization.value if quantization else None, card, origin, replace=force)
        kind = f"CTranslate2, {quantization.value}" if quantization else "CTranslate2, float32"
        typer.echo(f"exported {model} (sha256 {origin['sha256'][:12]}) -> {output}/ ({kind}); see {output}/README.md",
                   err=True)

    @export_app.command("huggingface", cls=Command, short_help=_HF_SUMMARY, help=_HF_HELP, epilog=_HF_EPILOG)
    def huggingface(
        model: str = typer.Argument(..., metavar="CKPT", help="Checkpoint file or hf:ORG/NAME[@REVISION]."),
        output: Path = typer.Option(..., "-o", "--output", metavar="DIR", help="The model folder to write."),
        force: bool = typer.Option(False, "--force", help="Replace a non-empty output directory."),
        license_id: str = LICENSE,
        training_data: str = TRAINING_DATA,
        scores: Path = SCORES,
    ) -> None:
        from nmt_cli.export import huggingface as core
        from nmt_cli.export import require
        from nmt_cli.importers import pretrained

        require("transformers", "nmt export huggingface")
        quiet_transformers()
        ckpt, origin = pretrained.load(model, note_line, digest=True)
        core.export(ckpt, output, card_info(license_id, training_data, scores), origin, replace=force)
        typer.echo(f"exported {model} (sha256 {origin['sha256'][:12]}) -> {output}/ (Hugging Face MarianMTModel); "
                   f"see {output}/README.md", err=True)

