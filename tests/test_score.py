"""`nmt score`: sacrebleu metrics, the paper's tokenized BLEU, test sets offline, system comparison, bad input."""

from __future__ import annotations

import io
import json
import math
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
import sacrebleu
from sacrebleu.metrics import BLEU, CHRF, TER

from nmt_cli import metrics as core
from nmt_cli.cli import main
from nmt_cli.errors import ConfigError, DataError

HYP = [
    "The cat sat on the mat.",
    "A well-known author wrote a long book about the sea.",
    "We met at the train station yesterday evening.",
    "It's a state-of-the-art system, isn't it?",
    "There is nothing here.",
]
REF_A = [
    "The cat sat on the mat.",
    "A well-known writer wrote a long book on the sea.",
    "We met yesterday evening at the railway station.",
    "It is a state-of-the-art system, right?",
    "Nothing is here.",
]
REF_B = [
    "A cat was sitting on the mat.",
    "A famous author wrote a big book about the ocean.",
    "Yesterday evening we met at the train station.",
    "It's a modern system, isn't it?",
    "There's nothing here.",
]
HYP_WORSE = [
    "Cat mat.",
    "An author wrote book sea.",
    "We met station.",
    "System, no?",
    "Nothing.",
]


def _write(tmp_path: Path, name: str, lines: list[str]) -> str:
    path = tmp_path / name
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return str(path)


def _run(argv: list[str], capsys, stdin: str | None = None, monkeypatch=None) -> tuple[int, str, str]:
    """Run the CLI in-process; returns (exit code, stdout, stderr)."""
    if stdin is not None:
        monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(stdin.encode("utf-8")), encoding="utf-8"))
    code = 0
    try:
        main(argv)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    out, err = capsys.readouterr()
    return code, out, err


# ----------------------------------------------------------------------------- equal to sacrebleu's API


@pytest.mark.parametrize(
    ("name", "metric", "key"),
    [("bleu", BLEU(), "BLEU"), ("chrf", CHRF(), "chrF2"), ("chrf++", CHRF(word_order=2), "chrF2++"),
     ("ter", TER(), "TER")],
)
def test_scores_equal_sacrebleu_api(name, metric, key):
    refs = [REF_A, REF_B]
    report = core.score_systems([("hyp", HYP)], refs, ["a", "b"], [name])
    expected = metric.corpus_score(HYP, refs)
    assert report.systems[0].scores[key].score == pytest.approx(expected.score, abs=1e-9)
    assert report.signatures[key] == metric.get_signature().format()
    assert "nrefs:2" in report.signatures[key]


def test_cli_json_equals_sacrebleu_on_files(tmp_path, capsys):
    hyp = _write(tmp_path, "hyp.en", HYP)
    ref_a, ref_b = _write(tmp_path, "a.en", REF_A), _write(tmp_path, "b.en", REF_B)
    code, out, _ = _run([ "score", hyp, "-r", ref_a, "-r", ref_b, "--metrics", "bleu,chrf,ter", "--json"], capsys)
    assert code == 0
    data = json.loads(out)
    scores = data["systems"][0]["scores"]
    refs = [REF_A, REF_B]
    assert scores["BLEU"]["score"] == pytest.approx(sacrebleu.corpus_bleu(HYP, refs).score)
    assert scores["chrF2"]["score"] == pytest.approx(sacrebleu.corpus_chrf(HYP, refs).score)
    assert scores["TER"]["score"] == pytest.approx(sacrebleu.corpus_ter(HYP, refs).score)
    bleu = BLEU()
    bleu.corpus_score(HYP, refs)
    assert data["signatures"]["BLEU"] == bleu.get_signature().format()
    assert data["references"] == [ref_a, ref_b]


def test_cli_stdin_and_identity_is_100(tmp_path, capsys, monkeypatch):
    ref = _write(tmp_path, "ref.en", REF_A)
    code, out, _ = _run(["score", "-r", ref], capsys, stdin="\n".join(REF_A) + "\n", monkeypatch=monkeypatch)
    assert code == 0
    lines = out.splitlines()
    assert lines[0].split() == ["system", "BLEU"]
    assert lines[1].split() == ["stdin", "100.0"]
    assert any(line.startswith("BLEU") and "version:" in line for line in lines[2:])


def test_human_table_is_aligned_with_several_systems(tmp_path, capsys):
    ref = _write(tmp_path, "ref.en", REF_A)
    sys_a, sys_b = _write(tmp_path, "sysA.en", HYP), _write(tmp_path, "sysB.en", HYP_WORSE)
    code, out, _ = _run(["score", "-r", ref, sys_a, sys_b, "--metrics", "bleu", "chrf", "ter", "-w", "2"], capsys)
    assert code == 0
    table = out.split("\n\n")[0].splitlines()
    assert table[0].split() == ["system", "BLEU", "chrF2", "TER"]
    assert [row.split()[0] for row in table[1:]] == [sys_a, sys_b]
    # right-aligned numeric columns: every row ends at the same column
    assert len({len(row) for row in table}) == 1
    bleu_b = float(table[2].split()[1])
    assert bleu_b == pytest.approx(round(sacrebleu.corpus_bleu(HYP_WORSE, [REF_A]).score, 2))
    sigs = out.split("\n\n")[1].splitlines()
    assert [s.split()[0] for s in sigs] == ["BLEU", "chrF2", "TER"]


# ------------------------------------------------------------------------------------- metric parsing


def test_metric_names_parsing():
    assert core.parse_metric_names(["bleu,chrf,ter"]) == ["bleu", "chrf", "ter"]
    assert core.parse_metric_names(["bleu chrf", "TER", "chrf"]) == ["bleu", "chrf", "ter"]
    assert core.parse_metric_names(["chrF2++", "tok-bleu"]) == ["chrf++", "tok-bleu"]
    with pytest.raises(ConfigError, match="unknown metric 'rouge'"):
        core.parse_metric_names(["bleu,rouge"])


def test_cli_space_separated_metrics_are_not_files(tmp_path, capsys):
    ref, hyp = _write(tmp_path, "ref.en", REF_A), _write(tmp_path, "hyp.en", HYP)
    code, out, err = _run(["score", hyp, "-r", ref, "--metrics", "bleu", "chrf", "ter", "--json"], capsys)
    assert code == 0 and err == ""
    data = json.loads(out)
    assert [s["name"] for s in data["systems"]] == [hyp]
    assert list(data["signatures"]) == ["BLEU", "chrF2", "TER"]


def test_cli_short_m_still_works_with_a_deprecation_warning(tmp_path, capsys):
    """-m was --metrics before it meant --model in nmt translate: old scripts keep working, and are told."""
    ref, hyp = _write(tmp_path, "ref.en", REF_A), _write(tmp_path, "hyp.en", HYP)
    code, out, err = _run(["score", hyp, "-r", ref, "-m", "bleu", "chrf", "--json"], capsys)
    assert code == 0 and list(json.loads(out)["signatures"]) == ["BLEU", "chrF2"]
    assert err.count("\n") == 1 and err.startswith("warning:") and "--metrics" in err


def test_cli_unknown_metric_is_usage_error(tmp_path, capsys):
    ref, hyp = _write(tmp_path, "ref.en", REF_A), _write(tmp_path, "hyp.en", HYP)
    code, _, err = _run(["score", hyp, "-r", ref, "--metrics", "bleu,rouge"], capsys)
    assert code == 2
    assert "rouge" in err and "--metrics" in err and err.count("\n") == 1


# ------------------------------------------------------------------------------ tokenized (paper) BLEU


def _ngrams(tokens: list[str], n: int) -> Counter:
    return Counter(tuple(tokens[i:i + n]) for i in range(len(tokens) - n + 1))


def _multi_bleu(hyps: list[str], refs: list[str]) -> float:
    """BLEU as multi-bleu.perl computes it (one reference, whitespace tokens, no smoothing), by hand."""
    correct, total = [0] * 4, [0] * 4
    hyp_len = ref_len = 0
    for hyp, ref in zip(hyps, refs, strict=True):
        h, r = hyp.split(), ref.split()
        hyp_len, ref_len = hyp_len + len(h), ref_len + len(r)
        for n in range(1, 5):
            hc, rc = _ngrams(h, n), _ngrams(r, n)
            correct[n - 1] += sum(min(c, rc[g]) for g, c in hc.items())
            total[n - 1] += max(len(h) - n + 1, 0)
    if min(correct) == 0:
        return 0.0
    log_p = sum(math.log(c / t) for c, t in zip(correct, total, strict=True)) / 4
    bp = 1.0 if hyp_len >= ref_len else math.exp(1 - ref_len / hyp_len)
    return 100 * bp * math.exp(log_p)


TOK_HYP = ["Das E-Mail-Konto ist seit gestern gesperrt.", "Wir haben 3,5 Mio. Euro für das Open-Source-Projekt."]
TOK_REF = ["Das E-Mail-Konto ist seit gestern blockiert.", "Wir geben 3,5 Mio. Euro für das Open-Source-Projekt."]
# Moses (de) tokenization, then the Perl compound split s{(\S)-(\S)}{$1 ##AT##-##AT## $2}g, written out by hand.
TOK_HYP_SPLIT = [
    "Das E ##AT##-##AT## Mail ##AT##-##AT## Konto ist seit gestern gesperrt .",
    "Wir haben 3,5 Mio. Euro für das Open ##AT##-##AT## Source ##AT##-##AT## Projekt .",
]
TOK_REF_SPLIT = [
    "Das E ##AT##-##AT## Mail ##AT##-##AT## Konto ist seit gestern blockiert .",
    "Wir geben 3,5 Mio. Euro für das Open ##AT##-##AT## Source ##AT##-##AT## Projekt .",
]


def test_compound_split_follows_the_perl_one_liner():
    assert core.compound_split("a-b") == "a ##AT##-##AT## b"
    assert core.compound_split("x - y") == "x - y"
    assert core.compound_split("a-b c-d") == "a ##AT##-##AT## b c ##AT##-##AT## d"
    assert core.compound_split("E-Mail-Konto") == "E ##AT##-##AT## Mail ##AT##-##AT## Konto"
    # Perl's /g does not re-scan the consumed "b": a-b-c keeps its second hyphen, as in t2t/fairseq's script
    assert core.compound_split("a-b-c") == "a ##AT##-##AT## b-c"


def test_tokenize_for_bleu_matches_the_hand_tokenized_text():
    assert core.tokenize_for_bleu(TOK_HYP, "de") == TOK_HYP_SPLIT
    assert core.tokenize_for_bleu(TOK_REF, "de") == TOK_REF_SPLIT


def test_tok_bleu_equals_hand_computed_multi_bleu():
    expected = _multi_bleu(TOK_HYP_SPLIT, TOK_REF_SPLIT)
    assert 0 < expected < 100
    report = core.score_systems([("hyp", TOK_HYP)], [TOK_REF], ["ref.de"], ["tok-bleu"], tok_lang="de")
    assert report.systems[0].scores["tok-BLEU"].score == pytest.approx(expected, abs=1e-9)
    assert "pre:moses-de+compound-split" in report.signatures["tok-BLEU"]
    assert "tok:none" in report.signatures["tok-BLEU"] and "smooth:none" in report.signatures["tok-BLEU"]


def test_tok_bleu_brevity_penalty_and_zero_precision_by_hand():
    hyps, refs = ["Das Haus ist sehr groß."], ["Das Haus ist heute wirklich sehr groß."]
    split_h, split_r = core.tokenize_for_bleu(hyps, "de"), core.tokenize_for_bleu(refs, "de")
    assert split_h == ["Das Haus ist sehr groß ."]
    report = core.score_systems([("h", hyps)], [refs], ["r"], ["tok-bleu"], tok_lang="de")
    assert report.systems[0].scores["tok-BLEU"].score == pytest.approx(_multi_bleu(split_h, split_r))
    # no 4-gram match: multi-bleu gives 0 (no smoothing), unlike sacreBLEU's default exp smoothing
    short = core.score_systems([("h", ["Das Haus ist groß, sehr groß."])], [refs], ["r"], ["bleu", "tok-bleu"],
                               tok_lang="de")
    assert short.systems[0].scores["tok-BLEU"].score == 0.0
    assert short.systems[0].scores["BLEU"].score > 0.0


def test_cli_tok_bleu_infers_language_from_reference_suffix(tmp_path, capsys):
    ref, hyp = _write(tmp_path, "ref.de", TOK_REF), _write(tmp_path, "hyp.de", TOK_HYP)
    code, out, _ = _run(["score", hyp, "-r", ref, "--tok-bleu", "--json"], capsys)
    assert code == 0
    data = json.loads(out)
    assert list(data["signatures"]) == ["BLEU", "tok-BLEU"]
    assert "pre:moses-de" in data["signatures"]["tok-BLEU"]
    tok = data["systems"][0]["scores"]["tok-BLEU"]["score"]
    assert tok == pytest.approx(_multi_bleu(TOK_HYP_SPLIT, TOK_REF_SPLIT))


def test_tokenizer_language():
    assert core.tokenizer_language("en-de") == "de"
    assert core.tokenizer_language("fr") == "fr"
    assert core.tokenizer_language(None, ["newstest2014.de"]) == "de"
    assert core.tokenizer_language(None, ["ref.txt"]) is None
    with pytest.raises(ConfigError, match="-l en-de"):
        core.score_systems([("h", HYP)], [REF_A], ["ref.txt"], ["tok-bleu"], tok_lang=None)


# ---------------------------------------------------------------------------------- paired bootstrap


def test_paired_bootstrap_against_first_system(tmp_path, capsys):
    hyps = HYP * 8
    worse = HYP_WORSE * 8
    refs = REF_A * 8
    report = core.score_systems([("good", hyps), ("bad", worse)], [refs], ["ref"], ["bleu", "chrf"],
                                paired_bs=True, n_bootstrap=200)
    good, bad = report.systems
    assert good.scores["BLEU"].p_value is None
    assert bad.scores["BLEU"].p_value is not None and bad.scores["BLEU"].p_value < 0.05
    assert good.scores["BLEU"].score == pytest.approx(sacrebleu.corpus_bleu(hyps, [refs]).score)
    assert bad.scores["chrF2"].score == pytest.approx(sacrebleu.corpus_chrf(worse, [refs]).score)
    assert good.scores["BLEU"].ci > 0
    assert "bs:200" in report.signatures["BLEU"] and "seed:" in report.signatures["BLEU"]

    ref = _write(tmp_path, "ref.en", refs)
    a, b = _write(tmp_path, "a.en", hyps), _write(tmp_path, "b.en", worse)
    code, out, _ = _run(["score", "-r", ref, a, b, "--paired-bs", "--n-bootstrap", "100"], capsys)
    assert code == 0
    assert "(baseline)" in out.splitlines()[1]
    assert "p: paired bootstrap resampling (100 samples)" in out


def test_paired_bootstrap_needs_two_systems():
    with pytest.raises(ConfigError, match="at least two"):
        core.score_systems([("a", HYP)], [REF_A], ["ref"], paired_bs=True)


# ---------------------------------------------------------------------------------------- bad input


def test_line_count_mismatch_names_both_counts(tmp_path, capsys):
    ref, hyp = _write(tmp_path, "ref.en", REF_A), _write(tmp_path, "hyp.en", HYP[:3])
    code, _, err = _run(["score", hyp, "-r", ref], capsys)
    assert code == 1
    assert "3 lines" in err and "has 5" in err
    assert len(err.strip().splitlines()) == 1
    with pytest.raises(DataError, match="differ in length"):
        core.score_systems([("h", HYP)], [REF_A, REF_B[:4]], ["a", "b"])


def test_empty_and_unreadable_inputs(tmp_path, capsys, monkeypatch):
    ref = _write(tmp_path, "ref.en", REF_A)
    empty = tmp_path / "empty.en"
    empty.write_text("\n\n", encoding="utf-8")
    code, _, err = _run(["score", str(empty), "-r", ref], capsys)
    assert code == 1 and "empty" in err
    code, _, err = _run(["score", "-r", ref], capsys, stdin="", monkeypatch=monkeypatch)
    assert code == 1 and "stdin is empty" in err
    code, _, err = _run(["score", str(tmp_path / "missing.en"), "-r", ref], capsys)
    assert code == 1 and "missing.en" in err and "no such file" in err
    latin1 = tmp_path / "latin1.en"
    latin1.write_bytes("Größe\n".encode("latin-1"))
    code, _, err = _run(["score", str(latin1), "-r", ref], capsys)
    assert code == 1 and "not UTF-8" in err
    code, _, err = _run(["score", str(tmp_path), "-r", ref], capsys)
    assert code == 1 and "directory" in err


def test_reference_options_are_checked(tmp_path, capsys):
    hyp = _write(tmp_path, "hyp.en", HYP)
    code, _, err = _run(["score", hyp], capsys)
    assert code == 2 and "-r" in err
    code, _, err = _run(["score", hyp, "-r", hyp, "-t", "wmt14", "-l", "en-de"], capsys)
    assert code == 2 and "not both" in err
    with pytest.raises(ConfigError, match="unknown test set"):
        core.load_test_set("wmt99", "en-de")
    with pytest.raises(ConfigError, match="en-de"):
        core.load_test_set("wmt14", None)


def test_test_set_offline_fails_fast_with_one_line(tmp_path):
    """sacrebleu's download into an empty $SACREBLEU, with the network made unreachable (a dead proxy)."""
    hyp = _write(tmp_path, "hyp.de", HYP)
    env = dict(os.environ, SACREBLEU=str(tmp_path / "sacrebleu"), https_proxy="http://127.0.0.1:9",
               http_proxy="http://127.0.0.1:9", HTTPS_PROXY="http://127.0.0.1:9", HTTP_PROXY="http://127.0.0.1:9")
    env.pop("no_proxy", None)
    env.pop("NO_PROXY", None)
    code = "from nmt_cli.cli import main; main()"
    proc = subprocess.run([sys.executable, "-c", code, "score", hyp, "-t", "wmt14", "-l", "en-de"],
                          env=env, capture_output=True, text=True, timeout=90)
    assert proc.returncode == 1
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert "wmt14" in lines[0] and "sacrebleu" in lines[0] and "-r" in lines[0]


def test_blank_hypothesis_lines_score_zero_rather_than_fail(tmp_path):
    """A weak system may output only blank lines: that is a score of 0, not an error; a file of no lines is."""
    from nmt_cli.errors import DataError
    from nmt_cli.metrics import read_lines

    blank = tmp_path / "blank.txt"
    blank.write_text("\n\n\n")
    assert read_lines(blank) == ["", "", ""]
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    with pytest.raises(DataError, match="empty"):
        read_lines(empty)
