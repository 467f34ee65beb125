"""The decoding step: one new position per row of a Transformer, against the decoder cache (cache.py).

The model gives what a step needs by name (`embed_step`, each decoder layer's `step`, `step_output`, the
encoder-decoder projections `cross_keys_values`); the cache gives the positions, the masks and the attention over
what it holds. `step` is the host's part (room in the cache, the lengths) around `static_step`, which reads tensors
and bucket-level ints only, so that `torch.compile(fullgraph=True)` traces it whole and a CUDA graph can capture it.
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor

from nmt_cli.decoding.cache import DecoderCache, Segment


def init_cache(model, memory: Tensor, src_pad_mask: Tensor | None = None, static: bool = False) -> DecoderCache:
    """A decoder cache for memory [N, S, D]: every layer's encoder-decoder keys and values, projected once into one
    [L, 2, N, H, S, K] tensor (float32 on CPU, where decoding attention runs in float32). `static`: the layout for
    compiled steps and CUDA graphs (layout.py)."""
    cross = model.cross_keys_values(memory)
    if memory.device.type == "cpu":
        cross = cross.float()
    return DecoderCache([Segment(cross, src_pad_mask, static)])


def step(model, tokens: Tensor, cache: DecoderCache, output=None) -> Tensor:
    """Logits [R, V] of the next token after `tokens` [R] (each row's last token), extending `cache` by one
    position: the host's part around the model's static step (compiled, when `compile_step` asked for it).
    `output`: the output projection over a shortlist's columns (logits [R, C]; Transformer.output_over)."""
    cache.make_room(model.config.max_positions)
    logits = model.step_fn(tokens, cache) if output is None else static_step(model, tokens, cache, output)
    cache.advance()
    return logits


def static_step(model, tokens: Tensor, cache: DecoderCache, output=None) -> Tensor:
    """tokens [R] -> logits [R, V], writing the new keys and values into the cache by index (module docstring)."""
    x = model.embed_step(tokens, cache.positions())  # [R, D]
    rows = x.size(0)
    padded = padded_rows(rows, model.row_multiple)
    if padded != rows:  # rows of zeros, so that the products see few shapes
        x = F.pad(x, (0, 0, 0, padded - rows))
    masks = cache.self_masks()
    for i, layer in enumerate(model.decoder_layers):
        x = layer.step(x, lambda qkv, i=i: cache.self_attend(i, qkv, masks), lambda q, i=i: cache.cross_attend(i, q))
    logits = model.step_output(x, output)
    return logits if padded == rows else logits[:rows]


def padded_rows(rows: int, multiple: int, least: int = 1) -> int:
    """`rows` rounded up to a multiple of `multiple`, or of rows / 8 rounded down to a power of two where that is
    smaller: at most 1/8 more rows (one sentence's few rows stay as they are), and a few shapes per octave. `least`:
    a multiple of this at least (the encoder's tokens: inference/packed.py's `encoder_rows`)."""
    step = max(least, min(multiple, 1 << max(0, rows.bit_length() - 4)))
    return -(-rows // step) * step
