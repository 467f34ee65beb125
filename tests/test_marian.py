"""OPUS-MT (MarianMT) models in nmt: the conversion is exact (same logits, same translations as transformers'
generate on the same weights), reached through the real hub client offline, cached, and refused in one line where
nmt cannot represent a model."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from conftest import toy_pairs
from helpers_hub_models import write_model_repo
from helpers_marian import folder_files, make_marian
from nmt_cli.checkpoints import format as checkpoint
from nmt_cli.config import BOS_ID, EOS_ID, PAD_ID
from nmt_cli.errors import ConfigError
from nmt_cli.importers import marian
from nmt_cli.inference.translate import Translator

transformers = pytest.importorskip("transformers", reason="the export extra is not installed: pip install 'nmt-cli[export]'")

pytestmark = pytest.mark.usefixtures("one_thread")
LINES = [p[0] for p in toy_pairs(200, seed=21)]
REPO, COMMIT = "Helsinki-NLP/opus-mt-en-de", "c" * 40


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    return make_marian(tmp_path_factory.mktemp("marian") / "opus-mt-en-de")


@pytest.fixture(scope="module")
def hf(folder):
    from transformers import MarianMTModel, MarianTokenizer

    return MarianTokenizer.from_pretrained(str(folder)), MarianMTModel.from_pretrained(str(folder)).eval()


def run_nmt(*args, env=None, input=None):
    return subprocess.run([sys.executable, "-m", "nmt_cli.cli", *args], capture_output=True, text=True, input=input,
                          timeout=300, env=env)


VARIANTS = {"swish, tied": {}, "gelu, untied output": {"activation_function": "gelu", "tie_word_embeddings": False},
            "relu": {"activation_function": "relu"}}


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_the_converted_model_gives_transformers_logits(folder, hf, variant, tmp_path):
    if VARIANTS[variant]:
        from transformers import MarianMTModel, MarianTokenizer

        folder = make_marian(tmp_path / "variant", steps=30, **VARIANTS[variant])
        hf = MarianTokenizer.from_pretrained(str(folder)), MarianMTModel.from_pretrained(str(folder)).eval()
    tokenizer, model = hf
    ckpt = marian.convert(folder)
    c = ckpt.model_config
    expected = {"swish": "swish", "silu": "swish"}.get(model.config.activation_function,
                                                        model.config.activation_function)
    assert (c.activation, c.output_bias, c.vocab_size) == (expected, True, model.config.vocab_size + 1)
    assert c.share_embeddings == model.config.tie_word_embeddings
    tok, pairs = ckpt.tokenizer_obj(), toy_pairs(16, seed=6)
    batch = tokenizer([p[0] for p in pairs], text_target=[p[1] for p in pairs], return_tensors="pt", padding=True)
    src = [ids + [EOS_ID] for ids in tok.encode([p[0] for p in pairs])]
    tgt = [[BOS_ID] + ids for ids in tok.encode([p[1] for p in pairs], side="target")]
    # the same pieces as MarianTokenizer, numbered in nmt's layout
    theirs = [[tokenizer.convert_ids_to_tokens(i) for i in row if i != model.config.pad_token_id]
              for row in batch["input_ids"].tolist()]
    assert [[tok.piece(i) for i in ids] for ids in src] == theirs
    width = max(map(len, tgt))
    tgt_in = torch.tensor([t + [PAD_ID] * (width - len(t)) for t in tgt])
    labels = batch["labels"].masked_fill(batch["labels"] == -100, model.config.pad_token_id)
    dec_in = torch.cat([torch.full((len(pairs), 1), model.config.decoder_start_token_id), labels[:, :-1]], dim=1)
    src_t = torch.tensor([s + [PAD_ID] * (max(map(len, src)) - len(s)) for s in src])
    with torch.no_grad():
        logits = ckpt.build_model()(src_t, tgt_in, src_t == PAD_ID)
        ref = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                    decoder_input_ids=dec_in).logits.log_softmax(-1)
    # nmt's BOS is a copy of Marian's pad (the decoder's start token): without it the columns are Marian's
    columns = [i for i in range(c.vocab_size) if i != BOS_ID]
    mine = logits[..., columns].log_softmax(-1)
    marian_ids = torch.tensor([tokenizer.get_vocab()[tok.piece(i)] for i in columns])
    for row, t in enumerate(tgt):
        diff = (mine[row, : len(t)] - ref[row, : len(t), marian_ids]).abs().max()
        assert diff < 1e-4, f"sentence {row}: max |log p| difference {diff}"


def _generate(tokenizer, model, lines: list[str], beam: int) -> list[str]:
    batch = tokenizer(lines, return_tensors="pt", padding=True)
    pad, eos = model.config.pad_token_id, model.config.eos_token_id
    with torch.no_grad():
        out = model.generate(**batch, num_beams=beam, max_new_tokens=60, length_penalty=0.6, early_stopping=True,
                             bad_words_ids=[[pad]], forced_eos_token_id=eos)
    return tokenizer.batch_decode(out, skip_special_tokens=True)


@pytest.mark.parametrize("beam", [1, 4])
def test_translations_equal_transformers_generate(folder, hf, beam):
    """Greedy and beam 4 on 200 lines; HF's length penalty is nmt's --lenpen-form fairseq (docs/export.md)."""
    theirs = _generate(*hf, LINES, beam)
    mine = Translator.load(folder, device="cpu", beam=beam, lenpen_form="fairseq").translate_best(LINES)
    same = sum(a == b for a, b in zip(mine, theirs, strict=True))
    assert same >= 0.99 * len(LINES), f"beam {beam}: {same}/{len(LINES)} identical"
    assert len(set(mine)) > 20  # real translations of different lines, not one string


def test_source_only_pieces_are_written_as_marian_tokenizer_writes_them(tmp_path):
    """An untrained model emits pieces of the shared vocabulary that only the source sentencepiece model knows
    ("▁dog"): written as MarianTokenizer writes them, "▁" read as a space (before, 100 of 100 lines held "▁"). Both
    stop at 59 tokens and EOS."""
    untrained = make_marian(tmp_path / "untrained", steps=0, seed=3)
    hf = (transformers.MarianTokenizer.from_pretrained(str(untrained)),
          transformers.MarianMTModel.from_pretrained(str(untrained)).eval())
    lines = LINES[:100]
    theirs = _generate(*hf, lines, 1)
    mine = Translator.load(untrained, device="cpu", beam=1, max_len_a=0, max_len_b=60).translate_best(lines)
    assert not any("\u2581" in line for line in mine)
    assert mine == theirs


def test_a_multi_target_model_translates_into_the_language_asked_as_transformers_with_the_tag(tmp_path):
    """An opus-mt-en-mul-like model (`>>deu<<`, `>>fra<<` in its vocabulary): `--tgt-lang` / `tgt_lang=` puts the
    tag at each line's start and the output equals transformers' on the tagged lines; a line's own tag is kept; no
    target, or one the model does not know, is one line naming the languages it knows."""
    multi = make_marian(tmp_path / "opus-mt-en-mul", steps=0, seed=5, languages=("deu", "fra"))
    hf = (transformers.MarianTokenizer.from_pretrained(str(multi)),
          transformers.MarianMTModel.from_pretrained(str(multi)).eval())
    lines = LINES[:30]
    tr = Translator.load(multi, device="cpu", beam=1, max_len_a=0, max_len_b=60)
    assert tr.tokenizer.languages == ["deu", "fra"]
    outputs = {}
    for lang in ("deu", "fra"):
        outputs[lang] = tr.translate_best(lines, tgt_lang=lang)
        assert outputs[lang] == _generate(*hf, [f">>{lang}<< {line}" for line in lines], 1)
    index = {piece: i for i, piece in enumerate(tr.tokenizer.vocab)}
    assert [ids[0] for ids in tr.encode(lines[:2], 1, "fra")] == [index[">>fra<<"]] * 2  # the tag, first
    per_line = Translator.load(multi, device="cpu", beam=1, max_len_a=0, max_len_b=60, tgt_lang="deu")
    assert per_line.translate_best([f">>fra<< {lines[0]}", lines[1]]) == [outputs["fra"][0], outputs["deu"][1]]
    # ISO 639-1 (and 639-2/B) codes find the model's ISO 639-3 tags, on the command line and in a line's own tag
    assert tr.translate_best(lines[:3], tgt_lang="fr") == outputs["fra"][:3]
    assert tr.translate_best(lines[:3], tgt_lang="ger") == outputs["deu"][:3]
    assert per_line.translate_best([f">>fr<< {lines[0]}", lines[1]]) == [outputs["fra"][0], outputs["deu"][1]]
    with pytest.raises(ConfigError, match=r"line 1 asks for >>cs<<, which the model does not know; choose one of"):
        tr.translate_best([f">>cs<< {lines[0]}"])
    with pytest.raises(ConfigError, match=r"needs a target language: give --tgt-lang \(choose one of deu, fra\)"):
        tr.translate_best(lines[:1])
    with pytest.raises(ConfigError, match=r"does not translate into 'cs'; choose one of deu, fra"):
        tr.translate_best(lines[:1], tgt_lang="cs")
    text = "".join(line + "\n" for line in lines[:5])
    args = ["translate", "-m", str(multi), "--beam", "1", "--max-len-a", "0", "--max-len-b", "60", "--threads", "1"]
    r = run_nmt(*args, "--tgt-lang", "fra", input=text)
    assert r.returncode == 0 and r.stdout.splitlines() == outputs["fra"][:5], r.stderr
    r = run_nmt(*args, input=text)
    assert r.returncode == 1 and r.stdout == "" and r.stderr.count("\n") == 1 and "deu, fra" in r.stderr, r.stderr


def test_a_multi_target_model_from_the_hub_cache_translates_with_tgt_lang_as_transformers(tmp_path):
    """opus-mt-en-mul-like, pulled through the real client from a cache in the hub's layout: `--tgt-lang fr` finds
    its `>>fra<<` and the output equals transformers' `generate` on the tagged lines (beam 4)."""
    multi = make_marian(tmp_path / "opus-mt-en-mul", steps=0, seed=5, languages=("deu", "fra"))
    repo = "Helsinki-NLP/opus-mt-en-mul"
    cache = tmp_path / "hub"
    write_model_repo(cache, repo, COMMIT, folder_files(multi))
    hf = (transformers.MarianTokenizer.from_pretrained(str(multi)),
          transformers.MarianMTModel.from_pretrained(str(multi)).eval())
    lines = LINES[:12]
    env = {**os.environ, "HF_HUB_CACHE": str(cache), "HF_HUB_OFFLINE": "1", "NMT_CACHE": str(tmp_path / "nmt")}
    for code, tag in (("fr", "fra"), ("deu", "deu")):
        r = run_nmt("translate", "-m", f"hf:{repo}", "--tgt-lang", code, "--beam", "4", "--max-len-a", "0",
                    "--max-len-b", "60", "--threads", "1", env=env, input="".join(line + "\n" for line in lines))
        assert r.returncode == 0, r.stderr
        assert r.stdout.splitlines() == _generate(*hf, [f">>{tag}<< {line}" for line in lines], 4)


def test_hub_reference_converts_once_offline_through_the_real_client(folder, tmp_path):
    cache = tmp_path / "hub"
    write_model_repo(cache, REPO, COMMIT, folder_files(folder))
    env = {**os.environ, "HF_HUB_CACHE": str(cache), "HF_HUB_OFFLINE": "1", "NMT_CACHE": str(tmp_path / "nmt")}
    first = run_nmt("translate", "-m", f"hf:{REPO}", "--beam", "1", env=env, input="\n".join(LINES[:20]) + "\n")
    assert first.returncode == 0, first.stderr
    assert "converted" in first.stderr and COMMIT in first.stderr
    converted = list((tmp_path / "nmt").rglob("*.pt"))
    assert len(converted) == 1
    stamp = converted[0].stat().st_mtime_ns
    second = run_nmt("translate", "-m", f"hf:{REPO}", "--beam", "1", env=env, input="\n".join(LINES[:20]) + "\n")
    assert second.returncode == 0, second.stderr
    assert second.stdout == first.stdout and "converted" not in second.stderr
    assert converted[0].stat().st_mtime_ns == stamp  # read from the cache, not converted again
    expected = Translator.load(folder, device="cpu", beam=1).translate_best(LINES[:20])
    assert first.stdout.splitlines() == expected


def test_import_writes_a_checkpoint_that_translates_like_the_folder(folder, tmp_path):
    r = run_nmt("import", str(folder), "-o", str(tmp_path / "opus.pt"))
    assert r.returncode == 0, r.stderr
    ckpt = checkpoint.load(tmp_path / "opus.pt")
    assert ckpt.vocab is not None and ckpt.target_tokenizer != ckpt.tokenizer
    a = Translator.load(tmp_path / "opus.pt", device="cpu").translate_best(LINES[:30])
    b = Translator.load(folder, device="cpu").translate_best(LINES[:30])
    assert a == b


@pytest.mark.parametrize("field,value", [("normalize_before", True), ("activation_function", "gelu_new"),
                                         ("decoder_ffn_dim", 128), ("share_encoder_decoder_embeddings", False)])
def test_what_nmt_cannot_represent_is_refused_in_one_line(folder, tmp_path, field, value):
    copy = tmp_path / "m"
    copy.mkdir()
    for name, data in folder_files(folder).items():
        (copy / name).write_bytes(data)
    config = json.loads((copy / "config.json").read_text())
    config[field] = value
    (copy / "config.json").write_text(json.dumps(config))
    with pytest.raises(ConfigError, match=f"{field}={value!r}"):
        marian.convert(copy)
    r = run_nmt("import", str(copy), "-o", str(tmp_path / "x.pt"))
    assert r.returncode != 0 and len(r.stderr.strip().splitlines()) == 1 and field in r.stderr
    assert not (tmp_path / "x.pt").exists()


def test_round_trip_through_the_huggingface_export(tmp_path, toy_tokenizer_bytes):
    """nmt checkpoint -> nmt export huggingface -> import: the same translations, a joint tokenizer again."""
    from helpers_export import train_tiny
    from nmt_cli.export import huggingface as hf_export

    trained = train_tiny(tmp_path / "model.pt", toy_tokenizer_bytes)
    hf_export.export(checkpoint.load(trained), tmp_path / "hf")
    back = marian.convert(tmp_path / "hf")
    assert back.model_config.activation == "relu" and not back.model_config.output_bias
    assert back.tokenizer == checkpoint.load(trained).tokenizer and back.vocab is None  # nmt's joint tokenizer
    checkpoint.save(back, tmp_path / "back.pt")
    a = Translator.load(trained, device="cpu").translate_best(LINES[:60])
    b = Translator.load(tmp_path / "back.pt", device="cpu").translate_best(LINES[:60])
    assert a == b


def _valid_nll(run: Path) -> float:
    events = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [e for e in events if e["kind"] == "valid"][-1]["valid_nll"]


def test_fine_tuning_an_imported_model_on_a_shifted_domain(folder, hf, tmp_path):
    """prepare --tokenizer-from + train --init-from: the valid loss on a new domain (German word order reversed)
    falls below the starting model's within a few dozen updates; the result translates and exports as any nmt
    model."""
    raw = tmp_path / "raw"
    raw.mkdir()
    for split, n, seed in (("train", 400, 31), ("valid", 60, 32)):
        pairs = toy_pairs(n, seed)
        (raw / f"{split}.en").write_text("".join(p[0] + "\n" for p in pairs))
        (raw / f"{split}.de").write_text("".join(" ".join(reversed(p[1].split())) + "\n" for p in pairs))
    data = tmp_path / "data"
    r = run_nmt("prepare", "custom", "--src-lang", "en", "--tgt-lang", "de", "--train", str(raw / "train"),
                "--valid", str(raw / "valid"), "--tokenizer-from", str(folder), "-o", str(data))
    assert r.returncode == 0, r.stderr
    common = ["--init-from", str(folder), "--preset", "tiny", "--dropout", "0", "--max-tokens", "1024",
              "--update-freq", "1", "--threads", "1"]
    start = run_nmt("train", str(data), "-o", str(tmp_path / "start"), *common, "--max-steps", "1", "--lr", "1e-12",
                    "--valid-every", "1")
    assert start.returncode == 0, start.stderr
    tuned = tmp_path / "tuned"
    r = run_nmt("train", str(data), "-o", str(tuned), *common, "--max-steps", "40", "--lr", "3e-3", "--warmup", "5",
                "--valid-every", "40")
    assert r.returncode == 0, r.stderr
    assert _valid_nll(tuned) < _valid_nll(tmp_path / "start") - 0.2, (_valid_nll(tuned), _valid_nll(tmp_path / "start"))
    # it translates, and exports like any nmt model: Hugging Face's generate gives nmt's greedy output
    model = tuned / "checkpoint_last.pt"
    mine = Translator.load(model, device="cpu", beam=1, shortlist=False).translate_best(LINES[:40])  # (as generate)
    r = run_nmt("export", "huggingface", str(model), "-o", str(tmp_path / "hf"))
    assert r.returncode == 0, r.stderr
    from transformers import MarianMTModel, MarianTokenizer

    theirs = _generate(MarianTokenizer.from_pretrained(str(tmp_path / "hf")),
                       MarianMTModel.from_pretrained(str(tmp_path / "hf")).eval(), LINES[:40], 1)
    assert sum(a == b for a, b in zip(mine, theirs, strict=True)) >= 39
    r = run_nmt("export", "ctranslate2", str(model), "-o", str(tmp_path / "ct2"))
    assert r.returncode == 0, r.stderr


def test_init_from_refuses_resume_architecture_options_and_another_vocabulary(folder, toy_data_dir, tmp_path):
    r = run_nmt("train", str(toy_data_dir), "-o", str(tmp_path / "r"), "--init-from", str(folder), "--resume")
    assert r.returncode != 0 and "--resume" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    r = run_nmt("train", str(toy_data_dir), "-o", str(tmp_path / "r"), "--init-from", str(folder), "--d-model", "64")
    assert r.returncode != 0 and "--d-model" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    r = run_nmt("train", str(toy_data_dir), "-o", str(tmp_path / "r"), "--init-from", str(folder))
    assert r.returncode != 0 and "--tokenizer-from" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "r").exists()
