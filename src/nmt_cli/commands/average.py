"""`nmt average`: average the weights of checkpoints into one normal, self-contained checkpoint."""

from __future__ import annotations

from pathlib import Path

import typer

from nmt_cli.commands.helpformat import usage

_SUMMARY = "Average the weights of checkpoints into one checkpoint"
_HELP = (
    "Average the weights of several checkpoints of one run (the paper averages the last 5 checkpoints for "
    "base, the last 20 for big). The result is a normal checkpoint that nmt translate loads.\n\n"
    "CKPT is a checkpoint file or a hub reference hf:ORG/NAME[@REVISION]; with --last N, give one run directory "
    "instead."
)
_EPILOG = """\
Examples:
  nmt average --last 5 runs/base -o runs/base/averaged.pt
  nmt average runs/base/checkpoint_9000.pt runs/base/checkpoint_10000.pt \\
      -o avg.pt
  nmt average hf:my-org/nmt-en-de@v1 hf:my-org/nmt-en-de@v2 -o avg.pt
"""


def register(app: typer.Typer) -> None:
    @app.command("average", short_help=_SUMMARY, help=_HELP, epilog=_EPILOG,
                 cls=usage("CKPT... -o FILE", "--last N RUN_DIR -o FILE"))
    def average(
        inputs: list[str] = typer.Argument(..., metavar="CKPT...",
                                           help="Checkpoints to average (or one run directory, with --last)."),
        output: Path = typer.Option(..., "-o", "--output", metavar="FILE", help="The averaged checkpoint to write."),
        last: int = typer.Option(None, "--last", min=1, metavar="N",
                                 help="Average the newest N checkpoint_<step>.pt of the run directory given."),
    ) -> None:
        from nmt_cli.checkpoints.averaging import average_checkpoints, last_checkpoints
        from nmt_cli.checkpoints.format import save
        from nmt_cli.commands.messages import note_line, usage_error
        from nmt_cli.hub import pull as hub

        if last is not None:
            if len(inputs) != 1 or hub.is_hub_ref(inputs[0]):
                raise usage_error("--last N takes exactly one local run directory (nmt average --last 5 RUN_DIR -o FILE)")
            paths = last_checkpoints(Path(inputs[0]), last, note_line)
        else:
            paths = [hub.resolve(item, note_line) for item in inputs]
            if any(p.is_dir() for p in paths):
                raise usage_error("a run directory needs --last N (e.g. nmt average --last 5 RUN_DIR -o FILE)")
        if output.resolve() in {p.resolve() for p in paths}:
            raise usage_error(f"-o {output} is one of the inputs; write the average to another file")
        ckpt = average_checkpoints(paths)
        save(ckpt, output)
        typer.echo(f"averaged {len(paths)} checkpoints -> {output}", err=True)
