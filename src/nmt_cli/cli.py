"""The Typer app: registers the subcommands, --version/--debug, and maps NmtError to one stderr line.

Dependency direction: cli -> commands -> core. The core never imports typer or rich.
"""

from __future__ import annotations

import sys

import typer

from nmt_cli import __version__
from nmt_cli.commands import average, export, prepare, push, score, train, translate
from nmt_cli.errors import NmtError

app = typer.Typer(
    name="nmt",
    help=(
        "nmt: the Transformer of 'Attention Is All You Need' and the whole NMT workflow.\n\n"
        "  nmt prepare wmt14-en-de -o data/ende      # download, clean, joint BPE, binarize\n\n"
        "  nmt train data/ende -o runs/base --preset base\n\n"
        "  cat in.en | nmt translate -m runs/base/checkpoint_best.pt > out.de\n\n"
        "  nmt score -r ref.de < out.de\n\n"
        "  nmt export ctranslate2 runs/base/checkpoint_best.pt -o ende-ct2   # or huggingface; nmt push to the hub"
    ),
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)

_state = {"debug": False}


def _version_callback(value: bool) -> None:
    if value:
        typer.echo(f"nmt {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(
        False, "--version", callback=_version_callback, is_eager=True, help="Show the version and exit."
    ),
    debug: bool = typer.Option(False, "--debug", help="Show full tracebacks on errors."),
) -> None:
    _state["debug"] = debug


for _module in (prepare, train, average, translate, score, export, push):
    _module.register(app)


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point: run the app, turning NmtError into one line on stderr, exit 1."""
    debug = _state["debug"] or "--debug" in (argv if argv is not None else sys.argv[1:])
    try:
        # Standalone mode: Typer/Click handle --help, usage errors (exit 2) and Ctrl-C themselves;
        # only our own errors come through here.
        app(args=argv, prog_name="nmt")
    except NmtError as exc:
        if debug:
            raise
        _error_line(str(exc))
        sys.exit(1)


def _error_line(message: str) -> None:
    from rich.console import Console
    from rich.markup import escape

    first = message.splitlines()[0] if message else "unknown error"
    Console(stderr=True, highlight=False, soft_wrap=True).print(
        f"[bold red]error:[/] {escape(first)}  [dim](use --debug for the traceback)[/]"
    )


if __name__ == "__main__":
    main()
