"""The Typer app: registers the subcommands, --version/--debug, and turns every error into one stderr line:
an NmtError exits 1, a usage error (click's) exits 2.

Dependency direction: cli -> commands -> core. The core never imports typer or rich.
"""

from __future__ import annotations

import sys

import typer

from nmt_cli import __version__
from nmt_cli.commands import (
    average,
    export,
    import_,
    prepare,
    push,
    score,
    serve,
    shortlist,
    train,
    translate,
)
from nmt_cli.commands.helpformat import Group, argument_name, option_metavar
from nmt_cli.commands.messages import click_exceptions
from nmt_cli.errors import NmtError

app = typer.Typer(
    name="nmt",
    cls=Group,
    help=(
        "nmt: the Transformer of 'Attention Is All You Need' and the whole workflow around it: prepare a corpus, "
        "train, average checkpoints, translate, score, export and share the model."
    ),
    epilog="""\
Examples:
  nmt prepare wmt14-en-de -o data/ende     # download, clean, BPE, binarize
  nmt train data/ende -o runs/base --preset base   # writes averaged.pt
  nmt translate -m runs/base/averaged.pt < in.en > out.de
  nmt score -r ref.de < out.de
  nmt export ctranslate2 runs/base/averaged.pt -o ende-ct2

'nmt COMMAND --help' shows a command's options. Exit status: 0 done, 1 error
(one line on stderr), 2 usage error, 130 interrupted.
""",
    no_args_is_help=True,
    add_completion=False,
    rich_markup_mode=None,
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
    debug: bool = typer.Option(
        False, "--debug", help="Show full tracebacks on errors (also accepted after the command: nmt train --debug)."
    ),
) -> None:
    _state["debug"] = debug


for _module in (prepare, train, average, translate, serve, score, export, import_, push, shortlist):
    _module.register(app)


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point. Exit status: 0 done; 1 an error (an NmtError: one line on stderr saying what
    to do); 2 a usage error (one line naming the option or argument, and the --help to read); 130 interrupted."""
    args = _debug_first(list(sys.argv[1:] if argv is None else argv))
    _state["debug"] = False
    click_errors = click_exceptions()
    no_args_is_help = getattr(click_errors, "NoArgsIsHelpError", ())  # click >= 8.2: `nmt` alone shows the help
    try:
        status = app(args=args, prog_name="nmt", standalone_mode=False)
    except NmtError as exc:
        if _state["debug"] or "--debug" in args:
            raise
        _error_line(str(exc).splitlines()[0] if str(exc) else type(exc).__name__, "use --debug for the traceback")
        sys.exit(1)
    except no_args_is_help as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except click_errors.UsageError as exc:
        where = exc.ctx.command_path if exc.ctx is not None else _command_path(args)
        _error_line(usage_message(exc, click_errors), f"see '{where} --help'")
        sys.exit(exc.exit_code)
    except click_errors.ClickException as exc:
        _error_line(" ".join(exc.format_message().split()), "use --debug for the traceback")
        sys.exit(exc.exit_code)
    except typer.Abort:
        _error_line("aborted", "use --debug for the traceback")
        sys.exit(1)
    except OSError as exc:  # the system refused a file operation no command foresaw (a full disk...)
        if _state["debug"] or "--debug" in args:
            raise
        where = f" ({exc.filename})" if exc.filename else ""
        _error_line(f"{exc.strerror or exc}{where}; free space or fix the permissions, then run the command again",
                    "use --debug for the traceback")
        sys.exit(1)
    sys.exit(status if isinstance(status, int) else 0)  # --help, --version and typer.Exit(code) return a code


def _debug_first(args: list[str]) -> list[str]:
    """`--debug` anywhere before a `--` moves to the front, where the root command reads it: `nmt train --debug
    ...` works as well as `nmt --debug train ...` (the error lines tell users to add it, wherever they do)."""
    end = args.index("--") if "--" in args else len(args)
    if "--debug" not in args[:end]:
        return args
    return ["--debug", *(a for a in args[:end] if a != "--debug"), *args[end:]]


def _command_path(args: list[str]) -> str:
    """`nmt export ctranslate2`: the (sub)command the arguments name, for errors click raises without context."""
    command, path = typer.main.get_command(app), ["nmt"]
    for arg in args:
        sub = getattr(command, "commands", {}).get(arg)
        if sub is not None:
            command = sub
            path.append(arg)
        elif not arg.startswith("-"):
            break
    return " ".join(path)


def usage_message(exc, click_errors) -> str:
    """Click's message for a usage error on one line, in the style of our errors: "missing option -m / --model
    CKPT", "invalid value for '--beam': 'x' is not a valid integer", "no such option: --bem; did you mean
    --beam?"."""
    param = getattr(exc, "param", None)
    if isinstance(exc, click_errors.MissingParameter) and param is not None:
        if param.param_type_name == "argument":
            return f"missing argument {argument_name(param)}"
        return f"missing option {' / '.join(param.opts)} {option_metavar(param)}".rstrip()
    message = " ".join(exc.format_message().split())
    message = message.replace(". Did you mean", "; did you mean").replace(" Did you mean", "; did you mean")
    message = message.replace(": Value error, ", ": ")  # typer >= 0.2x prefixes its choice errors so
    if message[:1].isupper() and message[1:2].islower():
        message = message[0].lower() + message[1:]
    return message.removesuffix(".")


def _error_line(message: str, hint: str) -> None:
    from rich.console import Console
    from rich.markup import escape

    Console(stderr=True, highlight=False, soft_wrap=True).print(
        f"[bold red]error:[/] {escape(message)}  [dim]({escape(hint)})[/]"
    )


if __name__ == "__main__":
    main()
