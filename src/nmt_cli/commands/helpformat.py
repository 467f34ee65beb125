"""How `nmt ... --help` reads: plain text laid out the way git and argparse lay it out, never cut, at any width.

Typer's rich panels cut long option names at 80 columns (`--save-every-mi…`), show Python types as placeholders
(`<int range>`, `<list[str]>`, `<bool>` after a flag) and drop bracketed text as markup. `Command` and `Group`
write the help themselves from click's parameters instead:

    Usage: nmt train DATA_DIR -o RUN_DIR [OPTIONS]

    Train the Transformer on a prepared data directory ...

    Options:
      -o, --output RUN_DIR      Run directory for checkpoints and logs. [required]
          --preset {tiny,base,big}
                                Model size and recipe defaults. [default: base]

- usage lines as a person writes them: required arguments and options, then [OPTIONS]; a command may list its
  own forms (`usage_forms`, e.g. `nmt average --last N RUN_DIR -o OUT`);
- plain metavars (N, PATH, CKPT...), a choice as {a,b,c} (argparse's way), nothing after a flag, `--[no-]resume`;
- options grouped under headings (an option's `rich_help_panel`, typer's name for a group), defaults as
  `[default: X]` (a `show_default` string where the default depends on the preset);
- the epilog (examples) verbatim, so no command line is ever re-wrapped.

Text is wrapped to click's width (the terminal's, at most 78 columns) without breaking words, not even at hyphens
(`--update-freq` stays whole); a name wider than the first column gets a line of its own. On a terminal headings
are bold and names coloured; click removes the colours when stdout is not a terminal, NO_COLOR turns them off.
"""

from __future__ import annotations

import os
import textwrap
from enum import Enum

import typer
from typer.core import TyperCommand, TyperGroup

NAME_WIDTH = 24  # the first column (option and command names); a wider name is followed by a line break
INDENT = "  "


class Command(TyperCommand):
    """A command whose --help is laid out by this module."""

    usage_forms: tuple[str, ...] = ()  # what follows the command path on each usage line; () derives one

    def format_usage(self, ctx, formatter) -> None:
        forms = self.usage_forms or (_derived_usage(self.get_params(ctx)),)
        _write_usage(formatter, ctx.command_path, forms)

    def format_help(self, ctx, formatter) -> None:
        self.format_usage(ctx, formatter)
        _write_prose(formatter, self.help)
        _write_sections(formatter, _param_sections(self.get_params(ctx)))
        _write_verbatim(formatter, self.epilog)


class Group(TyperGroup):
    """A command group (nmt, nmt export) whose --help is laid out by this module."""

    def format_usage(self, ctx, formatter) -> None:
        has_options = any(p.param_type_name == "option" and not _is_help(ctx, p) for p in self.get_params(ctx))
        _write_usage(formatter, ctx.command_path, (("[OPTIONS] " if has_options else "") + "COMMAND [ARGS]...",))

    def format_help(self, ctx, formatter) -> None:
        self.format_usage(ctx, formatter)
        _write_prose(formatter, self.help)
        rows = []
        for name in self.list_commands(ctx):
            command = self.get_command(ctx, name)
            if command is not None and not command.hidden:
                rows.append((name, command.short_help or _first_sentence(command.help or "")))
        _write_sections(formatter, [("Commands", rows), *_param_sections(self.get_params(ctx))])
        _write_verbatim(formatter, self.epilog)


def usage(*forms: str) -> type[Command]:
    """A Command class whose usage lines are these forms (what follows the command path), in this order."""
    return type("Command", (Command,), {"usage_forms": forms})


# ------------------------------------------------------------------------------------------------ parameters


def _is_help(ctx, param) -> bool:
    return bool(set(getattr(param, "opts", ())) & set(ctx.help_option_names))


def _hidden(param) -> bool:
    return bool(getattr(param, "hidden", False))


def _is_flag(param) -> bool:
    return bool(getattr(param, "is_flag", False) or getattr(param, "count", False))


def argument_name(param) -> str:
    """CKPT, DATA_DIR, HYP...: the metavar (or the upper-cased name), `...` when it takes several values."""
    name = param.metavar or param.name.upper()
    return name + "..." if param.nargs != 1 and not name.endswith("...") else name


def option_metavar(param) -> str:
    """What an option's value looks like: its metavar, {a,b} for a choice, nothing for a flag."""
    if _is_flag(param):
        return ""
    if param.metavar:
        return param.metavar
    choices = _choices(param)
    return "{" + ",".join(choices) + "}" if choices else param.name.upper()


def _choices(param) -> list[str]:
    descriptor = getattr(param, "type_descriptor", None)  # typer >= 0.2x describes types itself
    if descriptor is not None:
        choices = descriptor.choices if getattr(descriptor, "is_choice", False) else None
    else:
        choices = getattr(getattr(param, "type", None), "choices", None)
    return [c.value if isinstance(c, Enum) else str(c) for c in choices or ()]


def option_names(param) -> str:
    """`-o, --output RUN_DIR`, `    --[no-]resume`: short names first; long-only options indented to line up."""
    shorts = [o for o in param.opts if not o.startswith("--")]
    longs = [o for o in param.opts if o.startswith("--")]
    secondary = list(param.secondary_opts)
    if len(longs) == 1 and secondary == ["--no-" + longs[0][2:]]:
        longs, secondary = ["--[no-]" + longs[0][2:]], []
    names = ", ".join(shorts + longs + secondary)
    metavar = option_metavar(param)
    return ("" if shorts else "    ") + names + (f" {metavar}" if metavar else "")


def _default(param) -> str:
    show = getattr(param, "show_default", True)
    if isinstance(show, str):
        return show
    value = param.default
    if show is False or _is_flag(param) or value is None or value is ... or callable(value) or value in ((), []):
        return ""
    if isinstance(value, Enum):
        value = value.value
    return " ".join(map(str, value)) if isinstance(value, (list, tuple)) else str(value)


def _param_help(param) -> str:
    text = " ".join((getattr(param, "help", None) or "").split())
    default = _default(param)
    if default:
        text += f" [default: {default}]"
    if param.param_type_name == "option" and param.required:
        text += " [required]"
    return text.strip()


def _derived_usage(params) -> str:
    """Leading required arguments, required options, [OPTIONS], then the other arguments (in their order)."""
    params = [p for p in params if not _hidden(p)]
    args = [p for p in params if p.param_type_name == "argument"]
    lead = []
    while args and args[0].required:
        lead.append(argument_name(args.pop(0)))
    for p in params:
        if p.param_type_name == "option" and p.required:
            short = next((o for o in p.opts if not o.startswith("--")), p.opts[0])
            lead.append(f"{short} {option_metavar(p)}".strip())
    if any(p.param_type_name == "option" and not p.required for p in params):
        lead.append("[OPTIONS]")
    return " ".join(lead + [argument_name(p) if p.required else f"[{argument_name(p)}]" for p in args])


def _param_sections(params) -> list[tuple[str, list[tuple[str, str]]]]:
    """Arguments, then the ungrouped options (with -h), then each group of options under its heading."""
    params = [p for p in params if not _hidden(p)]
    sections = {"Arguments": [(argument_name(p), _param_help(p)) for p in params if p.param_type_name == "argument"],
                "Options": []}
    for p in params:
        if p.param_type_name == "option":
            sections.setdefault(getattr(p, "rich_help_panel", None) or "Options", []).append(
                (option_names(p), _param_help(p)))
    return list(sections.items())


# ------------------------------------------------------------------------------------------------ layout


def _color() -> bool:
    return "NO_COLOR" not in os.environ


def _heading(text: str) -> str:
    return typer.style(text, bold=True) if _color() else text


def _name(text: str) -> str:
    return typer.style(text, fg="cyan") if _color() else text


def _width(formatter) -> int:
    return max(formatter.width, 40)


def _wrap(text: str, width: int, indent: str = "", first: str | None = None) -> list[str]:
    """Lines of at most `width` characters (unless one word is longer), never breaking a word or at a hyphen."""
    return textwrap.wrap(text, width, initial_indent=indent if first is None else first, subsequent_indent=indent,
                         break_on_hyphens=False, break_long_words=False)


def _blank_line(formatter) -> None:
    if formatter.buffer:
        formatter.write("\n")


def _write_usage(formatter, path: str, forms: tuple[str, ...]) -> None:
    width = _width(formatter)
    for i, form in enumerate(forms):
        prefix = "Usage: " if i == 0 else "   or: "
        lines = _wrap(f"{prefix}{path} {form}", width, " " * (len(prefix) + len(path) + 1), first="")
        lines[0] = lines[0].replace(prefix.strip(), _heading(prefix.strip()), 1)
        formatter.write("".join(line + "\n" for line in lines))


def _write_prose(formatter, text: str | None) -> None:
    """Paragraphs (separated by blank lines) re-wrapped to the width."""
    for paragraph in (text or "").split("\n\n"):
        if paragraph.strip():
            _blank_line(formatter)
            formatter.write("".join(line + "\n" for line in _wrap(" ".join(paragraph.split()), _width(formatter))))


def _write_sections(formatter, sections: list[tuple[str, list[tuple[str, str]]]]) -> None:
    """Headings, each over a two-column list (names, then their help wrapped in the second column); one column
    position for all of them."""
    names = [name for _, rows in sections for name, _ in rows]
    if not names:
        return
    column = len(INDENT) + min(max(map(len, names)), NAME_WIDTH) + 2
    width = _width(formatter)
    for title, rows in sections:
        if not rows:
            continue
        _blank_line(formatter)
        formatter.write(_heading(f"{title}:") + "\n")
        for name, text in rows:
            lines = _wrap(text, width, " " * column) if text else []
            if len(INDENT) + len(name) + 2 <= column and lines:
                padding = " " * (column - len(INDENT) - len(name))
                formatter.write(INDENT + _name(name) + padding + lines.pop(0)[column:] + "\n")
            else:
                formatter.write(INDENT + _name(name) + "\n")
            formatter.write("".join(line + "\n" for line in lines))


def _write_verbatim(formatter, text: str | None) -> None:
    """The epilog as written (examples must not be re-wrapped); a line `Title:` is a heading."""
    if not text:
        return
    _blank_line(formatter)
    for line in text.strip("\n").splitlines():
        is_heading = line.endswith(":") and not line.startswith(" ")
        formatter.write((_heading(line) if is_heading else line.rstrip()) + "\n")


def _first_sentence(text: str) -> str:
    """A command's summary when it has no short_help: its first sentence, whole (never cut with '...')."""
    paragraph = " ".join(text.split("\n\n")[0].split())
    end = paragraph.find(". ")
    return paragraph if end < 0 else paragraph[: end + 1]
