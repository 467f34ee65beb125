"""The shared Transformer core: masks, cache, positions, parameter counts, loss."""

import math
import os
import weakref

import pytest
import torch
import torch.nn.functional as F

from nmt_cli.config import PRESETS, ModelConfig, preset
from nmt_cli.decoding import cache as cache_module
from nmt_cli.decoding import layout as layout_module
from nmt_cli.decoding.attention import attend
from nmt_cli.decoding.scheduler import encode_batch
from nmt_cli.errors import ConfigError
from nmt_cli.model import Transformer, sinusoidal_positions
from nmt_cli.training.loss import label_smoothed_cross_entropy

V = 50


def tiny_model(seed: int = 0, **overrides) -> Transformer:
    torch.manual_seed(seed)
    cfg = preset("tiny", vocab_size=V, d_model=32, d_ff=64, n_heads=4, **overrides)
    return Transformer(cfg).eval()


def batch(seed: int = 1, b: int = 3, s: int = 7, t: int = 6):
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(4, V, (b, s), generator=g)
    tgt = torch.randint(4, V, (b, t), generator=g)
    return src, tgt


@pytest.mark.parametrize("norm_first", [False, True])
def test_future_target_tokens_do_not_change_earlier_outputs(norm_first):
    model = tiny_model(norm_first=norm_first)
    src, tgt = batch()
    out = model(src, tgt)
    changed = tgt.clone()
    changed[:, 4:] = torch.randint(4, V, changed[:, 4:].shape)
    out2 = model(src, changed)
    torch.testing.assert_close(out[:, :4], out2[:, :4])
    assert not torch.allclose(out[:, 4:], out2[:, 4:])


def test_extra_source_padding_leaves_outputs_unchanged():
    model = tiny_model()
    src, tgt = batch()
    out = model(src, tgt, torch.zeros_like(src, dtype=torch.bool))
    padded = torch.cat([src, torch.zeros(src.size(0), 5, dtype=torch.long)], dim=1)
    mask = padded.eq(0)
    out_padded = model(padded, tgt, mask)
    torch.testing.assert_close(out, out_padded, atol=1e-5, rtol=1e-5)


def test_padding_in_one_row_does_not_affect_other_rows():
    model = tiny_model()
    src, tgt = batch()
    src[1, 4:] = 0
    full = model(src, tgt, src.eq(0))
    alone = model(src[1:2, :4], tgt[1:2])
    torch.testing.assert_close(full[1:2], alone, atol=1e-5, rtol=1e-5)


def _steps(model, cache, tgt):
    """Decode tgt [R, T] one position at a time with `cache` -> logits [R, T, V]."""
    return torch.stack([model.step(tgt[:, i], cache) for i in range(tgt.size(1))], dim=1)


@pytest.mark.parametrize("static", [False, True])
@pytest.mark.parametrize("norm_first", [False, True])
def test_incremental_decoding_equals_full_forward(norm_first, static):
    model = tiny_model(norm_first=norm_first)
    src, tgt = batch()
    src[0, 5:] = 0
    mask = src.eq(0)
    full = model(src, tgt, mask)
    cache = encode_batch(model, src, mask, static)
    torch.testing.assert_close(_steps(model, cache, tgt), full, atol=1e-5, rtol=1e-5)
    seg = cache.segments[0]
    assert seg.length == tgt.size(1) and int(seg.pos) == tgt.size(1)
    assert not static or seg.capacity == 16  # static: the first bucket


def test_incremental_decoding_after_reorder_equals_full_forward():
    model = tiny_model()
    src, tgt = batch(b=3)
    mask = torch.zeros_like(src, dtype=torch.bool)
    cache = encode_batch(model, src, mask)
    _steps(model, cache, tgt[:, :3])
    order = torch.tensor([2, 0, 0, 1])  # rows move; a row is duplicated (the cache follows rows, whatever they are)
    cache.segments[0].beams = 1
    cache.segments[0].reorder(order, order)
    step = model.step(tgt[order, 3], cache)
    full = model(src[order], tgt[order, :4], mask[order])
    torch.testing.assert_close(step, full[:, 3], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("static", [False, True])
def test_cache_grows_past_its_initial_capacity(static):
    model = tiny_model()
    src, tgt = batch(b=2, t=40)  # the self-attention buffer starts with 16 positions (static: buckets 16, 32, 64)
    mask = torch.zeros_like(src, dtype=torch.bool)
    cache = encode_batch(model, src, mask, static)
    torch.testing.assert_close(_steps(model, cache, tgt), model(src, tgt, mask), atol=1e-5, rtol=1e-5)
    assert cache.segments[0].capacity >= 40 and (not static or cache.segments[0].capacity == 64)


@pytest.mark.parametrize("static", [False, True])
@torch.inference_mode()  # as decoding runs (outside it, autograd would keep every old buffer alive)
def test_growing_or_merging_the_cache_holds_one_layer_twice_at_most(static, monkeypatch):
    """One keys-and-values buffer a layer, each old one freed before the next new one is made: at a bucket boundary
    (and when a join needs a new buffer) the cache holds its new size plus one layer, never its old and new sizes
    together, which would set decoding's peak memory (docs/results-history.md#one-buffer-a-layer)."""
    made: list = []  # weak references to every keys-and-values buffer made
    peaks: list[tuple[int, int]] = []  # at each new buffer: (bytes of the buffers alive with it, its own bytes)
    new = cache_module.Segment._new

    def tracked(self, shape):
        buffer = new(self, shape)
        alive = sum(b.numel() * b.element_size() for b in (ref() for ref in made) if b is not None)
        peaks.append((alive + buffer.numel() * buffer.element_size(), buffer.numel() * buffer.element_size()))
        made.append(weakref.ref(buffer))
        return buffer

    monkeypatch.setattr(cache_module.Segment, "_new", tracked)
    model = tiny_model()
    layers = model.config.decoder_layers
    src, tgt = batch(b=2, t=40)
    mask = torch.zeros_like(src, dtype=torch.bool)
    cache = encode_batch(model, src, mask, static)
    _steps(model, cache, tgt[:, :20])  # buckets 16 -> 32
    grown = peaks[layers:]
    assert len(grown) == layers
    final = sum(size for _, size in grown)
    assert max(alive for alive, _ in grown) <= final + final // (2 * layers)  # + one old (half-size) layer
    peaks.clear()
    joining = encode_batch(model, src[:1], mask[:1], static)
    _steps(model, joining, tgt[:1, :18])  # two positions behind: merges, into a new buffer (no room for 3)
    cache.join(joining)
    assert len(cache.segments) == 1 and cache.segments[0].sentences == 3
    merged = peaks[-layers:]
    one_layer = max(size for _, size in merged)
    assert max(alive for alive, _ in merged) <= sum(size for _, size in merged) + 2 * one_layer


def _resident_mb() -> float:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:")) / 1024


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="reads resident memory from Linux's /proc")
def test_a_mapped_cache_buffer_takes_memory_where_written_and_gives_it_all_back():
    """CPU keys-and-values buffers from MAPPED_BYTES on: the capacity past the positions written takes no memory,
    and freeing one returns all of it (a C-heap buffer may stay with the process)."""
    before = _resident_mb()
    x = layout_module.mapped((64, 1 << 18), torch.float32)  # 64 MiB
    assert _resident_mb() - before < 8
    x[:32].fill_(1.0)  # half of it written
    written = _resident_mb()
    assert 24 < written - before < 44
    del x
    assert _resident_mb() < written - 24


@pytest.mark.parametrize("static", [False, True])
def test_beams_share_encoder_keys_and_equal_full_forward(static):
    """repeat_beams keeps one cross-attention k/v per sentence (beams folded into the queries), with the same
    results as giving every row its own copy; beam moves and dropped sentences stay exact. Beam moves move only the
    slot table, not the keys and values (same buffer; static: the table too keeps its address)."""
    model = tiny_model()
    src, tgt = batch(b=3, t=6)
    src[1, 4:] = 0
    mask = src.eq(0)
    k = 2
    cache = encode_batch(model, src, mask, static)
    cache.repeat_beams(k)
    seg = cache.segments[0]
    assert seg.beams == k and seg.cross.size(2) == 3 and seg.src_pad.size(0) == 3 and cache.rows() == 6
    rows = torch.arange(3).repeat_interleave(k)  # [0, 0, 1, 1, 2, 2]
    tgt_rows = tgt[rows].clone()
    tgt_rows[1::2, 1:] = torch.randint(4, V, (3, 5), generator=torch.Generator().manual_seed(5))  # beams differ
    out = _steps(model, cache, tgt_rows[:, :3])
    torch.testing.assert_close(out, model(src[rows], tgt_rows[:, :3], mask[rows]), atol=1e-5, rtol=1e-5)

    def filled():  # (the exact layout leaves the positions past them unset)
        return torch.stack([kv[:, :, :, : seg.length] for kv in seg.kv])

    address, slots_address, kv = [kv.data_ptr() for kv in seg.kv], seg.slots.table.data_ptr(), filled()
    beams_only = torch.tensor([1, 1, 2, 3, 5, 4])  # beams move within their sentences
    cache.reorder(beams_only)
    assert [kv.data_ptr() for kv in seg.kv] == address and torch.equal(filled(), kv)
    assert (seg.slots.table.data_ptr() == slots_address) == static
    assert seg.slots.table[:, :3].tolist() == [[1] * 3, [1] * 3, [0] * 3, [1] * 3, [1] * 3, [0] * 3]
    hist = tgt_rows[beams_only]
    step = model.step(hist[:, 3], cache)
    torch.testing.assert_close(step, model(src[rows], hist[:, :4], mask[rows])[:, 3], atol=1e-5, rtol=1e-5)

    drop = torch.tensor([4, 5, 0, 1])  # sentence 1 leaves (sentences kept: 0 and 2, in that order)
    cache.reorder(drop[[2, 3, 0, 1]], keep=[0, 2])
    assert seg.beams == k and seg.cross.size(2) == 2
    hist, srows = hist[drop[[2, 3, 0, 1]]], rows[drop[[2, 3, 0, 1]]]
    step = model.step(hist[:, 4], cache)
    torch.testing.assert_close(step, model(src[srows], hist[:, :5], mask[srows])[:, 4], atol=1e-5, rtol=1e-5)


def test_joined_segments_decode_with_their_own_positions_and_sources(monkeypatch):
    """Continuous batching in the cache: a batch that joins later keeps its own positions and source (a segment
    of its own: 3 positions apart, MERGE_GAP 2); both batches' steps equal the full forward pass."""
    monkeypatch.setattr(cache_module, "MERGE_GAP", 2)
    model = tiny_model()
    src, tgt = batch(b=4, t=6)
    src[3, 3:] = 0
    mask = src.eq(0)
    first = encode_batch(model, src[:2], mask[:2])
    _steps(model, first, tgt[:2, :3])
    cache = first.join(encode_batch(model, src[2:, :5], mask[2:, :5]))
    assert cache.rows() == 4 and len(cache.segments) == 2
    for i in range(3):
        out = model.step(torch.cat([tgt[:2, 3 + i], tgt[2:, i]]), cache)
        torch.testing.assert_close(out[:2], model(src[:2], tgt[:2, : 4 + i], mask[:2])[:, 3 + i], atol=1e-5,
                                   rtol=1e-5)
        torch.testing.assert_close(out[2:], model(src[2:, :5], tgt[2:, : 1 + i], mask[2:, :5])[:, i], atol=1e-5,
                                   rtol=1e-5)
    cache.reorder(torch.tensor([1, 3]), keep=[1, 3])  # one sentence of each batch leaves
    assert [s.sentences for s in cache.segments] == [1, 1]


@pytest.mark.parametrize("static", [False, True])
def test_merged_segments_decode_with_their_own_positions_and_drop_columns_nobody_reads(static):
    """A batch that joins merges into the running one as it joins (one segment, rows right-aligned):
    every row keeps its own positions and source (other lengths, padded), steps equal the full forward pass, and
    when the first batch's sentences leave, the columns only they read are dropped."""
    model = tiny_model()
    src, tgt = batch(b=4, t=8)
    src[3, 3:] = 0
    mask = src.eq(0)
    first = encode_batch(model, src[:2], None, static)
    _steps(model, first, tgt[:2, :3])
    cache = first.join(encode_batch(model, src[2:, :5], mask[2:, :5], static))  # 3 positions apart: merged
    assert len(cache.segments) == 1
    model.step(torch.cat([tgt[:2, 3], tgt[2:, 0]]), cache)  # the joined batch's first step
    seg = cache.segments[0]
    assert seg.offsets.starts == [0, 0, 3, 3] and seg.length == 4 and seg.cross.size(4) == 7  # sources padded to 7
    for i in range(1, 4):
        out = model.step(torch.cat([tgt[:2, 3 + i], tgt[2:, i]]), cache)
        torch.testing.assert_close(out[:2], model(src[:2], tgt[:2, : 4 + i])[:, 3 + i], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(out[2:], model(src[2:, :5], tgt[2:, : 1 + i], mask[2:, :5])[:, i], atol=1e-5,
                                   rtol=1e-5)
    cache.reorder(torch.tensor([2, 3]), keep=[2, 3])  # the first batch leaves
    assert seg.offsets is None and seg.length == 4  # 3 columns dropped: 7 decoded positions, 4 still read
    out = model.step(tgt[2:, 4], cache)
    torch.testing.assert_close(out, model(src[2:, :5], tgt[2:, :5], mask[2:, :5])[:, 4], atol=1e-5, rtol=1e-5)


def test_leaving_sentences_move_only_those_that_fill_their_holes_and_joins_use_the_room(monkeypatch):
    """When sentences leave, the kept ones past the kept count fill the holes (`order`) and nothing else of the
    keys and values moves (same buffers); a merged join writes into the room left (by the sentence that left, then
    by a new buffer's spare room), the self-attention's as the encoder-decoder's. Every step still equals the full
    forward pass. (Joins up to 5 positions apart: MERGE_GAP raised so that all merge.)"""
    monkeypatch.setattr(cache_module, "MERGE_GAP", 8)
    model = tiny_model()
    src, tgt = batch(b=7, t=8)
    src[2, 4:] = 0
    mask = src.eq(0)
    cache = encode_batch(model, src[:4], mask[:4])
    _steps(model, cache, tgt[:4, :2])
    keep = cache.order([0, 2, 3])
    assert keep == [0, 3, 2]  # sentence 3 fills sentence 1's hole
    seg = cache.segments[0]
    address = seg.cross.data_ptr()
    cache.reorder(torch.tensor(keep), keep=keep)
    assert seg.cross.data_ptr() == address and seg.cross.size(2) == 3
    out = model.step(tgt[keep, 2], cache)
    torch.testing.assert_close(out, model(src[keep], tgt[keep, :3], mask[keep])[:, 2], atol=1e-5, rtol=1e-5)

    rows, moved, kv_moved = keep, [], []
    for joining in (4, 5, 6):  # one sentence joins, merges (its first step inside the running segment), steps
        one = slice(joining, joining + 1)
        kv_address = seg.kv[0].data_ptr()
        cache.join(encode_batch(model, src[one], mask[one]))
        assert len(cache.segments) == 1
        moved.append(seg.cross.data_ptr() != address)
        kv_moved.append(seg.kv[0].data_ptr() != kv_address)
        address = seg.cross.data_ptr()
        rows = rows + [joining]
        out = model.step(torch.stack([tgt[r, seg.length - o] for r, o in zip(rows, seg.offsets.starts, strict=True)]), cache)
    assert moved == [False, True, False]  # the leaver's slot; a new buffer with room; that room
    assert kv_moved == [False, True, False]  # likewise
    torch.testing.assert_close(out[-3], model(src[4:5], tgt[4:5, :3], mask[4:5])[0, 2], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out[-1], model(src[6:7], tgt[6:7, :1], mask[6:7])[0, 0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out[0], model(src[:1], tgt[:1, :6], mask[:1])[0, 5], atol=1e-5, rtol=1e-5)


def test_a_buffer_far_larger_than_its_kept_sentences_read_is_compacted():
    """When sentences leave and the encoder-decoder buffer holds more than 4x what the kept ones read (room a burst
    of joins made), it is gathered into one of their size; steps still equal the full forward pass."""
    model = tiny_model()
    src, tgt = batch(b=3, t=5)
    src[1:, 3:] = 0
    mask = src.eq(0)
    cache = encode_batch(model, src, mask)
    _steps(model, cache, tgt[:, :3])
    seg = cache.segments[0]
    room = seg._room.new_zeros(seg._room.shape[:2] + (12,) + seg._room.shape[3:])  # as if a burst of joins had
    room[:, :, :3] = seg.cross  # made room for 12 sentences
    seg._room, seg.cross = room, room[:, :, :3]
    keep = cache.order([0, 2])
    cache.reorder(torch.tensor(keep), keep=keep)  # 2 sentences of 12: more than 4x, compacted
    assert seg._room.shape[2] == 2 and seg.cross.shape == seg._room.shape
    out = model.step(tgt[keep, 3], cache)
    torch.testing.assert_close(out, model(src[keep], tgt[keep, :4], mask[keep])[:, 3], atol=1e-5, rtol=1e-5)


def test_the_static_step_compiles_as_one_graph():
    """What a CUDA graph capture needs: torch.compile(fullgraph=True) traces the static step whole (a graph break
    would raise), and its logits equal the eager step's."""
    model = tiny_model()
    src, tgt = batch(b=2, t=5)
    mask = src.eq(0)
    with torch.inference_mode():
        eager = _steps(model, encode_batch(model, src, mask, True), tgt)
    model.compile_step(backend="aot_eager")
    try:
        with torch.inference_mode():
            compiled = _steps(model, encode_batch(model, src, mask, True), tgt)
    finally:
        model.compile_step(backend=None)
    torch.testing.assert_close(compiled, eager, atol=1e-6, rtol=1e-6)


def test_positional_encoding_equals_formula():
    d, pe = 16, sinusoidal_positions(50, 16)
    for pos in (0, 1, 7, 49):
        for i in range(d // 2):
            angle = pos / 10000 ** (2 * i / d)
            assert pe[pos, 2 * i].item() == pytest.approx(math.sin(angle), abs=1e-6)
            assert pe[pos, 2 * i + 1].item() == pytest.approx(math.cos(angle), abs=1e-6)


def test_embeddings_are_scaled_and_shared():
    model = tiny_model(dropout=0.0)
    tokens = torch.tensor([[5, 6]])
    x = model._embed(tokens, model.embed)
    expected = model.embed.weight[tokens] * math.sqrt(32) + sinusoidal_positions(2, 32)
    torch.testing.assert_close(x, expected)
    # one matrix: source embedding, target embedding and output projection
    names = [n for n, _ in model.named_parameters() if "embed" in n or "out_proj.weight" == n]
    assert names == ["embed.weight"]


@pytest.mark.parametrize(("name", "low", "high"), [("base", 62.5e6, 63.5e6), ("big", 213e6, 214.5e6)])
def test_parameter_counts_match_paper(name, low, high):
    with torch.device("meta"):
        n = Transformer(preset(name, vocab_size=37000)).num_parameters()
    assert low <= n <= high, n


def test_presets_have_paper_numbers():
    base, big = PRESETS["base"], PRESETS["big"]
    assert (base.d_model, base.d_ff, base.n_heads, base.dropout) == (512, 2048, 8, 0.1)
    assert (big.d_model, big.d_ff, big.n_heads, big.dropout) == (1024, 4096, 16, 0.3)
    assert base.encoder_layers == base.decoder_layers == 6 and not base.norm_first


def test_config_validation_and_overrides():
    assert preset("base", d_model=256, n_heads=4).d_model == 256
    with pytest.raises(ConfigError, match="divisible"):
        preset("base", d_model=100, n_heads=8)
    with pytest.raises(ConfigError, match="unknown preset"):
        preset("huge")
    with pytest.raises(ConfigError, match="unknown model option"):
        preset("tiny", d_modle=3)
    assert ModelConfig.from_dict(PRESETS["big"].to_dict()) == PRESETS["big"]


def test_label_smoothing_matches_direct_computation():
    torch.manual_seed(0)
    logits = torch.randn(2, 5, V)
    target = torch.randint(4, V, (2, 5))
    target[1, 3:] = 0  # padding
    eps = 0.1
    loss, nll, n = label_smoothed_cross_entropy(logits, target, eps, pad_id=0)
    expected = expected_nll = 0.0
    for b in range(2):
        for t in range(5):
            if target[b, t] == 0:
                continue
            logp = F.log_softmax(logits[b, t].double(), dim=-1)
            q = torch.full((V,), eps / V, dtype=torch.double)
            q[target[b, t]] += 1 - eps
            expected += float(-(q * logp).sum())
            expected_nll += float(-logp[target[b, t]])
    assert n == 8
    assert loss.item() == pytest.approx(expected, rel=1e-5)
    assert nll.item() == pytest.approx(expected_nll, rel=1e-5)
    # eps 0 is plain cross-entropy
    loss0, _, _ = label_smoothed_cross_entropy(logits, target, 0.0, pad_id=0)
    assert loss0.item() == pytest.approx(expected_nll, rel=1e-5)


def test_gradients_flow_to_all_parameters():
    model = tiny_model().train()
    src, tgt = batch()
    loss, _, _ = label_smoothed_cross_entropy(model(src, tgt), tgt, 0.1)
    loss.backward()
    missing = [n for n, p in model.named_parameters() if p.grad is None or not p.grad.abs().sum() > 0]
    assert missing == []


def test_decoding_attention_equals_sdpa_on_strided_cache_slices():
    """The incremental-decoding attention (float32 over the cache's slices in place) equals PyTorch's SDPA."""
    torch.manual_seed(0)
    buffer = torch.randn(2, 6, 4, 16, 8)  # [2, R, H, capacity, K]: keys/values filled up to position 11
    k, v = buffer[0, :, :, :11], buffer[1, :, :, :11]
    q = torch.randn(6, 4, 2, 8)
    mask = torch.rand(6, 1, 1, 11) > 0.3
    mask[:, :, :, 0] = True  # every row may attend somewhere
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    pad = (~mask).expand(6, 4, 2, 11).reshape(24, 2, 11)
    got = attend(q.reshape(24, 2, 8), k.reshape(24, 11, 8), v.reshape(24, 11, 8), pad).view(6, 4, 2, 8)
    torch.testing.assert_close(got, expected, atol=1e-6, rtol=1e-5)
    out = attend(q.bfloat16().reshape(24, 2, 8), k.reshape(24, 11, 8), v.reshape(24, 11, 8), pad)
    assert out.dtype == torch.bfloat16  # bf16 model, float32 cache: bf16 out, float32 inside
    torch.testing.assert_close(out.float().view(6, 4, 2, 8), expected, atol=2e-2, rtol=2e-2)


def test_fp16_decoding_attention_scales_the_query_before_the_product():
    """q k^T of 64-dim fp16 vectors of 40s is 102,400, past fp16's 65,504; scaled first (q / 8) it fits, and the
    attention is that of float32 (before, the product overflowed to inf and the softmax gave NaN)."""
    q = torch.full((2, 1, 64), 40.0)
    k = torch.full((2, 3, 64), 40.0)
    k[:, 1] = 30.0
    v = torch.randn(2, 3, 64)
    expected = attend(q, k, v)
    got = attend(q.half(), k.half(), v.half())
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got.float(), expected, atol=1e-2, rtol=1e-2)
