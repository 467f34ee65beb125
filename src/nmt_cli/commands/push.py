"""`nmt push CKPT ORG/NAME`: the checkpoint, its model card and optionally its exports, as a hub model repository."""

from __future__ import annotations

from pathlib import Path

import typer

from nmt_cli.commands.export import (
    LICENSE,
    QUANTIZATIONS,
    SCORES,
    TRAINING_DATA,
    Quantization,
    card_info,
    quiet_transformers,
)
from nmt_cli.commands.helpformat import Command
from nmt_cli.commands.messages import note_line, usage_error

_SUMMARY = "Upload a checkpoint and its exports to the Hugging Face hub"
_HELP = (
    "Upload a checkpoint to a Hugging Face hub model repository (created if needed) in one commit: checkpoint.pt "
    "(weights, config and tokenizer; the training state is left out), a model card (README.md) and, with "
    "--huggingface and --ctranslate2, the exports (the Hugging Face one at the root, so "
    "from_pretrained('ORG/NAME') works; CTranslate2 under ctranslate2/). Then nmt translate -m hf:ORG/NAME runs it "
    "anywhere.\n\n"
    "Needs a token with write access (hf auth login, or HF_TOKEN); --dry-run DIR writes the repository folder "
    "without uploading."
)
_EPILOG = """\
Examples:
  nmt push runs/base/averaged.pt my-org/nmt-en-de --huggingface \\
      --ctranslate2 --license cc-by-4.0
  nmt push runs/base/averaged.pt my-org/nmt-en-de --private \\
      --scores test.scores.json
  nmt push runs/base/averaged.pt my-org/nmt-en-de --huggingface \\
      --dry-run staged/                                # look before uploading
"""


def register(app: typer.Typer) -> None:
    @app.command("push", cls=Command, short_help=_SUMMARY, help=_HELP, epilog=_EPILOG)
    def push(
        model: str = typer.Argument(..., metavar="CKPT", help="Checkpoint file (or hf:ORG/NAME[@REVISION])."),
        repo_id: str = typer.Argument(..., metavar="ORG/NAME", help="The hub model repository."),
        private: bool = typer.Option(False, "--private", help="Create the repository private."),
        huggingface: bool = typer.Option(False, "--huggingface", help="Add the Hugging Face export (at the root)."),
        ctranslate2: bool = typer.Option(False, "--ctranslate2", help="Add the CTranslate2 export (ctranslate2/)."),
        quantization: Quantization = typer.Option(
            None, "-q", "--quantization", metavar="TYPE", show_default="float32",
            help=f"Weight type of the CTranslate2 export: {QUANTIZATIONS}."),
        message: str = typer.Option(None, "--message", metavar="TEXT", help="Commit message."),
        dry_run: Path = typer.Option(
            None, "--dry-run", metavar="DIR", help="Write the repository folder to DIR and upload nothing."),
        license_id: str = LICENSE,
        training_data: str = TRAINING_DATA,
        scores: Path = SCORES,
    ) -> None:
        from nmt_cli.export import require
        from nmt_cli.hub import push as hub
        from nmt_cli.importers import pretrained

        repo_id = hub.check_repo_id(repo_id)
        if quantization is not None and not ctranslate2:
            raise usage_error("--quantization applies to the CTranslate2 export: add --ctranslate2")
        if ctranslate2:
            require("ctranslate2", "nmt push --ctranslate2")
        if huggingface:
            require("transformers", "nmt push --huggingface")
            quiet_transformers()
        hub_token = None if dry_run is not None else hub.token()  # no token: refuse before any work
        ckpt, origin = pretrained.load(model, note_line, digest=True)
        card = card_info(license_id, training_data, scores)
        kwargs = dict(card=card, ctranslate2=ctranslate2, huggingface=huggingface,
                      quantization=quantization.value if quantization else None, source=origin)
        if dry_run is not None:
            files = hub.stage(ckpt, dry_run, repo_id, **kwargs)
            typer.echo(f"dry run: {len(files)} files for {repo_id} in {dry_run}/ (nothing uploaded): "
                       + ", ".join(files), err=True)
            return
        with hub.staging_folder() as tmp:
            files = hub.stage(ckpt, Path(tmp) / "repo", repo_id, **kwargs)
            pushed = hub.upload(Path(tmp) / "repo", repo_id, private, message, hub_token)
        typer.echo(f"pushed {len(files)} files to {pushed.url} (commit {pushed.commit}); translate with: "
                   f"nmt translate -m hf:{repo_id}@{pushed.commit}", err=True)

