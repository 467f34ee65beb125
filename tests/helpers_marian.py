"""A tiny OPUS-MT-like MarianMT model, made with `transformers` itself: real source and target sentencepiece
models (different ones), a vocab.json numbering both as MarianTokenizer expects (</s> 0, <unk> 1, ..., <pad> last),
swish, a non-zero final_logits_bias, trained for a few seconds on the toy pairs so that it ends its sentences.
Saved with save_pretrained, so its folder is what a hub download of an OPUS-MT repository holds."""

from __future__ import annotations

import io
import json
from pathlib import Path

import sentencepiece as spm
import torch

from conftest import toy_pairs

_MADE: dict[tuple, Path] = {}


def _spm(lines: list[str], size: int) -> bytes:
    out = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(lines), model_writer=out, vocab_size=size,
                                   model_type="unigram", character_coverage=1.0, minloglevel=2,
                                   hard_vocab_limit=False)
    return out.getvalue()


def make_marian(folder: Path, steps: int = 200, seed: int = 0, languages: tuple[str, ...] = (), **config) -> Path:
    """The model folder (cached per settings for the test session). `languages`: a multi-target model's `>>xx<<`
    tags in the vocabulary (as opus-mt-en-mul's), which MarianTokenizer reads at the start of a source line."""
    key = (steps, seed, languages, tuple(sorted(config.items())))
    if key in _MADE and _MADE[key].exists():
        return _MADE[key]
    from transformers import MarianConfig, MarianMTModel, MarianTokenizer

    folder.mkdir(parents=True, exist_ok=True)
    pairs = toy_pairs(600, seed=7)
    source, target = _spm([p[0] for p in pairs], 40), _spm([p[1] for p in pairs], 60)
    (folder / "source.spm").write_bytes(source)
    (folder / "target.spm").write_bytes(target)
    pieces: list[str] = ["</s>", "<unk>"]
    for model in (source, target):
        sp = spm.SentencePieceProcessor()
        sp.LoadFromSerializedProto(model)
        pieces += [p for p in (sp.id_to_piece(i) for i in range(sp.get_piece_size()))
                   if p not in pieces and not (p.startswith("<") and p.endswith(">"))]
    pieces += [f">>{code}<<" for code in languages]
    pieces.append("<pad>")
    vocab = {p: i for i, p in enumerate(pieces)}
    (folder / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False), encoding="utf-8")
    tokenizer = MarianTokenizer(str(folder / "source.spm"), str(folder / "target.spm"), str(folder / "vocab.json"),
                                source_lang="en", target_lang="de")
    pad, eos = vocab["<pad>"], vocab["</s>"]
    options = dict(vocab_size=len(vocab), decoder_vocab_size=len(vocab), d_model=32, encoder_layers=2,
                   decoder_layers=2, encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64,
                   decoder_ffn_dim=64, activation_function="swish", max_position_embeddings=128, dropout=0.0,
                   pad_token_id=pad, eos_token_id=eos, decoder_start_token_id=pad, forced_eos_token_id=None,
                   scale_embedding=True, share_encoder_decoder_embeddings=True)
    options.update(config)
    torch.manual_seed(seed)
    model = MarianMTModel(MarianConfig(**options))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        opt = torch.optim.Adam(model.parameters(), lr=5e-3)
        rng = torch.Generator().manual_seed(seed)
        model.train()
        for _ in range(steps):
            idx = torch.randint(0, len(pairs), (32,), generator=rng).tolist()
            batch = tokenizer([pairs[i][0] for i in idx], text_target=[pairs[i][1] for i in idx], padding=True,
                              return_tensors="pt")
            batch["labels"][batch["labels"] == pad] = -100
            loss = model(**batch).loss
            opt.zero_grad()
            loss.backward()
            opt.step()
    finally:
        torch.set_num_threads(threads)
    with torch.no_grad():  # a fixed bias, as OPUS-MT's (mostly zero there; here non-zero to be checked)
        model.final_logits_bias.copy_(torch.randn(model.final_logits_bias.shape, generator=rng) * 0.1)
    model.eval().save_pretrained(str(folder))
    tokenizer.save_pretrained(str(folder))
    _MADE[key] = folder
    return folder


def folder_files(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()}
