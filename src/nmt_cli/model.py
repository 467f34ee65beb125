"""The Transformer of "Attention Is All You Need" (Vaswani et al., 2017), batch-first.

Shapes: B batch, S source length, T target length, D d_model, H heads, K d_k = D / H, V vocabulary.
Masks: `src_pad_mask` is a bool tensor [B, S], True at padding (as PyTorch's key_padding_mask).
Post-LN by default, `LayerNorm(x + Dropout(Sublayer(x)))`; `norm_first=True` gives pre-LN with a final norm.

`encode()` runs the encoder; `decode()` the decoder over whole target prefixes (training, teacher forcing).
Decoding's incremental step (`step()`, `init_cache()`, `static_step()`) lives in nmt_cli.decoding.step: this module
gives it what it needs by name (`embed_step`, `DecoderLayer.step`, `step_output`, `cross_keys_values`) and never reads
the cache; the cache (nmt_cli.decoding.cache) attends over what it holds.
"""

from __future__ import annotations

import math
import threading

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from nmt_cli.config import ModelConfig
from nmt_cli.decoding import step as decoding_step
from nmt_cli.decoding.cache import DecoderCache


def sinusoidal_positions(n_positions: int, d_model: int) -> Tensor:
    """PE(pos, 2i) = sin(pos / 10000^(2i/d)), PE(pos, 2i+1) = cos(pos / 10000^(2i/d)).  -> [n_positions, D], on the
    CPU (also inside a meta-device context: Transformer.without_weights)."""
    pos = torch.arange(n_positions, dtype=torch.float64, device="cpu").unsqueeze(1)  # [P, 1]
    two_i = torch.arange(0, d_model, 2, dtype=torch.float64, device="cpu")  # [D/2]
    angle = pos / torch.pow(10000.0, two_i / d_model)  # [P, D/2]
    pe = torch.zeros(n_positions, d_model, dtype=torch.float64, device="cpu")
    pe[:, 0::2] = torch.sin(angle)
    pe[:, 1::2] = torch.cos(angle[:, : d_model // 2])
    return pe.float()


def avoid_cudnn_attention() -> None:
    """Keep `scaled_dot_product_attention` on CUDA off its cuDNN backend (process-wide; flash and memory-efficient
    attention remain). cuDNN builds an execution plan for every new (batch, length) shape, and nmt's shapes change
    every batch (training) and every step (decoding), so it spends more time planning than computing
    (docs/results-history.md#attention-kernels-of-the-model)."""
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
        memory: Tensor | None = None,  # [B, S, D] for encoder-decoder attention
    ) -> Tensor:
        """Attention over whole sequences (encoder, training, teacher forcing) through SDPA."""
        if self.self_attention:
            q, k, v = (self._split(y) for y in self.qkv_proj(x).chunk(3, dim=-1))  # [B, H, T, K] each
        else:
            q = self._split(self.q_proj(x))
            k, v = self.project_kv(memory)
        out = F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, dropout_p=self.dropout if self.training else 0.0, is_causal=is_causal
        )  # [B, H, T, K]
        b, _, t, _ = out.shape
        return self.out_proj(out.transpose(1, 2).reshape(b, t, self.h * self.d_k))

ACTIVATION_MODULES = {"relu": nn.ReLU, "gelu": nn.GELU, "swish": nn.SiLU}


class FeedForward(nn.Module):
    """FFN(x) = act(x W1 + b1) W2 + b2, act ReLU as in the paper (max(0, .)) or GELU or swish. Its submodules' `forward` is called directly (no module calls: a decoding
    step of a small model is ~100 small operations whose Python cost rivals their arithmetic), so forward hooks on
    fc1/fc2 do not run."""

    def __init__(self, d_model: int, d_ff: int, activation_dropout: float, activation: str = "relu"):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(d_model, d_ff), nn.Linear(d_ff, d_model)
        self.activation: nn.Module = ACTIVATION_MODULES[activation]()  # int8.py fuses ReLU into fc1 (-> Identity)
        self.dropout = nn.Dropout(activation_dropout)

    def forward(self, x: Tensor) -> Tensor:
        h = self.activation.forward(self.fc1.forward(x))
        return self.fc2.forward(self.dropout(h) if self.training else h)


class LazyProjection(nn.Module):
    """An inference-only model's output projection over the whole vocabulary, made by `make(weight, bias)` at its first
    use (`layer`): a CPU translation with a vocabulary shortlist projects over some rows only (`output_over`), so the
    whole vocabulary's packed or quantized copy (the base shape's: 76 MB in float32) is made only where something
    asks for every row (no shortlist, token scores, alignments, validation)."""

    def __init__(self, make, weight: Tensor, bias: Tensor | None):
        super().__init__()
        self.__dict__.update(make=make, weight=weight, bias=bias, _layer=None, _lock=threading.Lock())

    @property
    def layer(self) -> nn.Module:
        if self._layer is None:
            with self._lock:  # (decoding streams share the model)
                if self._layer is None:
                    with torch.no_grad():
                        self.__dict__["_layer"] = self.make(self.weight, self.bias)
        return self._layer

    def forward(self, x: Tensor) -> Tensor:
        return self.layer.forward(x)


def replace_linears(model: nn.Module, layer, output=None) -> nn.Module:
    """Inference-only products (int8.py, packed.py): replace every nn.Linear of `model` by `layer(weight, bias)`,
    with the feed-forward ReLU fused into the first as `layer(weight, bias, relu=True)`, and give it such an output
    projection (`model.output_layer`, from the shared embedding or `out_proj`; made by `output` where given, at its
    first use: LazyProjection). In place; returns the model."""
    untied = getattr(model, "out_proj", None)
    output_weight = untied.weight if untied is not None else model.embed.weight
    with torch.no_grad():
        for ffn in [m for m in model.modules() if isinstance(m, FeedForward) and isinstance(m.activation, nn.ReLU)]:
            ffn.fc1, ffn.activation = layer(ffn.fc1.weight, ffn.fc1.bias, relu=True), nn.Identity()
        for module in list(model.modules()):
            for name, child in list(module.named_children()):
                if type(child) is nn.Linear:
                    setattr(module, name, layer(child.weight, child.bias))
        model.output_layer = LazyProjection(output or layer, output_weight.detach(), model.output_bias)
        # the same kind of product over a shortlist's rows, from the float weights (output_over; plain attributes,
        # not registered: an untied out_proj's float weight stays referenced here)
        model.__dict__.update(output_factory=output or layer, output_float=output_weight.detach())
    return model


class Sublayer(nn.Module):
    """Residual connection around `fn` with dropout and LayerNorm, post-LN or pre-LN (layer norm and dropout called
    as functions, as in FeedForward)."""

    def __init__(self, d_model: int, dropout: float, norm_first: bool, eps: float):
        super().__init__()
        self.norm = nn.LayerNorm(d_model, eps=eps)
        self.dropout = nn.Dropout(dropout)
        self.norm_first = norm_first

    def forward(self, x: Tensor, fn) -> Tensor:
        norm = self.norm
        if self.norm_first:
            y = fn(torch.layer_norm(x, norm.normalized_shape, norm.weight, norm.bias, norm.eps))
            return x + (self.dropout(y) if self.training else y)
        y = fn(x)
        return torch.layer_norm(x + (self.dropout(y) if self.training else y), norm.normalized_shape, norm.weight,
                                norm.bias, norm.eps)


class EncoderLayer(nn.Module):
    def __init__(self, c: ModelConfig):
        super().__init__()
        self.self_attn = MultiHeadAttention(c.d_model, c.n_heads, c.attention_dropout, self_attention=True)
        self.ffn = FeedForward(c.d_model, c.d_ff, c.activation_dropout, c.activation)
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
        self.ffn = FeedForward(c.d_model, c.d_ff, c.activation_dropout, c.activation)
        self.sub1 = Sublayer(c.d_model, c.dropout, c.norm_first, c.layer_norm_eps)
        self.sub2 = Sublayer(c.d_model, c.dropout, c.norm_first, c.layer_norm_eps)
        self.sub3 = Sublayer(c.d_model, c.dropout, c.norm_first, c.layer_norm_eps)

    def forward(self, x: Tensor, memory: Tensor, memory_mask: Tensor | None) -> Tensor:  # x [B, T, D]
        """Whole target sequences (training, teacher forcing), causal self-attention."""
        x = self.sub1(x, lambda y: self.self_attn(y, is_causal=True))
        x = self.sub2(x, lambda y: self.cross_attn(y, mask=memory_mask, memory=memory))
        return self.sub3(x, self.ffn)

    def step(self, x: Tensor, self_attend, cross_attend) -> Tensor:
        """One new position per row (incremental decoding), x [R, D] -> [R, D], with the attention over a decoder
        cache given: `self_attend(qkv [R, 3D])` and `cross_attend(q [R, D])` -> the heads' outputs [R, D] before the
        output projection (nmt_cli.decoding.cache). Modules' forward() called directly: no module calls, no hooks."""
        sa, ca = self.self_attn, self.cross_attn
        x = self.sub1.forward(x, lambda y: sa.out_proj.forward(self_attend(sa.qkv_proj.forward(y))))
        x = self.sub2.forward(x, lambda y: ca.out_proj.forward(cross_attend(ca.q_proj.forward(y))))
        return self.sub3.forward(x, self.ffn.forward)


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
        # fixed, like MarianMT's final_logits_bias: saved with the weights, never trained (None: no bias, not saved)
        self.register_buffer("output_bias", torch.zeros(c.vocab_size) if c.output_bias else None)
        self.embed_scale = math.sqrt(c.d_model)
        self.dropout = nn.Dropout(c.dropout)
        self.encoder_layers = nn.ModuleList(EncoderLayer(c) for _ in range(c.encoder_layers))
        self.decoder_layers = nn.ModuleList(DecoderLayer(c) for _ in range(c.decoder_layers))
        self.encoder_norm = nn.LayerNorm(c.d_model, eps=c.layer_norm_eps) if c.norm_first else nn.Identity()
        self.decoder_norm = nn.LayerNorm(c.d_model, eps=c.layer_norm_eps) if c.norm_first else nn.Identity()
        self.output_layer: nn.Module | None = None  # replaces the output projection (int8.py); None: the weights
        self.row_multiple = 1  # a decoding step pads its rows towards a multiple of this (`padded_rows`; packed.py)
        self.reset_parameters()

    @classmethod
    def without_weights(cls, config: ModelConfig) -> Transformer:
        """A Transformer whose parameters hold no memory and were never initialised (the meta device), for
        `load_state_dict(weights, assign=True)` to give it tensors of its own (checkpoints/format.py: no random
        float copy beside the checkpoint's); the sinusoidal positions (not saved) are computed on the CPU as always.
        Initialising is skipped (the layers' `reset_parameters`, for the construction only: a model is built at start,
        not beside other threads' layers), not only pointless: torch 2.13's `normal_` on the meta device, as its other
        meta kernels written in Python, holds ~73 MB the first time it runs."""
        layers = (nn.Linear, nn.Embedding, nn.LayerNorm, cls)
        kept = [layer.reset_parameters for layer in layers]
        try:
            for layer in layers:
                layer.reset_parameters = lambda self: None
            with torch.device("meta"):
                model = cls(config)
        finally:
            for layer, reset in zip(layers, kept, strict=True):
                layer.reset_parameters = reset
        return model

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

    def _embed(self, tokens: Tensor, embedding: nn.Embedding) -> Tensor:
        """tokens [B, T] -> dropout(sqrt(D) * E[tokens] + PE[:T])  [B, T, D]"""
        t = tokens.size(1)
        if t > self.config.max_positions:
            raise ValueError(f"sequence of {t} tokens exceeds max_positions {self.config.max_positions}")
        x = embedding(tokens) * self.embed_scale + self.positions[:t].to(embedding.weight.dtype)
        return self.dropout(x)

    def encode(self, src: Tensor, src_pad_mask: Tensor | None = None) -> Tensor:
        """src [B, S] token ids, src_pad_mask [B, S] True at padding -> memory [B, S, D]."""
        mask = _attn_mask(src_pad_mask)
        x = self._embed(src, self.embed)
        for layer in self.encoder_layers:
            x = layer(x, mask)
        return self.encoder_norm(x)

    def init_cache(self, memory: Tensor, src_pad_mask: Tensor | None = None, static: bool = False) -> DecoderCache:
        """A decoder cache for memory [N, S, D] (nmt_cli.decoding.step.init_cache)."""
        return decoding_step.init_cache(self, memory, src_pad_mask, static)

    def decode(self, tgt: Tensor, memory: Tensor, src_pad_mask: Tensor | None = None) -> Tensor:
        """Next-token logits [B, T, V] at every position of target prefixes `tgt` [B, T] (starting with BOS), for
        the encoder output `memory` [B, S, D] (teacher forcing, causal masking)."""
        x = self._embed(tgt, self.target_embedding())
        mask = _attn_mask(src_pad_mask)
        for layer in self.decoder_layers:
            x = layer(x, memory, mask)
        return self.output(self.decoder_norm(x))  # [B, T, V]

    def step(self, tokens: Tensor, cache: DecoderCache, candidates=None) -> Tensor:
        """Logits [R, V] of the next token after `tokens` [R], extending `cache` by one position
        (nmt_cli.decoding.step.step); over a shortlist's columns [R, C] with `candidates`
        (nmt_cli.decoding.candidates)."""
        return decoding_step.step(self, tokens, cache, None if candidates is None else candidates.output(self))

    def static_step(self, tokens: Tensor, cache: DecoderCache) -> Tensor:
        """The step proper, with no host sync (nmt_cli.decoding.step.static_step): what `compile_step` and CUDA
        graphs capture."""
        return decoding_step.static_step(self, tokens, cache)

    def embed_step(self, tokens: Tensor, positions: Tensor) -> Tensor:
        """Incremental decoding's input: tokens [R] at positions [1] or [R] -> sqrt(D) * E[tokens] + PE[positions]
        [R, D]."""
        embedding = self.target_embedding()
        position = self.positions.index_select(0, positions).to(embedding.weight.dtype)
        return embedding.forward(tokens) * self.embed_scale + position

    def step_output(self, x: Tensor, output=None) -> Tensor:
        """Incremental decoding's output: the last layer's rows [R, D] -> logits [R, V], or through `output` (a
        projection over a shortlist's rows: `output_over`)."""
        return (output or self.output)(self.decoder_norm.forward(x))

    def output_over(self, ids: Tensor):
        """The output projection over the rows `ids` [C] of the vocabulary only: a function [R, D] -> [R, C], the
        same kind of product as the full one (float32, oneDNN's packed, int8)."""
        weight = self.__dict__.get("output_float")
        if weight is None:
            weight = self.out_proj.weight if hasattr(self, "out_proj") else self.embed.weight
        ids = ids.to(weight.device)
        weight = weight.detach().index_select(0, ids)
        bias = None if self.output_bias is None else self.output_bias.index_select(0, ids)
        make = self.__dict__.get("output_factory")
        if make is not None:
            return make(weight, bias).forward
        return lambda x: F.linear(x, weight, bias)

    def cross_keys_values(self, memory: Tensor) -> Tensor:
        """Every decoder layer's encoder-decoder keys and values of memory [N, S, D] -> [L, 2, N, H, S, K]."""
        return torch.stack([torch.stack(layer.cross_attn.project_kv(memory)) for layer in self.decoder_layers])

    def target_embedding(self) -> nn.Embedding:
        return getattr(self, "tgt_embed", self.embed)

    @property
    def step_fn(self):
        return self.__dict__.get("_compiled_step") or self.static_step

    def compile_step(self, **options) -> None:
        """Run `static_step` through `torch.compile(fullgraph=True, dynamic=False, **options)` from now on (use it
        with static caches: `init_cache(..., static=True)`); `compile_step(backend=None)` undoes it. Each (rows,
        capacity bucket, source length, segments) layout is one graph: dynamo's recompile limit is raised to 64
        (process-wide) so that a long input does not hit its default of 8."""
        if options.get("backend", "") is None:
            self.__dict__.pop("_compiled_step", None)
            return
        torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 64)
        self.__dict__["_compiled_step"] = torch.compile(self.static_step, fullgraph=True, dynamic=False, **options)

    def output(self, x: Tensor) -> Tensor:
        """The output projection: [..., D] -> logits [..., V]."""
        if self.output_layer is not None:
            return self.output_layer.forward(x)
        weight = self.out_proj.weight if hasattr(self, "out_proj") else self.embed.weight
        return F.linear(x, weight, self.output_bias)

    def forward(self, src: Tensor, tgt: Tensor, src_pad_mask: Tensor | None = None) -> Tensor:
        """Teacher-forced logits [B, T, V] for source [B, S] and shifted target input [B, T]."""
        return self.decode(tgt, self.encode(src, src_pad_mask), src_pad_mask)

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())
