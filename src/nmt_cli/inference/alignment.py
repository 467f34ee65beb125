"""Per-token scores and source-target alignments of finished translations, from one teacher-forced pass.

The search keeps no attention weights; when `--token-scores`,
`--print-alignment` or `--replace-unk` ask for them, the chosen hypotheses go through the model once more,
teacher-forced, and one decoder layer's encoder-decoder attention is read there, averaged over its heads (as
fairseq's `--print-alignment`), with the formula decoding uses (`decoding.attention.attention_weights`). The alignment of target token j is the source token it attends to most when the
model predicts it; the source's EOS is never a link.

Formats (documented in docs/translate.md):
  token scores: the log-probability of each target token, EOS included, space-separated (4 decimals)
  alignment:    Pharaoh `i-j` pairs (source index - target index, 0-based), over words (whitespace-separated, the
                sentencepiece word boundaries) or over sentencepiece pieces
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from nmt_cli.config import BOS_ID, EOS_ID, PAD_ID, UNK_ID
from nmt_cli.decoding.attention import attention_weights


@dataclass
class Analysis:
    """One hypothesis, teacher-forced: log p of each target token (EOS last) and, per target piece, the source
    piece it attends to most (EOS excluded on both sides)."""

    token_scores: list[float]
    links: list[int]  # links[j] = source piece index aligned to target piece j


@torch.inference_mode()
def analyse(model, src: list[list[int]], hyps: list[list[int]], layer: int = -1) -> list[Analysis]:
    """Teacher-force `hyps` (target ids without BOS/EOS) given `src` (source ids with EOS) through `model` (a
    Transformer, or an Ensemble: every member) and read decoder layer `layer`'s encoder-decoder attention. An
    ensemble's token scores are the search's own (the log-softmax of the members' mean log-probabilities, so they
    add up to the hypothesis' log-probability) and its attention the members' mean, as fairseq's."""
    members = getattr(model, "models", [model])
    device = next(members[0].parameters()).device
    n = len(src)
    s_len, t_len = max(len(s) for s in src), max(len(h) for h in hyps) + 1
    src_t = torch.full((n, s_len), PAD_ID, dtype=torch.long)
    tgt_in = torch.full((n, t_len), PAD_ID, dtype=torch.long)
    tgt_out = torch.full((n, t_len), PAD_ID, dtype=torch.long)
    for i, (s, h) in enumerate(zip(src, hyps, strict=True)):
        src_t[i, : len(s)] = torch.tensor(s)
        tgt_in[i, : len(h) + 1] = torch.tensor([BOS_ID, *h])
        tgt_out[i, : len(h) + 1] = torch.tensor([*h, EOS_ID])
    src_t, tgt_in, tgt_out = src_t.to(device), tgt_in.to(device), tgt_out.to(device)
    mask = src_t.eq(PAD_ID)
    forced = [_teacher_forced(m, src_t, tgt_in, mask, layer) for m in members]
    lprobs = forced[0][0] if len(forced) == 1 else F.log_softmax(torch.stack([lp for lp, _ in forced]).mean(0), -1)
    lprobs = lprobs.gather(-1, tgt_out.unsqueeze(-1)).squeeze(-1)  # [B, T]
    attn = torch.stack([a for _, a in forced]).mean(0)
    out = []
    for i, (s, h) in enumerate(zip(src, hyps, strict=True)):
        real = len(s) - 1 if s and s[-1] == EOS_ID else len(s)  # the source's EOS is never a link
        links = attn[i, : len(h), : max(real, 1)].argmax(-1).tolist()
        out.append(Analysis(lprobs[i, : len(h) + 1].tolist(), links))
    return out


def _teacher_forced(model, src: Tensor, tgt_in: Tensor, mask: Tensor, layer: int) -> tuple[Tensor, Tensor]:
    """One Transformer's log-probabilities [B, T, V] (float32) of the next token at every target position, and decoder
    layer `layer`'s encoder-decoder attention averaged over its heads [B, T, S]."""
    captured: dict[str, Tensor] = {}
    attention = model.decoder_layers[layer].cross_attn

    def hook(module, args, kwargs, output):
        x, memory = args[0], kwargs["memory"]
        q = module._split(module.q_proj(x)).float()  # [B, H, T, K]
        k = module.project_kv(memory)[0].float()  # [B, H, S, K]
        b, h, t, d = q.shape
        s = k.size(2)
        pad = mask[:, None, None, :].expand(b, h, 1, s).reshape(b * h, 1, s)
        weights = attention_weights(q.reshape(b * h, t, d), k.reshape(b * h, s, d), pad)  # decoding's own formula
        captured["attn"] = weights.view(b, h, t, s).mean(1)  # [B, T, S]

    handle = attention.register_forward_hook(hook, with_kwargs=True)
    try:
        logits = model(src, tgt_in, mask)
    finally:
        handle.remove()
    return F.log_softmax(logits.float(), dim=-1), captured["attn"]


def word_index(pieces: list[str]) -> list[int]:
    """The word (0-based) of each sentencepiece piece: a piece starting with '▁' starts a word."""
    out, word = [], -1
    for p in pieces:
        if p.startswith("\u2581") or word < 0:
            word += 1
        out.append(word)
    return out


def pharaoh(links: list[int], src_pieces: list[str] | None = None, tgt_pieces: list[str] | None = None) -> str:
    """`i-j` pairs: over pieces when no pieces are given, else over words (each pair once, sorted)."""
    if src_pieces is None or tgt_pieces is None:
        return " ".join(f"{i}-{j}" for j, i in enumerate(links))
    sw, tw = word_index(src_pieces), word_index(tgt_pieces)
    pairs = sorted({(sw[i], tw[j]) for j, i in enumerate(links) if i < len(sw)}, key=lambda p: (p[1], p[0]))
    return " ".join(f"{i}-{j}" for i, j in pairs)


def replace_unk(tgt_ids: list[int], tgt_pieces: list[str], links: list[int], src_pieces: list[str],
                src_words: list[str]) -> str | None:
    """The detokenized target with every unknown-token piece replaced by the source word it is aligned to; None
    when the target holds no unknown token (decode it as usual)."""
    if UNK_ID not in tgt_ids:
        return None
    sw = word_index(src_pieces)
    parts = []
    for j, (tid, piece) in enumerate(zip(tgt_ids, tgt_pieces, strict=True)):
        if tid == UNK_ID and j < len(links) and links[j] < len(sw) and sw[links[j]] < len(src_words):
            parts.append(src_words[sw[links[j]]])
        else:
            parts.append(piece)
    return " ".join("".join(parts).replace("\u2581", " ").split())
