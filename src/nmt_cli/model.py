"""The Transformer of "Attention Is All You Need" (Vaswani et al., 2017), batch-first.

Shapes: B batch, S source length, T target length, D d_model, H heads, K d_k = D / H, V vocabulary.
Masks: `src_pad_mask` is a bool tensor [B, S], True at padding (as PyTorch's key_padding_mask).
Post-LN by default, `LayerNorm(x + Dropout(Sublayer(x)))`; `norm_first=True` gives pre-LN with a final norm.

`encode()` and `decode()` are separate public methods; `decode()` with a `DecoderCache` runs incrementally:
the self-attention keys/values grow by one position a step, the encoder-decoder keys/values are computed once
in `init_cache()`, and `cache.reorder(index)` follows beam search (or drops finished sentences). One new position
per row on CPU in eval mode takes `DecoderLayer.step`: the same arithmetic on [R, D] rows, without module calls.
`cache.join(other)` returns a `JoinedCache`: several batches' caches decoded as one batch (continuous batching in
`search.beam_search_batches`), each part with its own positions, source and self-attention.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from nmt_cli.config import ModelConfig


def sinusoidal_positions(n_positions: int, d_model: int) -> Tensor:
    """PE(pos, 2i) = sin(pos / 10000^(2i/d)), PE(pos, 2i+1) = cos(pos / 10000^(2i/d)).  -> [n_positions, D]"""
    pos = torch.arange(n_positions, dtype=torch.float64).unsqueeze(1)  # [P, 1]
    two_i = torch.arange(0, d_model, 2, dtype=torch.float64)  # [D/2]
    angle = pos / torch.pow(10000.0, two_i / d_model)  # [P, D/2]
    pe = torch.zeros(n_positions, d_model, dtype=torch.float64)
    pe[:, 0::2] = torch.sin(angle)
    pe[:, 1::2] = torch.cos(angle[:, : d_model // 2])
    return pe.float()


class LayerCache:
    """Keys/values of one decoder layer for incremental decoding.

    Self-attention: keys and values in one tensor `kv` [2, R, H, extent, K] of which positions [0, length) are
    filled, a view of one of two flat buffers (no allocation per step). A step writes its new positions in place. A
    reorder (every beam search step) gathers the filled positions into the other buffer, laid out with room for
    exactly one more position: after the next step's write the keys and values are contiguous, and attention over
    them runs up to 2x faster on CPU than over a slice of a larger buffer. A write that finds no room (greedy
    search, several positions at once) lays the cache out again with room for twice its length.
    Encoder-decoder: `cross_k`/`cross_v` [N, H, S, K] are stored once per sentence and shared by its `beams`
    consecutive rows (R = N x beams, sentence-major); cross-attention folds the beams into the query dimension.
    """

    def __init__(self, cross_k: Tensor, cross_v: Tensor, beams: int = 1):
        self.cross_k, self.cross_v = cross_k, cross_v  # [N, H, S, K]
        self.beams = beams
        self.kv: Tensor | None = None  # [2, R, H, extent, K], a view of one of `_flat`
        self.length = 0
        self._flat: list[Tensor | None] = [None, None]  # the two backing buffers, 1-D
        self._in_use = 0  # which of them backs `kv`

    @property
    def self_k(self) -> Tensor | None:  # [R, H, length, K]
        return None if self.kv is None else self.kv[0, :, :, : self.length]

    @property
    def self_v(self) -> Tensor | None:  # [R, H, length, K]
        return None if self.kv is None else self.kv[1, :, :, : self.length]

    def _spare_layout(self, rows: int, heads: int, extent: int, d_k: int) -> Tensor:
        """A [2, rows, heads, extent, K] view of the buffer not backing `kv` (grown when too small); the caller
        fills it and makes it `kv`."""
        self._in_use = spare = 1 - self._in_use
        need = 2 * rows * heads * extent * d_k
        # grown when too small; smaller again when 4x too large (rows left: a joined batch's long-lived last rows
        # would otherwise keep its first steps' memory)
        if self._flat[spare] is None or not need <= self._flat[spare].numel() <= 4 * need + 4096:
            self._flat[spare] = self.cross_k.new_empty(need + need // 4)  # room to grow a few steps
        return self._flat[spare][:need].view(2, rows, heads, extent, d_k)

    def append(self, kv: Tensor) -> tuple[Tensor, Tensor]:
        """Write new keys and values kv [2, R, H, T, K] after the cached ones -> all keys, values [R, H, length, K]."""
        _, rows, heads, new, d_k = kv.shape
        end = self.length + new
        if self.kv is None or end > self.kv.size(3):  # first step, or full: lay out again with room to grow
            grown = self._spare_layout(rows, heads, max(16, 2 * end), d_k)
            if self.kv is not None:
                grown[:, :, :, : self.length] = self.kv[:, :, :, : self.length]
            self.kv = grown
        self.kv.narrow(3, self.length, new).copy_(kv)
        self.length = end
        return self.self_k, self.self_v

    def reorder_self(self, index: Tensor) -> None:
        """Keep self-attention rows `index` [R'], gathered into the spare buffer with room for one more position."""
        if self.kv is None:
            return
        _, _, heads, _, d_k = self.kv.shape
        target = self._spare_layout(index.numel(), heads, self.length + 1, d_k)
        filled, out = self.kv[:, :, :, : self.length], target[:, :, :, : self.length]
        if filled.requires_grad:  # (autograd does not support out=)
            out.copy_(filled.index_select(1, index))
        else:
            torch.index_select(filled, 1, index, out=out)
        self.kv = target


@dataclass
class DecoderCache:
    """Incremental-decoding state for the whole decoder stack.

    `beams` rows per sentence share the encoder-decoder keys/values and `src_pad_mask` ([N, S], one per sentence);
    the decoder batch has N x beams rows, sentence-major. `repeat_beams(k)` makes each row k rows (beam search).
    """

    layers: list[LayerCache]
    src_pad_mask: Tensor | None  # [N, S] True at padding, or None when nothing is padded
    length: int = 0  # target positions already decoded
    beams: int = 1  # decoder rows per sentence
    _head_pad: tuple | None = field(default=None, repr=False)  # (src_pad_mask, its [N x H, 1, S] form)

    def head_pad(self, heads: int) -> Tensor | None:
        """`src_pad_mask` as [N x heads, 1, S] (True at padding) for attention_3d, built again only when it changes."""
        mask = self.src_pad_mask
        if mask is None:
            return None
        if self._head_pad is None or self._head_pad[0] is not mask:
            self._head_pad = (mask, mask.repeat_interleave(heads, 0).unsqueeze(1))
        return self._head_pad[1]

    def repeat_beams(self, k: int) -> None:
        """Each row becomes k consecutive rows (same sentence): only the self-attention cache is copied."""
        if k == 1:
            return
        rows = self._rows()
        index = None if rows is None else torch.arange(rows, device=self.layers[0].cross_k.device)
        for layer in self.layers:
            if layer.kv is not None:
                layer.reorder_self(index.repeat_interleave(k))
            layer.beams *= k
        self.beams *= k

    def _rows(self) -> int | None:
        kv = self.layers[0].kv if self.layers else None
        return None if kv is None else kv.size(1)

    def reorder_beams(self, index: Tensor) -> None:
        """Like `reorder` when every new row keeps the sentence of its old row (only beams move)."""
        for layer in self.layers:
            layer.reorder_self(index)

    def reorder(self, index: Tensor) -> None:
        """Keep rows `index` ([R'] long, may repeat or drop rows): follows beams, removes finished sentences."""
        sentences = self._sentences(index)
        if sentences is None:  # rows of one sentence no longer come in groups: one cross k/v copy per row
            self._unfold()
            sentences = index
        for layer in self.layers:
            layer.reorder_self(index)
            if not (sentences.numel() == layer.cross_k.size(0) and _is_arange(sentences)):
                layer.cross_k = layer.cross_k.index_select(0, sentences)
                layer.cross_v = layer.cross_v.index_select(0, sentences)
        if self.src_pad_mask is not None:
            self.src_pad_mask = self.src_pad_mask.index_select(0, sentences)

    def rows(self) -> int:
        """Decoder rows (sentences x beams)."""
        return self.layers[0].cross_k.size(0) * self.beams if self.layers else 0

    def join(self, other: DecoderCache) -> JoinedCache:
        """This cache's rows, then `other`'s, decoded as one batch (continuous batching; see JoinedCache)."""
        return JoinedCache([self, other])

    def _sentences(self, index: Tensor) -> Tensor | None:
        """The sentence of each group of `beams` new rows [R' / beams], or None when the groups mix sentences."""
        if self.beams == 1:
            return index
        if index.numel() % self.beams:
            return None
        groups = torch.div(index, self.beams, rounding_mode="floor").view(-1, self.beams)
        return groups[:, 0] if bool((groups == groups[:, :1]).all()) else None

    def _unfold(self) -> None:
        """Give every row its own copy of the encoder-decoder keys/values (beams = 1)."""
        for layer in self.layers:
            layer.cross_k = layer.cross_k.repeat_interleave(self.beams, 0)
            layer.cross_v = layer.cross_v.repeat_interleave(self.beams, 0)
            layer.beams = 1
        if self.src_pad_mask is not None:
            self.src_pad_mask = self.src_pad_mask.repeat_interleave(self.beams, 0)
        self.beams = 1


class JoinedCache:
    """The caches of several batches decoded as one (continuous batching: a batch joins a running one's tail).

    Rows are the first part's, then the next part's, and so on. Each part keeps its own length (positions),
    encoder output and self-attention layout, so attention runs per part over exactly its own positions; every
    other operation of a step (the projections, the feed-forward layers, the output layer, the search) runs once
    over all rows. A part leaves when its last row does.
    """

    def __init__(self, parts: list[DecoderCache]):
        self.parts = parts

    def join(self, other: DecoderCache) -> JoinedCache:
        self.parts.append(other)
        return self

    def _split(self, index: Tensor) -> list[Tensor]:
        """index [R'] (new rows of the old batch, parts in order) -> per part, its local row index."""
        sizes = [p.rows() for p in self.parts]
        ends = torch.tensor(sizes, device=index.device).cumsum(0)
        counts = (index.unsqueeze(1) < ends).sum(0).tolist()  # rows kept up to the end of each part
        begin = [0] + counts[:-1]
        offsets = [0] + ends.tolist()[:-1]
        return [index[b:e] - o for b, e, o in zip(begin, counts, offsets, strict=True)]

    def _reorder(self, index: Tensor, beams_only: bool) -> None:
        kept = []
        for part, local in zip(self.parts, self._split(index), strict=True):
            if local.numel():
                part.reorder_beams(local) if beams_only else part.reorder(local)
                kept.append(part)
        self.parts = kept

    def reorder_beams(self, index: Tensor) -> None:
        self._reorder(index, beams_only=True)

    def reorder(self, index: Tensor) -> None:
        self._reorder(index, beams_only=False)


def _is_arange(index: Tensor) -> bool:
    """index == [0, 1, ..., n-1] (the reorder keeps every sentence in place)."""
    n = index.numel()
    return n == 0 or (int(index[-1]) == n - 1 and bool((index[1:] > index[:-1]).all()))


def decode_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None) -> Tensor:
    """softmax(q k^T / sqrt(K) + mask) v for the few query positions of an incremental decoding step, in the
    dtype of the cached k/v (float32 on CPU, whatever the model's precision).

    q [B, H, Tq, K], k/v [B, H, S, K] (any strides with a unit last dimension: the cache's slices are used in
    place), mask bool broadcastable to [B, H, Tq, S], True = may attend -> [B, H, Tq, K] in q's dtype.
    scaled_dot_product_attention's CPU kernels are built for long queries: for Tq ~ 1 the flash kernel spends a
    third of decoding time in per-block overhead and the math kernel copies q, k and v to float32 first; and the
    CPU's bf16 batched products over strided cache slices are 2-3x slower than float32 ones (measured on a
    2-core AVX512-BF16 CPU; docs/results.md has the end-to-end effect).
    """
    b, h, tq, d = q.shape
    s = k.size(2)
    pad = None if mask is None else (~mask).expand(b, h, tq, s).reshape(b * h, tq, s)
    out = attention_3d(q.reshape(b * h, tq, d), k.reshape(b * h, s, d), v.reshape(b * h, s, d), pad)
    return out.view(b, h, tq, d)


def attention_3d(q: Tensor, k: Tensor, v: Tensor, pad: Tensor | None = None) -> Tensor:
    """decode_attention on batches already flattened to 3-D (what DecoderLayer.step calls directly):
    q [B, Tq, K], k/v [B, S, K] (unit last stride), pad bool [B, Tq, S] or broadcastable, True = padding ->
    [B, Tq, K] in q's dtype, computed in k's. The scale is baddbmm's alpha (bitwise what scaling the product
    afterwards gives; measured 1.1-1.7x faster than matmul then mul_ on the step's shapes)."""
    dtype = q.dtype
    if dtype != k.dtype:
        q = q.to(k.dtype)
    if k.dtype == torch.float32 and k.device.type == "cpu":
        scores = torch.baddbmm(_NO_BIAS, q, k.transpose(1, 2), beta=0.0, alpha=q.size(-1) ** -0.5)  # [B, Tq, S]
    else:
        scores = torch.bmm(q, k.transpose(1, 2)).mul_(q.size(-1) ** -0.5)
    if pad is not None:
        scores.masked_fill_(pad, float("-inf"))
    out = torch.bmm(scores.softmax(dim=-1), v)
    return out if out.dtype == dtype else out.to(dtype)


_NO_BIAS = torch.zeros(1, 1, 1)  # baddbmm's `input` with beta=0: ignored, but it must broadcast (CPU, float32)


def avoid_cudnn_attention() -> None:
    """Keep `scaled_dot_product_attention` on CUDA off its cuDNN backend (process-wide; flash and memory-efficient
    attention remain). cuDNN builds an execution plan for every new (batch, length) shape, and nmt's shapes change
    every batch (training) and every step (decoding): measured on an H200 with torch 2.11, `base` updates of 3125
    tokens took 250-520 ms instead of 74 ms, and bf16 decoding ran 2-3x slower than fp32."""
    if hasattr(torch.backends.cuda, "enable_cudnn_sdp"):
        torch.backends.cuda.enable_cudnn_sdp(False)


def _attn_mask(pad_mask: Tensor | None) -> Tensor | None:
    """[B, S] True-at-padding -> [B, 1, 1, S] True-where-attending, as scaled_dot_product_attention wants."""
    return None if pad_mask is None else ~pad_mask[:, None, None, :]


class MultiHeadAttention(nn.Module):
    """Multi-head scaled dot-product attention through F.scaled_dot_product_attention.

    Self-attention uses one fused [D, 3D] input projection; encoder-decoder attention a [D, D] query and a
    fused [D, 2D] key/value projection (the memory is projected once per sentence when decoding).
    """

    def __init__(self, d_model: int, n_heads: int, attention_dropout: float, self_attention: bool):
        super().__init__()
        self.h, self.d_k = n_heads, d_model // n_heads
        self.self_attention = self_attention
        self.dropout = attention_dropout
        if self_attention:
            self.qkv_proj = nn.Linear(d_model, 3 * d_model)
        else:
            self.q_proj = nn.Linear(d_model, d_model)
            self.kv_proj = nn.Linear(d_model, 2 * d_model)
        self.out_proj = nn.Linear(d_model, d_model)

    def _split(self, x: Tensor) -> Tensor:  # [B, T, D] -> [B, H, T, K]
        b, t, _ = x.shape
        return x.view(b, t, self.h, self.d_k).transpose(1, 2)

    def project_kv(self, memory: Tensor) -> tuple[Tensor, Tensor]:
        """Encoder-decoder keys and values of `memory` [B, S, D] -> 2 x [B, H, S, K]."""
        k, v = self.kv_proj(memory).chunk(2, dim=-1)
        return self._split(k), self._split(v)

    def forward(
        self,
        x: Tensor,  # [B, T, D] queries (and keys/values for self-attention)
        mask: Tensor | None = None,  # bool, broadcastable to [B, H, T, T'], True = may attend
        is_causal: bool = False,
        memory: Tensor | None = None,  # [B, S, D] for encoder-decoder attention without a cache
        cache: LayerCache | None = None,
    ) -> Tensor:
        if self.self_attention:
            qkv = self.qkv_proj(x)  # [B, T, 3D]
            if cache is not None:
                b, t, d = x.shape
                q = self._split(qkv[..., :d])
                k, v = cache.append(qkv[..., d:].view(b, t, 2, self.h, self.d_k).permute(2, 0, 3, 1, 4))  # (k, v)
                # New queries are the latest positions: they may see every cached key, and among the new
                # ones only earlier positions (a causal mask aligned to the bottom-right).
                if q.size(2) > 1:
                    t_new, t_all = q.size(2), k.size(2)
                    mask = torch.ones(t_new, t_all, dtype=torch.bool, device=x.device).tril(t_all - t_new)
                if x.device.type == "cpu":  # (as init_cache: float32 caches on CPU)
                    out = decode_attention(q, k, v, mask)  # [B, H, T, K]
                    b, _, t, _ = out.shape
                    return self.out_proj(out.transpose(1, 2).reshape(b, t, self.h * self.d_k))
                is_causal = False
            else:
                q, k, v = (self._split(y) for y in qkv.chunk(3, dim=-1))  # [B, H, T, K] each
        elif cache is not None:
            return self._cross_cached(x, mask, cache)
        else:
            q = self._split(self.q_proj(x))
            k, v = self.project_kv(memory)
        out = F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, dropout_p=self.dropout if self.training else 0.0, is_causal=is_causal
        )  # [B, H, T, K]
        b, _, t, _ = out.shape
        return self.out_proj(out.transpose(1, 2).reshape(b, t, self.h * self.d_k))

    def _cross_cached(self, x: Tensor, mask: Tensor | None, cache: LayerCache) -> Tensor:
        """Encoder-decoder attention of rows x [N*beams, T, D] against per-sentence keys/values [N, H, S, K]:
        the beams of a sentence are folded into its query dimension ([N, H, beams*T, K])."""
        rows, t, d = x.shape
        n = cache.cross_k.size(0)
        q = self.q_proj(x).view(n, rows // n * t, self.h, self.d_k).transpose(1, 2)  # [N, H, beams*T, K]
        if x.device.type == "cpu":  # mask [N, 1, 1, S]
            out = decode_attention(q, cache.cross_k, cache.cross_v, mask)
        else:
            out = F.scaled_dot_product_attention(q, cache.cross_k, cache.cross_v, attn_mask=mask)
        return self.out_proj(out.transpose(1, 2).reshape(rows, t, d))

    def step_self(self, x: Tensor, caches: list[LayerCache], sizes: list[int]) -> Tensor:
        """Self-attention of one new position per row, x [R, D] -> [R, D], on CPU (see DecoderLayer.step); the rows
        are `sizes` rows per cache, in order (one cache but in continuous batching)."""
        qkv = self.qkv_proj.forward(x)  # [R, 3D]
        if len(caches) == 1:
            out = self._attend_self(qkv, caches[0])
        else:
            out = torch.cat([self._attend_self(part, c) for part, c in zip(qkv.split(sizes), caches, strict=True)])
        return self.out_proj.forward(out)

    def _attend_self(self, qkv: Tensor, cache: LayerCache) -> Tensor:
        rows, d = qkv.size(0), qkv.size(1) // 3
        k, v = cache.append(qkv[:, d:].view(rows, 2, self.h, 1, self.d_k).transpose(0, 1))  # [R, H, length, K]
        b, t = rows * self.h, k.size(2)  # attention over [R x H] batches (views of the cache)
        q = qkv[:, :d].reshape(b, 1, self.d_k)
        return attention_3d(q, k.reshape(b, t, self.d_k), v.reshape(b, t, self.d_k)).view(rows, d)  # [R, D]

    def step_cross(self, x: Tensor, caches: list[LayerCache], pads: list[Tensor | None], sizes: list[int]) -> Tensor:
        """Encoder-decoder attention of one new position per row, x [R, D] -> [R, D], on CPU; pads [N x H, 1, S]
        True at padding (DecoderCache.head_pad), one per cache, as in step_self."""
        q = self.q_proj.forward(x)
        if len(caches) == 1:
            out = self._attend_cross(q, caches[0], pads[0])
        else:
            out = torch.cat([self._attend_cross(part, c, pad)
                             for part, c, pad in zip(q.split(sizes), caches, pads, strict=True)])
        return self.out_proj.forward(out)

    def _attend_cross(self, q: Tensor, cache: LayerCache, pad: Tensor | None) -> Tensor:
        rows, d = q.shape
        n, _, s, _ = cache.cross_k.shape
        beams, b = rows // n, n * self.h
        q = q.view(n, beams, self.h, self.d_k).transpose(1, 2).reshape(b, beams, self.d_k)
        out = attention_3d(q, cache.cross_k.reshape(b, s, self.d_k), cache.cross_v.reshape(b, s, self.d_k), pad)
        return out.view(n, self.h, beams, self.d_k).transpose(1, 2).reshape(rows, d)


class FeedForward(nn.Module):
    """FFN(x) = max(0, x W1 + b1) W2 + b2."""

    def __init__(self, d_model: int, d_ff: int, activation_dropout: float):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(d_model, d_ff), nn.Linear(d_ff, d_model)
        self.activation: nn.Module = nn.ReLU()  # int8.py fuses it into fc1 and makes this an Identity
        self.dropout = nn.Dropout(activation_dropout)

    def forward(self, x: Tensor) -> Tensor:
        return self.fc2(self.dropout(self.activation(self.fc1(x))))

    def step(self, x: Tensor) -> Tensor:  # forward() in eval mode, without module calls
        return self.fc2.forward(self.activation.forward(self.fc1.forward(x)))


class Sublayer(nn.Module):
    """Residual connection around `fn` with dropout and LayerNorm, post-LN or pre-LN."""

    def __init__(self, d_model: int, dropout: float, norm_first: bool, eps: float):
        super().__init__()
        self.norm = nn.LayerNorm(d_model, eps=eps)
        self.dropout = nn.Dropout(dropout)
        self.norm_first = norm_first

    def forward(self, x: Tensor, fn) -> Tensor:
        if self.norm_first:
            return x + self.dropout(fn(self.norm(x)))
        return self.norm(x + self.dropout(fn(x)))

    def step(self, x: Tensor, fn) -> Tensor:  # forward() in eval mode, without module calls
        norm = self.norm
        if self.norm_first:
            return x + fn(torch.layer_norm(x, norm.normalized_shape, norm.weight, norm.bias, norm.eps))
        return torch.layer_norm(x + fn(x), norm.normalized_shape, norm.weight, norm.bias, norm.eps)


class EncoderLayer(nn.Module):
    def __init__(self, c: ModelConfig):
        super().__init__()
        self.self_attn = MultiHeadAttention(c.d_model, c.n_heads, c.attention_dropout, self_attention=True)
        self.ffn = FeedForward(c.d_model, c.d_ff, c.activation_dropout)
        self.sub1 = Sublayer(c.d_model, c.dropout, c.norm_first, c.layer_norm_eps)
        self.sub2 = Sublayer(c.d_model, c.dropout, c.norm_first, c.layer_norm_eps)

    def forward(self, x: Tensor, mask: Tensor | None) -> Tensor:  # x [B, S, D]
        x = self.sub1(x, lambda y: self.self_attn(y, mask=mask))
        return self.sub2(x, self.ffn)


class DecoderLayer(nn.Module):
    def __init__(self, c: ModelConfig):
        super().__init__()
        self.self_attn = MultiHeadAttention(c.d_model, c.n_heads, c.attention_dropout, self_attention=True)
        self.cross_attn = MultiHeadAttention(c.d_model, c.n_heads, c.attention_dropout, self_attention=False)
        self.ffn = FeedForward(c.d_model, c.d_ff, c.activation_dropout)
        self.sub1 = Sublayer(c.d_model, c.dropout, c.norm_first, c.layer_norm_eps)
        self.sub2 = Sublayer(c.d_model, c.dropout, c.norm_first, c.layer_norm_eps)
        self.sub3 = Sublayer(c.d_model, c.dropout, c.norm_first, c.layer_norm_eps)

    def forward(
        self, x: Tensor, memory: Tensor | None, memory_mask: Tensor | None, cache: LayerCache | None
    ) -> Tensor:  # x [B, T, D]
        x = self.sub1(x, lambda y: self.self_attn(y, is_causal=cache is None, cache=cache))
        x = self.sub2(x, lambda y: self.cross_attn(y, mask=memory_mask, memory=memory, cache=cache))
        return self.sub3(x, self.ffn)

    def step(self, x: Tensor, caches: list[LayerCache], pads: list[Tensor | None], sizes: list[int]) -> Tensor:
        """forward() for one new position per row, x [R, D] -> [R, D], in eval mode on CPU: the same arithmetic
        with 2-D rows, no module calls and no dropout. A step of a small model is ~100 small tensor operations
        whose Python cost rivals their arithmetic; this path makes CPU translation ~5% faster (docs/results.md).
        (It calls the submodules' `forward` directly, so forward hooks on them do not run here.)"""
        x = self.sub1.step(x, lambda y: self.self_attn.step_self(y, caches, sizes))
        x = self.sub2.step(x, lambda y: self.cross_attn.step_cross(y, caches, pads, sizes))
        return self.sub3.step(x, self.ffn.step)


class Transformer(nn.Module):
    """Encoder-decoder Transformer with one embedding matrix shared by source, target and output projection."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        c = self.config = config.validate()
        self.embed = nn.Embedding(c.vocab_size, c.d_model, padding_idx=c.pad_id)
        if not c.share_embeddings:
            self.tgt_embed = nn.Embedding(c.vocab_size, c.d_model, padding_idx=c.pad_id)
            self.out_proj = nn.Linear(c.d_model, c.vocab_size, bias=False)
        self.register_buffer("positions", sinusoidal_positions(c.max_positions, c.d_model), persistent=False)
        self.embed_scale = math.sqrt(c.d_model)
        self.dropout = nn.Dropout(c.dropout)
        self.encoder_layers = nn.ModuleList(EncoderLayer(c) for _ in range(c.encoder_layers))
        self.decoder_layers = nn.ModuleList(DecoderLayer(c) for _ in range(c.decoder_layers))
        self.encoder_norm = nn.LayerNorm(c.d_model, eps=c.layer_norm_eps) if c.norm_first else nn.Identity()
        self.decoder_norm = nn.LayerNorm(c.d_model, eps=c.layer_norm_eps) if c.norm_first else nn.Identity()
        self.output_layer: nn.Module | None = None  # replaces the output projection (int8.py); None: the weights
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Xavier-uniform projections with zero biases; embeddings N(0, d_model^-0.5) (as fairseq/tensor2tensor)."""
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.xavier_uniform_(module.weight)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
        for emb in (self.embed, getattr(self, "tgt_embed", None)):
            if emb is not None:
                nn.init.normal_(emb.weight, mean=0.0, std=self.config.d_model**-0.5)
                with torch.no_grad():
                    emb.weight[self.config.pad_id].zero_()

    def _embed(self, tokens: Tensor, embedding: nn.Embedding, offset: int = 0) -> Tensor:
        """tokens [B, T] -> dropout(sqrt(D) * E[tokens] + PE[offset : offset + T])  [B, T, D]"""
        t = tokens.size(1)
        if offset + t > self.config.max_positions:
            raise ValueError(f"sequence of {offset + t} tokens exceeds max_positions {self.config.max_positions}")
        x = embedding(tokens) * self.embed_scale + self.positions[offset : offset + t].to(embedding.weight.dtype)
        return self.dropout(x)

    def encode(self, src: Tensor, src_pad_mask: Tensor | None = None) -> Tensor:
        """src [B, S] token ids, src_pad_mask [B, S] True at padding -> memory [B, S, D]."""
        mask = _attn_mask(src_pad_mask)
        x = self._embed(src, self.embed)
        for layer in self.encoder_layers:
            x = layer(x, mask)
        return self.encoder_norm(x)

    def init_cache(self, memory: Tensor, src_pad_mask: Tensor | None = None) -> DecoderCache:
        """Project the encoder output once per layer for incremental decoding. memory [B, S, D]."""
        layers = []
        for layer in self.decoder_layers:
            k, v = layer.cross_attn.project_kv(memory)  # (slices of one projection)
            if memory.device.type == "cpu":  # attention over the cache runs in float32 there (decode_attention)
                k, v = k.float(), v.float()
            # contiguous once here, or every step's batched product over [N x H] copies them
            layers.append(LayerCache(k.contiguous(), v.contiguous()))
        return DecoderCache(layers, src_pad_mask, 0)

    def decode(
        self,
        tgt: Tensor,
        memory: Tensor | None = None,
        src_pad_mask: Tensor | None = None,
        cache: DecoderCache | None = None,
    ) -> Tensor:
        """Next-token logits [B, T, V] for target prefix tokens `tgt` [B, T] (starting with BOS).

        Without a cache, `tgt` is the whole prefix and `memory` [B, S, D] the encoder output (causal masking).
        With a cache from `init_cache()`, `tgt` holds only the new positions and the cache is extended.
        """
        target_embed = getattr(self, "tgt_embed", self.embed)
        if cache is not None and tgt.size(1) == 1 and tgt.device.type == "cpu" and not self.training:
            return self._step(tgt[:, 0], target_embed, cache).unsqueeze(1)
        offset = cache.length if cache is not None else 0
        x = self._embed(tgt, target_embed, offset)
        mask = _attn_mask(cache.src_pad_mask if cache is not None else src_pad_mask)
        for i, layer in enumerate(self.decoder_layers):
            x = layer(x, memory, mask, cache.layers[i] if cache is not None else None)
        if cache is not None:
            cache.length += tgt.size(1)
        return self._output(self.decoder_norm(x))  # [B, T, V]

    def _step(self, tokens: Tensor, target_embed: nn.Embedding, cache: DecoderCache | JoinedCache) -> Tensor:
        """decode() of one new position per row on CPU in eval mode (DecoderLayer.step): tokens [R] -> logits [R, V].
        With a JoinedCache each part's rows take their positions from its own length."""
        parts = cache.parts if isinstance(cache, JoinedCache) else [cache]
        if len(parts) == 1:
            sizes = [tokens.size(0)]
            x = self._embed(tokens.unsqueeze(1), target_embed, parts[0].length)[:, 0]  # [R, D]
        else:
            sizes = [p.rows() for p in parts]
            positions = torch.cat([self.positions[p.length].expand(n, -1) for p, n in zip(parts, sizes, strict=True)])
            x = target_embed(tokens) * self.embed_scale + positions.to(target_embed.weight.dtype)  # [R, D]
        pads = [p.head_pad(self.config.n_heads) for p in parts]
        for i, layer in enumerate(self.decoder_layers):
            x = layer.step(x, [p.layers[i] for p in parts], pads, sizes)
        for p in parts:
            p.length += 1
        return self._output(self.decoder_norm.forward(x))

    def _output(self, x: Tensor) -> Tensor:
        """The output projection: [..., D] -> logits [..., V]."""
        if self.output_layer is not None:
            return self.output_layer.forward(x)
        weight = self.out_proj.weight if hasattr(self, "out_proj") else self.embed.weight
        return F.linear(x, weight)

    def forward(self, src: Tensor, tgt: Tensor, src_pad_mask: Tensor | None = None) -> Tensor:
        """Teacher-forced logits [B, T, V] for source [B, S] and shifted target input [B, T]."""
        return self.decode(tgt, self.encode(src, src_pad_mask), src_pad_mask)

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())
