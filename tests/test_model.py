"""The shared Transformer core: masks, cache, positions, parameter counts, loss."""

import math

import pytest
import torch
import torch.nn.functional as F

from nmt_cli.config import PRESETS, ModelConfig, preset
from nmt_cli.errors import ConfigError
from nmt_cli.model import Transformer, decode_attention, sinusoidal_positions
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


@pytest.mark.parametrize("norm_first", [False, True])
def test_incremental_decoding_equals_full_forward(norm_first):
    model = tiny_model(norm_first=norm_first)
    src, tgt = batch()
    src[0, 5:] = 0
    mask = src.eq(0)
    full = model(src, tgt, mask)
    cache = model.init_cache(model.encode(src, mask), mask)
    steps = [model.decode(tgt[:, i : i + 1], cache=cache) for i in range(tgt.size(1))]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=1e-5, rtol=1e-5)
    assert cache.length == tgt.size(1)
    assert cache.layers[0].self_k.shape[2] == tgt.size(1)


def test_incremental_decoding_after_reorder_equals_full_forward():
    model = tiny_model()
    src, tgt = batch(b=3)
    mask = torch.zeros_like(src, dtype=torch.bool)
    cache = model.init_cache(model.encode(src, mask), mask)
    model.decode(tgt[:, :3], cache=cache)  # a chunk of 3 positions at once
    order = torch.tensor([2, 0, 0, 1])  # beams move between rows; a row is duplicated
    cache.reorder(order)
    step = model.decode(tgt[order, 3:4], cache=cache)
    full = model(src[order], tgt[order, :4], mask[order])
    torch.testing.assert_close(step[:, 0], full[:, 3], atol=1e-5, rtol=1e-5)


def _steps(model, cache, tgt):
    """Decode tgt [R, T] one position at a time with `cache` -> logits [R, T, V]."""
    return torch.cat([model.decode(tgt[:, i : i + 1], cache=cache) for i in range(tgt.size(1))], dim=1)


def test_cache_grows_past_its_initial_capacity():
    model = tiny_model()
    src, tgt = batch(b=2, t=40)  # the self-attention buffer starts with 16 positions and doubles
    mask = torch.zeros_like(src, dtype=torch.bool)
    cache = model.init_cache(model.encode(src, mask), mask)
    torch.testing.assert_close(_steps(model, cache, tgt), model(src, tgt, mask), atol=1e-5, rtol=1e-5)
    assert cache.layers[0].kv.size(3) >= 40 and cache.layers[0].self_k.shape[2] == 40


def test_beams_share_encoder_keys_and_equal_full_forward():
    """repeat_beams keeps one cross-attention k/v per sentence (beams folded into the queries), with the same
    results as giving every row its own copy; beam moves, dropped sentences and mixing reorders stay exact."""
    model = tiny_model()
    src, tgt = batch(b=3, t=6)
    src[1, 4:] = 0
    mask = src.eq(0)
    k = 2
    cache = model.init_cache(model.encode(src, mask), mask)
    cache.repeat_beams(k)
    assert cache.beams == k and cache.layers[0].cross_k.size(0) == 3 and cache.src_pad_mask.size(0) == 3
    rows = torch.arange(3).repeat_interleave(k)  # [0, 0, 1, 1, 2, 2]
    tgt_rows = tgt[rows].clone()
    tgt_rows[1::2, 1:] = torch.randint(4, V, (3, 5), generator=torch.Generator().manual_seed(5))  # beams differ
    out = _steps(model, cache, tgt_rows[:, :3])
    torch.testing.assert_close(out, model(src[rows], tgt_rows[:, :3], mask[rows]), atol=1e-5, rtol=1e-5)

    beams_only = torch.tensor([1, 1, 2, 3, 5, 4])  # beams move within their sentences
    cache.reorder_beams(beams_only)
    hist = tgt_rows[beams_only]
    step = model.decode(hist[:, 3:4], cache=cache)
    torch.testing.assert_close(step[:, 0], model(src[rows], hist[:, :4], mask[rows])[:, 3], atol=1e-5, rtol=1e-5)

    drop = torch.tensor([4, 5, 0, 1])  # sentence 1 leaves, sentences 2 and 0 swap: still folded
    cache.reorder(drop)
    assert cache.beams == k and cache.layers[0].cross_k.size(0) == 2
    hist, srows = hist[drop], rows[drop]
    step = model.decode(hist[:, 4:5], cache=cache)
    torch.testing.assert_close(step[:, 0], model(src[srows], hist[:, :5], mask[srows])[:, 4], atol=1e-5, rtol=1e-5)

    mixed = torch.tensor([0, 2, 3])  # rows of different sentences in one group: one cross k/v copy per row
    cache.reorder(mixed)
    assert cache.beams == 1 and cache.layers[0].cross_k.size(0) == 3
    hist, srows = hist[mixed], srows[mixed]
    step = model.decode(hist[:, 5:6], cache=cache)
    torch.testing.assert_close(step[:, 0], model(src[srows], hist[:, :6], mask[srows])[:, 5], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("norm_first, share", [(False, True), (True, False)])
def test_one_position_step_equals_the_module_path(norm_first, share):
    """decode() of one new position in eval mode on CPU takes DecoderLayer.step (no module calls, so forward hooks
    stay silent); in train mode it takes the modules. Without dropout both give the same logits and caches."""
    model = tiny_model(norm_first=norm_first, share_embeddings=share, dropout=0.0)
    src, tgt = batch(b=3, t=5)
    src[2, 4:] = 0
    mask = src.eq(0)
    calls = []
    model.decoder_layers[0].ffn.register_forward_hook(lambda *args: calls.append(1))
    outs = {}
    with torch.no_grad():
        for mode in ("eval", "train"):
            getattr(model, mode)()
            cache = model.init_cache(model.encode(src, mask), mask)
            cache.repeat_beams(2)
            first = _steps(model, cache, tgt[:, :3].repeat_interleave(2, 0))
            cache.reorder(torch.tensor([1, 1, 4, 5]))  # a beam moves, a sentence leaves
            outs[mode] = (first, _steps(model, cache, tgt[[0, 0, 2, 2], 3:]), cache.layers[-1].self_k)
            assert len(calls) == (0 if mode == "eval" else 5)
    for got, want in zip(outs["eval"], outs["train"], strict=True):
        torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-6)


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


def test_decode_attention_equals_sdpa_on_strided_cache_slices():
    """The incremental-decoding attention (float32 over the cache's slices in place) equals PyTorch's SDPA."""
    torch.manual_seed(0)
    buffer = torch.randn(2, 6, 4, 16, 8)  # [2, R, H, capacity, K]: keys/values filled up to position 11
    k, v = buffer[0, :, :, :11], buffer[1, :, :, :11]
    q = torch.randn(6, 4, 2, 8)
    mask = torch.rand(6, 1, 1, 11) > 0.3
    mask[:, :, :, 0] = True  # every row may attend somewhere
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    torch.testing.assert_close(decode_attention(q, k, v, mask), expected, atol=1e-6, rtol=1e-5)
    out = decode_attention(q.bfloat16(), k, v, mask)  # bf16 model, float32 cache: bf16 out, float32 inside
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), expected, atol=2e-2, rtol=2e-2)
