"""`nmt export`: the CTranslate2 and Hugging Face exports compute what nmt computes on the same weights.

Logits-level checks use random tiny models (every architecture variant); whole translations use a tiny model
trained for a few seconds (it ends its sentences). Both engines are optional extras: these tests skip without them
(`make test` installs them, so CI runs them).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from conftest import toy_pairs
from helpers_export import train_tiny
from helpers_translate import make_checkpoint
from nmt_cli.checkpoints import format as checkpoint
from nmt_cli.config import BOS_ID, EOS_ID
from nmt_cli.errors import ConfigError
from nmt_cli.inference.translate import Translator

ct2 = pytest.importorskip("ctranslate2", reason="the export extra is not installed: pip install 'nmt-cli[export]'")
transformers = pytest.importorskip("transformers", reason="the export extra is not installed: pip install 'nmt-cli[export]'")

from nmt_cli.export import ctranslate2 as ct2_export  # noqa: E402
from nmt_cli.export import huggingface as hf_export  # noqa: E402

LINES = [p[0] for p in toy_pairs(60, seed=11)]

pytestmark = pytest.mark.usefixtures("one_thread")


def run_nmt(*args, input=None, env=None, cwd=None):
    return subprocess.run([sys.executable, "-m", "nmt_cli.cli", *args], capture_output=True, text=True,
                          input=input, timeout=300, env=env, cwd=cwd)


@pytest.fixture(scope="module")
def trained(tmp_path_factory, toy_tokenizer_bytes) -> Path:
    return train_tiny(tmp_path_factory.mktemp("trained") / "model.pt", toy_tokenizer_bytes)


def nmt_log_probs(ckpt, src_lines, tgt_lines) -> list[torch.Tensor]:
    """Teacher-forced log-probabilities of each target token (EOS included), one sentence at a time."""
    model, tok = ckpt.build_model(), ckpt.tokenizer_obj()
    out = []
    for s, t in zip(tok.encode(src_lines), tok.encode(tgt_lines), strict=True):
        target = t + [EOS_ID]
        with torch.no_grad():
            logits = model(torch.tensor([s + [EOS_ID]]), torch.tensor([[BOS_ID] + t]))
        out.append(logits.log_softmax(-1)[0].gather(1, torch.tensor(target)[:, None])[:, 0])
    return out


# ------------------------------------------------------------------------------------------------ CTranslate2


@pytest.mark.parametrize("variant", [{}, {"norm_first": True}, {"share_embeddings": False}, {"layer_norm_eps": 1e-2}],
                         ids=["post-LN", "pre-LN", "separate-embeddings", "eps-1e-2"])
def test_ctranslate2_scores_equal_nmt_log_probs(tmp_path, toy_tokenizer_bytes, variant):
    ckpt = checkpoint.load(make_checkpoint(tmp_path / "m.pt", toy_tokenizer_bytes, seed=3, **variant))
    out = ct2_export.export(ckpt, tmp_path / "ct2")
    translator = ct2.Translator(str(out), device="cpu")
    pairs = toy_pairs(8, seed=5)
    tok = ckpt.tokenizer_obj()
    results = translator.score_batch([tok.pieces(p[0]) for p in pairs], [tok.pieces(p[1]) for p in pairs])
    for mine, theirs in zip(nmt_log_probs(ckpt, [p[0] for p in pairs], [p[1] for p in pairs]), results, strict=True):
        assert len(theirs.log_probs) == len(mine)  # CTranslate2 added the source EOS and scored the target EOS
        assert torch.allclose(mine, torch.tensor(theirs.log_probs), atol=1e-4), (mine, theirs.log_probs)


def test_ctranslate2_translations_equal_nmt(tmp_path, trained):
    """Same weights, same search: CTranslate2's length penalty is score / len^alpha, nmt's --lenpen-form fairseq.
    (One line of slack: a near-tie between two hypotheses may fall either way in float arithmetic.)"""
    out = ct2_export.export(checkpoint.load(trained), tmp_path / "ct2")
    sp = checkpoint.load(trained).tokenizer_obj()
    translator = ct2.Translator(str(out), device="cpu", intra_threads=1)
    for beam in (1, 4):
        results = translator.translate_batch([sp.pieces(line) for line in LINES], beam_size=beam, length_penalty=0.6)
        theirs = [sp.sp.decode(r.hypotheses[0]) for r in results]
        mine = Translator.load(trained, device="cpu", beam=beam, lenpen_form="fairseq").translate_best(LINES)
        same = sum(a == b for a, b in zip(mine, theirs, strict=True))
        assert same >= len(LINES) - 1, f"beam {beam}: {same}/{len(LINES)} identical"


def test_ctranslate2_int8_export_is_smaller_and_translates(tmp_path, trained):
    """int8 weights on disk (a 32-wide toy model loses too much to int8 for agreement to mean anything: the
    agreement of an int8 export on a real model is measured in docs/results.md)."""
    fp32 = ct2_export.export(checkpoint.load(trained), tmp_path / "fp32")
    out = ct2_export.export(checkpoint.load(trained), tmp_path / "int8", quantization="int8")
    assert json.loads((out / "nmt_export.json").read_text())["quantization"] == "int8"
    assert (out / "model.bin").stat().st_size < 0.6 * (fp32 / "model.bin").stat().st_size
    sp = checkpoint.load(trained).tokenizer_obj()
    results = ct2.Translator(str(out), device="cpu", compute_type="int8").translate_batch(
        [sp.pieces(line) for line in LINES], beam_size=4, length_penalty=0.6)
    assert len(results) == len(LINES) and all(r.hypotheses[0] for r in results)


def _python_blocks(markdown: str) -> list[str]:
    return re.findall(r"```python\n(.*?)```", markdown, flags=re.S)


def test_ctranslate2_readme_lines_translate(tmp_path, trained):
    """The README's three lines run as written (from the export's parent directory) and give nmt's translation."""
    r = run_nmt("export", "ctranslate2", str(trained), "-o", str(tmp_path / "ende-ct2"))
    assert r.returncode == 0, r.stderr
    code = _python_blocks((tmp_path / "ende-ct2" / "README.md").read_text())[0]
    assert len(code.strip().splitlines()) == 3
    line = LINES[0]
    run = subprocess.run([sys.executable, "-c", code.replace("A man is riding a bike.", line)], cwd=tmp_path,
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    expected = Translator.load(trained, device="cpu", lenpen_form="fairseq").translate_best([line])[0]
    assert run.stdout.strip() == expected


# ------------------------------------------------------------------------------------------------ Hugging Face


def test_huggingface_logits_equal_after_save_and_load(tmp_path, toy_tokenizer_bytes):
    """save_pretrained + from_pretrained: the permuted coordinates make Marian's own positional table exact."""
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    ckpt = checkpoint.load(make_checkpoint(tmp_path / "m.pt", toy_tokenizer_bytes, seed=4))
    out = hf_export.export(ckpt, tmp_path / "hf")
    assert "embed_positions" not in "".join(_safetensors_keys(out / "model.safetensors"))
    tokenizer = AutoTokenizer.from_pretrained(str(out))
    model = AutoModelForSeq2SeqLM.from_pretrained(str(out)).eval()
    assert type(model).__name__ == "MarianMTModel" and type(tokenizer).__name__ == "MarianTokenizer"
    pairs = toy_pairs(8, seed=6)
    batch = tokenizer([p[0] for p in pairs], return_tensors="pt", padding=True)
    nmt_ids = [ids + [EOS_ID] for ids in ckpt.tokenizer_obj().encode([p[0] for p in pairs])]
    assert [row[: len(ids)] for row, ids in zip(batch["input_ids"].tolist(), nmt_ids, strict=True)] == nmt_ids
    tgt = [[BOS_ID] + ids for ids in ckpt.tokenizer_obj().encode([p[1] for p in pairs])]
    width = max(map(len, tgt))
    tgt_in = torch.tensor([t + [0] * (width - len(t)) for t in tgt])
    with torch.no_grad():
        ref = ckpt.build_model()(batch["input_ids"], tgt_in, batch["attention_mask"] == 0)
        got = model(**batch, decoder_input_ids=tgt_in).logits
    assert (ref - got).abs().max() < 1e-4


def _safetensors_keys(path: Path) -> list[str]:
    header = path.read_bytes()
    size = int.from_bytes(header[:8], "little")
    return list(json.loads(header[8 : 8 + size]))


def test_huggingface_generate_equals_nmt(tmp_path, trained):
    """Greedy: identical outputs; beam 4 with HF's length penalty (nmt --lenpen-form fairseq): identical here."""
    from transformers import MarianMTModel, MarianTokenizer

    hf_export.export(checkpoint.load(trained), tmp_path / "hf")
    tokenizer = MarianTokenizer.from_pretrained(str(tmp_path / "hf"))
    model = MarianMTModel.from_pretrained(str(tmp_path / "hf")).eval()
    batch = tokenizer(LINES, return_tensors="pt", padding=True)
    for beam, lp in ((1, "gnmt"), (4, "fairseq")):
        with torch.no_grad():
            generated = model.generate(**batch, num_beams=beam, max_new_tokens=40)
        theirs = tokenizer.batch_decode(generated, skip_special_tokens=True)
        mine = Translator.load(trained, device="cpu", beam=beam, lenpen_form=lp).translate_best(LINES)
        same = sum(a == b for a, b in zip(mine, theirs, strict=True))
        assert same == len(LINES), f"beam {beam}: {same}/{len(LINES)} identical"


def test_translation_pipeline_on_transformers_4(tmp_path, trained):
    """The `translation` pipeline on raw text (transformers 4.x; `make test-transformers4` runs this)."""
    from transformers.pipelines import SUPPORTED_TASKS

    if "translation" not in SUPPORTED_TASKS:
        pytest.skip(f"transformers {transformers.__version__} has no translation pipeline (removed in 5.0)")
    from transformers import pipeline

    hf_export.export(checkpoint.load(trained), tmp_path / "hf")
    translate = pipeline("translation", model=str(tmp_path / "hf"), device="cpu")
    theirs = [r["translation_text"] for r in translate(LINES[:10], num_beams=1, max_new_tokens=40)]
    assert theirs == Translator.load(trained, device="cpu", beam=1).translate_best(LINES[:10])


def test_huggingface_refuses_pre_ln_with_one_line_and_writes_nothing(tmp_path, toy_tokenizer_bytes):
    path = make_checkpoint(tmp_path / "pre.pt", toy_tokenizer_bytes, norm_first=True)
    r = run_nmt("export", "huggingface", str(path), "-o", str(tmp_path / "out"))
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert r.returncode == 1 and len(lines) == 1 and "pre-LN" in lines[0] and "ctranslate2" in lines[0]
    assert not (tmp_path / "out").exists() and list(tmp_path.glob(".out*")) == []
    with pytest.raises(ConfigError, match="separate"):
        hf_export.check_convertible(checkpoint.load(make_checkpoint(tmp_path / "sep.pt", toy_tokenizer_bytes,
                                                                    share_embeddings=False)))


def test_model_card_has_data_scores_config_and_licence(tmp_path, trained):
    scores = {"references": ["data/test.de"], "signatures": {"bleu": "nrefs:1|case:mixed|eff:no|tok:13a"},
              "systems": [{"name": "hyp", "scores": {"bleu": {"score": 36.21, "detail": ""}}}]}
    (tmp_path / "s.json").write_text(json.dumps(scores))
    r = run_nmt("export", "ctranslate2", str(trained), "-o", str(tmp_path / "ct2"), "--license", "cc-by-4.0",
                "--training-data", "toy pairs (600)", "--scores", str(tmp_path / "s.json"))
    assert r.returncode == 0, r.stderr
    card = (tmp_path / "ct2" / "README.md").read_text()
    front = card.split("---")[1]
    assert "license: cc-by-4.0" in front and "- en" in front and "- de" in front and "pipeline_tag: translation" in front
    assert "toy pairs (600)" in card and "BLEU **36.2**" in card and "nrefs:1|case:mixed|eff:no|tok:13a" in card
    assert "d_model / d_ff / heads | 32 / 64 / 4" in card


# ------------------------------------------------------------------------------------------------ CLI behaviour


def test_export_refuses_a_non_empty_directory_unless_forced(tmp_path, trained):
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "keep.txt").write_text("x")
    r = run_nmt("export", "ctranslate2", str(trained), "-o", str(tmp_path / "out"))
    assert r.returncode == 1 and "--force" in r.stderr and (tmp_path / "out" / "keep.txt").exists()
    r = run_nmt("export", "ctranslate2", str(trained), "-o", str(tmp_path / "out"), "--force")
    assert r.returncode == 0, r.stderr
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [
        "README.md", "config.json", "model.bin", "nmt_export.json", "sentencepiece.model", "shared_vocabulary.json"]
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_missing_extra_is_one_line_naming_it(tmp_path, trained):
    blocker = tmp_path / "blocker" / "ctranslate2"
    blocker.mkdir(parents=True)
    (blocker / "__init__.py").write_text("raise ImportError(\"No module named 'ctranslate2'\")\n")
    import os

    env = {**os.environ, "PYTHONPATH": str(tmp_path / "blocker")}
    r = run_nmt("export", "ctranslate2", str(trained), "-o", str(tmp_path / "out"), env=env)
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert r.returncode == 1 and len(lines) == 1 and "pip install 'nmt-cli[export]'" in lines[0]
    assert not (tmp_path / "out").exists()
