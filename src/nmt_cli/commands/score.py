"""`nmt score`: BLEU / chrF / chrF++ / TER (sacrebleu, with signatures) and the paper's tokenized BLEU."""

from __future__ import annotations

import json
import os
import sys

import typer

from nmt_cli.commands.helpformat import usage
from nmt_cli.commands.messages import usage_error

_SUMMARY = "Score translations: BLEU, chrF, TER and the paper's tok-BLEU"
_HELP = (
    "Score translations against references with sacrebleu (BLEU, chrF, chrF++, TER), each with its signature.\n\n"
    "--tok-bleu adds the paper's number: Moses tokenization, compound splitting and BLEU on tokens "
    "(multi-bleu.perl). Several hypothesis files are compared in one table; --paired-bs adds significance against "
    "the first."
)
_EPILOG = """\
Examples:
  nmt score -r ref.de < hyp.de
  nmt score hyp.de -r ref.de --metrics bleu,chrf,ter --tok-bleu
  nmt score -t wmt14 -l en-de < hyp.de
  nmt score -r ref.de sysA.de sysB.de --paired-bs --json
"""


def register(app: typer.Typer) -> None:
    @app.command("score", short_help=_SUMMARY, help=_HELP, epilog=_EPILOG,
                 cls=usage("-r REF [OPTIONS] [HYP...]", "-t TEST_SET -l SRC-TGT [OPTIONS] [HYP...]"))
    def score(
        hypotheses: list[str] = typer.Argument(
            None, metavar="HYP...", help="Hypothesis files, one sentence a line (none, or '-': stdin)."
        ),
        refs: list[str] = typer.Option(None, "-r", "--ref", metavar="REF",
                                       help="Reference file; repeat for several references."),
        metrics: list[str] = typer.Option(
            None, "--metrics", metavar="NAMES",
            help="bleu (default), chrf, chrf++, ter, tok-bleu: comma- or space-separated (--metrics bleu,chrf,ter "
                 "or --metrics bleu chrf ter), or repeated.",
        ),
        metrics_short: list[str] = typer.Option(None, "-m", hidden=True),  # deprecated: -m is --model elsewhere
        tok_bleu: bool = typer.Option(
            False, "--tok-bleu", help="Add tok-BLEU: Moses-tokenized, compound-split BLEU (the paper's protocol)."
        ),
        test_set: str = typer.Option(
            None, "-t", "--test-set", metavar="TEST_SET",
            help="A standard test set by its sacrebleu name (e.g. wmt14) instead of -r."
        ),
        langpair: str = typer.Option(
            None, "-l", "--langpair", metavar="SRC-TGT",
            help="Language pair (en-de) for -t; its target is tok-BLEU's tokenizer language."
        ),
        paired_bs: bool = typer.Option(
            False, "--paired-bs", help="Paired bootstrap resampling (sacrebleu) of each system against the first."
        ),
        n_bootstrap: int = typer.Option(1000, "--n-bootstrap", min=10, metavar="N",
                                        help="Bootstrap resamples for --paired-bs."),
        as_json: bool = typer.Option(False, "--json", help="Print one JSON object (scores, signatures)."),
        width: int = typer.Option(1, "-w", "--width", min=0, max=6, metavar="N", help="Decimals in the table."),
    ) -> None:
        from nmt_cli import metrics as core

        if metrics_short:
            from nmt_cli.commands.messages import warning_line

            warning_line("nmt score -m is deprecated and will be removed (-m is --model in nmt translate); use "
                         "--metrics")
        hypotheses, metric_names = _split_metrics_from_files(list(hypotheses or []),
                                                             list(metrics or []) + list(metrics_short or []))
        metric_names = metric_names or ["bleu"]
        if tok_bleu and "tok-bleu" not in metric_names:
            metric_names.append("tok-bleu")
        if test_set and refs:
            raise usage_error("pass either -r (reference files) or -t (a test set), not both")
        if not test_set and not refs:
            raise usage_error("no reference: pass -r REF (or a test set: -t wmt14 -l en-de)")
        systems = _read_systems(hypotheses)
        if test_set:
            ref_names, references = core.load_test_set(test_set, langpair)
        else:
            ref_names, references = list(refs), [core.read_lines(path, "reference") for path in refs]
        report = core.score_systems(
            systems, references, ref_names, metric_names,
            tok_lang=core.tokenizer_language(langpair, ref_names), paired_bs=paired_bs, n_bootstrap=n_bootstrap,
        )
        typer.echo(json.dumps(report.to_dict(), indent=2, ensure_ascii=False) if as_json else render(report, width))


def _split_metrics_from_files(positionals: list[str], metric_values: list[str]) -> tuple[list[str], list[str]]:
    """Make `-m bleu chrf ter` work: after -m, positionals that name a metric and are not existing files are
    metrics (click hands them over as hypothesis files). Returns (hypothesis files, canonical metric names)."""
    from nmt_cli import metrics as core
    from nmt_cli.errors import ConfigError

    files = []
    if metric_values:
        for token in positionals:
            if core.is_metric_name(token) and not os.path.exists(token):
                metric_values.append(token)
            else:
                files.append(token)
    else:
        files = positionals
    try:
        return files, core.parse_metric_names(metric_values)
    except ConfigError as exc:
        raise typer.BadParameter(str(exc), param_hint="'--metrics'") from None


def _read_systems(paths: list[str]) -> list[tuple[str, list[str]]]:
    """(name, lines) for each hypothesis file; stdin when none is given or for '-'."""
    from nmt_cli import metrics as core

    if not paths:
        if sys.stdin is None or sys.stdin.isatty():
            raise usage_error("no hypothesis: pass a file or pipe one (nmt score -r ref.de < hyp.de)")
        paths = ["-"]
    systems = []
    for path in paths:
        if path == "-":
            systems.append(("stdin", core.lines_from_stream(sys.stdin.buffer, "stdin")))
        else:
            systems.append((path, core.read_lines(path)))
    return systems


def render(report, width: int = 1) -> str:
    """A plain aligned table (system x metric), then one signature line per metric."""
    names = report.metric_names
    header = ["system"]
    for name in names:
        header += [f"{name} (μ ± 95% CI)", "p"] if report.paired_bs else [name]
    rows = []
    for i, system in enumerate(report.systems):
        label = f"{system.name} (baseline)" if report.paired_bs and i == 0 else system.name
        row = [label]
        for name in names:
            s = system.scores[name]
            if report.paired_bs:
                row.append(f"{s.score:.{width}f} ({s.mean:.{width}f} ± {s.ci:.{width}f})")
                row.append("-" if s.p_value is None else f"{s.p_value:.4f}" + ("*" if s.p_value < 0.05 else ""))
            else:
                row.append(f"{s.score:.{width}f}")
        rows.append(row)
    lines = [_align([header] + rows), ""]
    pad = max(len(n) for n in names)
    lines += [f"{name.ljust(pad)}  {report.signatures[name]}" for name in names]
    if report.paired_bs:
        lines += ["", f"p: paired bootstrap resampling ({report.n_bootstrap} samples) against the baseline "
                      f"{report.systems[0].name}; * p < 0.05"]
    return "\n".join(lines)


def _align(table: list[list[str]]) -> str:
    """Left-align the first column, right-align the others, two spaces between columns."""
    widths = [max(len(row[c]) for row in table) for c in range(len(table[0]))]
    out = []
    for row in table:
        cells = [row[0].ljust(widths[0])] + [cell.rjust(w) for cell, w in zip(row[1:], widths[1:], strict=True)]
        out.append("  ".join(cells).rstrip())
    return "\n".join(out)
