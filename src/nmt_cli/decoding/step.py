"""The decoding step: one new position per row of a Transformer, against the decoder cache (cache.py).

The model gives its parts (embedding, positions, each layer's projections, sublayers and feed-forward, the output);
everything that reads the cache's layout is here: the attention over each segment, the positions, the masks.
`step` is the host's part (room in the cache, the lengths) around `static_step`, which reads tensors and bucket-level
ints only, so that `torch.compile(fullgraph=True)` traces it whole and a CUDA graph can capture it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from nmt_cli.decoding.cache import DecoderCache, Segment

# Decoding's attention through F.scaled_dot_product_attention (one fused kernel on a GPU, the mask included)
# instead of five (product, scale, mask, softmax, product): a step of a 6-layer model launches 48 kernels fewer.
# Off until a GPU has measured it (bench/tools/graph_ab.py times both); on CPU it is slower (see `attend`).
SDPA_DECODING = False
_NO_BIAS = torch.zeros(1, 1, 1)  # baddbmm's `input` with beta=0: ignored, but it must broadcast (CPU, float32)


def init_cache(model, memory: Tensor, src_pad_mask: Tensor | None = None, static: bool = False) -> DecoderCache:
    """A decoder cache for memory [N, S, D]: every layer's encoder-decoder keys and values, projected once into one
    [L, 2, N, H, S, K] tensor (float32 on CPU, where decoding attention runs in float32). `static`: the layout for
    compiled steps and CUDA graphs (cache.py)."""
    cross = torch.stack([torch.stack(layer.cross_attn.project_kv(memory)) for layer in model.decoder_layers])
    if memory.device.type == "cpu":
        cross = cross.float()
    return DecoderCache([Segment(cross, src_pad_mask, static)])


def step(model, tokens: Tensor, cache: DecoderCache) -> Tensor:
    """Logits [R, V] of the next token after `tokens` [R] (each row's last token), extending `cache` by one
    position: the host's part around the model's static step (compiled, when `compile_step` asked for it)."""
    cache.make_room(model.config.max_positions)
    logits = model.step_fn(tokens, cache)
    cache.advance()
    return logits


def static_step(model, tokens: Tensor, cache: DecoderCache) -> Tensor:
    """tokens [R] -> logits [R, V], writing the new keys and values into the cache by index (module docstring)."""
    segments = cache.segments
    embedding = model.target_embedding()
    if len(segments) == 1:
        positions = model.positions.index_select(0, segments[0].positions())  # [1, D] or [R, D]
    else:
        positions = torch.cat([model.positions.index_select(0, s.positions()).expand(s.rows, -1) for s in segments])
    x = embedding.forward(tokens) * model.embed_scale + positions.to(embedding.weight.dtype)  # [R, D]
    rows = x.size(0)
    padded = padded_rows(rows, model.row_multiple)
    if padded != rows:  # rows of zeros, so that the products see few shapes
        x = F.pad(x, (0, 0, 0, padded - rows))
    masks = [s.self_mask() for s in segments]
    for i, layer in enumerate(model.decoder_layers):
        # the layer's sublayers (forward() called directly: no module calls, no hooks), with decoding's attention
        x = layer.sub1.forward(x, lambda y: _self_attention(layer.self_attn, y, i, segments, masks))  # noqa: B023
        x = layer.sub2.forward(x, lambda y: _cross_attention(layer.cross_attn, y, i, segments))  # noqa: B023
        x = layer.sub3.forward(x, layer.ffn.forward)
    logits = model.output(model.decoder_norm.forward(x))
    return logits if padded == rows else logits[:rows]


def padded_rows(rows: int, multiple: int) -> int:
    """`rows` rounded up to a multiple of `multiple`, or of rows / 8 rounded down to a power of two where that is
    smaller: at most 1/8 more rows (one sentence's few rows stay as they are), and a few shapes per octave."""
    step = min(multiple, 1 << max(0, rows.bit_length() - 4))
    return -(-rows // step) * step


def _self_attention(attn, x: Tensor, layer: int, segments: list[Segment], masks: list[Tensor | None]) -> Tensor:
    """Self-attention of one new position per row, x [R', D] -> [R', D]: the new keys and values are written into
    each segment's cache at its position (each row into its slot), and every row attends over its sentence's
    window, all slots, those not its ancestor's masked (cache.py). Rows past the segments' (padding) give 0."""
    qkv = attn.qkv_proj.forward(x)  # [R', 3D]
    h, d_k = attn.h, attn.d_k

    def one(i: int, seg: Segment, part: Tensor, out: Tensor) -> None:
        d, n, beams = part.size(1) // 3, seg.sentences, seg.beams
        kv = seg.kv[layer]  # [2, N, H, C, B, K]
        seg.write(layer, part[:, d:].view(n, beams, 2, h, d_k).permute(2, 0, 3, 1, 4).to(kv.dtype))
        w = seg.window  # attention over [N x H] batches of a sentence's [w x B] keys (views of the cache)
        k, v = kv[0, :, :, :w].reshape(n * h, w * beams, d_k), kv[1, :, :, :w].reshape(n * h, w * beams, d_k)
        if beams == 1:  # [N, H, 1, K] is already the rows' layout
            attend(part[:, :d].reshape(n * h, 1, d_k), k, v, masks[i], out.view(n * h, 1, d_k))
            return
        q = part[:, :d].reshape(n, beams, h, d_k).transpose(1, 2).reshape(n * h, beams, d_k)
        out.view(n, beams, h, d_k).copy_(attend(q, k, v, masks[i]).view(n, h, beams, d_k).transpose(1, 2))

    return attn.out_proj.forward(_per_segment(qkv, x, segments, one))


def _cross_attention(attn, x: Tensor, layer: int, segments: list[Segment]) -> Tensor:
    """Encoder-decoder attention of one new position per row, x [R', D] -> [R', D], against each segment's
    per-sentence keys and values (a sentence's beams folded into the query dimension)."""
    h, d_k = attn.h, attn.d_k

    def one(i: int, seg: Segment, q: Tensor, out: Tensor) -> None:
        n, s = seg.sentences, seg.cross.size(4)
        beams, b = q.size(0) // n, n * h
        q = q.view(n, beams, h, d_k).transpose(1, 2).reshape(b, beams, d_k)
        k, v = seg.cross[layer, 0].reshape(b, s, d_k), seg.cross[layer, 1].reshape(b, s, d_k)
        if beams == 1:  # [N, H, 1, K] is already the rows' layout
            attend(q, k, v, seg.pad, out.view(b, 1, d_k))
        else:
            out.view(n, beams, h, d_k).copy_(attend(q, k, v, seg.pad).view(n, h, beams, d_k).transpose(1, 2))

    return attn.out_proj.forward(_per_segment(attn.q_proj.forward(x), x, segments, one))


def _per_segment(inputs: Tensor, x: Tensor, segments: list[Segment], one) -> Tensor:
    """A step's attention, segment by segment: `one(i, segment, its rows of inputs, its rows of the output)` writes
    each segment's rows into one buffer like x [R', D], zero past the segments' rows."""
    out = torch.empty_like(x)
    first = 0
    for i, seg in enumerate(segments):
        one(i, seg, inputs.narrow(0, first, seg.rows), out.narrow(0, first, seg.rows))
        first += seg.rows
    if first < x.size(0):
        out[first:].zero_()
    return out


def attention_weights(q: Tensor, k: Tensor, pad: Tensor | None = None) -> Tensor:
    """softmax(q k^T / sqrt(K)) with padding masked: q [B, Tq, K], k [B, S, K] (unit last stride), pad bool [B, Tq,
    S] or broadcastable, or [N, 1, Tq, S] over B = N x H batches (beam search's slots, cache.py), True = padding ->
    [B, Tq, S] in k's dtype. The scale is baddbmm's alpha on CPU float32 (faster than matmul then mul_ on a step's
    shapes); elsewhere q is scaled before the product, as fairseq, CTranslate2 and SDPA do, so that an fp16 product
    cannot overflow where the scaled one fits. What `attend` uses, and what alignment.py reads."""
    if q.dtype != k.dtype:
        q = q.to(k.dtype)
    if k.dtype == torch.float32 and k.device.type == "cpu":
        scores = torch.baddbmm(_NO_BIAS, q, k.transpose(1, 2), beta=0.0, alpha=q.size(-1) ** -0.5)  # [B, Tq, S]
    else:
        scores = torch.bmm(q * q.size(-1) ** -0.5, k.transpose(1, 2))
    if pad is not None:
        grouped = scores if pad.dim() == 3 else scores.view(pad.size(0), -1, *scores.shape[1:])
        grouped.masked_fill_(pad, float("-inf"))
    return scores.softmax(dim=-1)


def attend(q: Tensor, k: Tensor, v: Tensor, pad: Tensor | None = None, out: Tensor | None = None) -> Tensor:
    """softmax(q k^T / sqrt(K) + mask) v on batches flattened to 3-D (batch x heads), q [B, Tq, K], k/v [B, S, K]
    (strided cache slices used in place), pad as `attention_weights` -> [B, Tq, K] in q's dtype, computed in k's
    (float32 on CPU); written into `out` when given. Not SDPA on CPU: its kernels are built for long queries (for
    Tq ~ 1 the flash kernel's per-block overhead dominates, the math kernel copies q, k, v to float32 first)."""
    if SDPA_DECODING:
        groups = 1 if pad is None or pad.dim() == 3 else pad.size(0)  # [1 or N, B / N, ...] as SDPA's 4-D
        mask = None if pad is None else ~(pad.unsqueeze(0) if pad.dim() == 3 else pad)  # True = attend
        q, k, v = (x.unflatten(0, (groups, -1)) for x in (q, k, v))
        res = F.scaled_dot_product_attention(q.to(k.dtype), k, v, attn_mask=mask).flatten(0, 1)
        if out is not None:
            return out.copy_(res)
        return res if res.dtype == q.dtype else res.to(q.dtype)
    weights = attention_weights(q, k, pad)
    if out is not None and out.dtype == v.dtype and not torch.is_grad_enabled():
        return torch.bmm(weights, v, out=out)
    res = torch.bmm(weights, v)
    if out is not None:
        return out.copy_(res)
    return res if res.dtype == q.dtype else res.to(q.dtype)
