"""`nmt average`: average the weights of checkpoints into one normal, self-contained checkpoint."""

from __future__ import annotations

from pathlib import Path

import typer

_HELP = (
    "Average the weights of several checkpoints of one run (the paper averages the last 5 checkpoints for "
    "base, the last 20 for big). The result is a normal checkpoint that nmt translate loads."
)
_EPILOG = (
    "Examples:\n\n"
    "  nmt average --last 5 runs/base -o runs/base/averaged.pt\n\n"
    "  nmt average runs/base/checkpoint_9000.pt runs/base/checkpoint_10000.pt -o avg.pt\n\n"
    "  nmt average hf:my-org/nmt-en-de@v1 hf:my-org/nmt-en-de@v2 -o avg.pt"
)


def register(app: typer.Typer) -> None:
    @app.command("average", help=_HELP, epilog=_EPILOG)
    def average(
        inputs: list[str] = typer.Argument(..., metavar="CKPT... | RUN_DIR",
                                           help="Checkpoint files (or hf:ORG/NAME\\[@REVISION] hub references), or "
                                                "one run directory with --last N."),
        output: Path = typer.Option(..., "-o", "--output", help="The averaged checkpoint to write."),
        last: int = typer.Option(None, "--last", min=1,
                                 help="Average the newest N checkpoint_<step>.pt of the run directory given."),
    ) -> None:
        from nmt_cli import hub
        from nmt_cli.checkpoint import save
        from nmt_cli.commands.messages import note_line
        from nmt_cli.training.checkpoints import average_checkpoints, last_checkpoints

        if last is not None:
            if len(inputs) != 1 or hub.is_hub_ref(inputs[0]):
                raise typer.BadParameter("with --last N pass exactly one local run directory", param_hint="RUN_DIR")
            paths = last_checkpoints(Path(inputs[0]), last)
        else:
            paths = [hub.resolve(item, note_line) for item in inputs]
            if any(p.is_dir() for p in paths):
                raise typer.BadParameter("a directory needs --last N (e.g. --last 5 RUN_DIR)", param_hint="CKPT")
        if output.resolve() in {p.resolve() for p in paths}:
            raise typer.BadParameter(f"{output} is one of the inputs; write the average to another file",
                                     param_hint="-o")
        ckpt = average_checkpoints(paths)
        save(ckpt, output)
        note = f" (only {len(paths)} of the {last} asked for exist)" if last and len(paths) < last else ""
        typer.echo(f"averaged {len(paths)} checkpoints{note} -> {output}", err=True)
