"""float32 CPU translation through oneDNN with prepacked weights (packed.py): the same products as F.linear, the same
translations, the rule that picks it (NMT_CPU_GEMM, the CPU's vendor) and the bound on its memory."""

from __future__ import annotations

import os

import pytest
import torch
from torch import nn

from helpers_translate import make_checkpoint, tiny_model_and_batch
from nmt_cli.decoding import SearchConfig
from nmt_cli.errors import ConfigError
from nmt_cli.inference import packed
from nmt_cli.inference.packed import PackedLinear, pack_linears, use_packed
from nmt_cli.inference.translate import TranslateConfig, Translator, load_checkpoints

pytestmark = pytest.mark.skipif(not packed.packed_available(), reason="this torch build has no oneDNN")


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("relu", [True, False])
def test_packed_linear_is_the_float32_product(bias, relu):
    torch.manual_seed(0)
    dense = nn.Linear(64, 96, bias=bias)
    layer = PackedLinear(dense.weight, dense.bias, relu=relu)
    with torch.inference_mode():
        for shape in [(37, 64), (2, 5, 64), (1, 64)]:
            x = torch.randn(*shape)
            want = torch.relu(dense(x)) if relu else dense(x)
            got = layer(x)
            assert got.shape == want.shape and got.dtype == torch.float32
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)  # float32 sums in another order


def test_encoder_products_run_with_few_row_counts():
    """The encoder's tokens (3-D inputs) reach oneDNN padded to a multiple of 8 (a kernel and its buffers are kept per
    row count: one sentence a call made one per length); a decoding step's rows (2-D) as they come."""
    layer = PackedLinear(torch.randn(48, 32))
    seen = []
    op = layer._op
    layer._op = lambda x, *args: seen.append(x.size(0)) or op(x, *args)
    with torch.inference_mode():
        for length in range(1, 33):
            assert layer(torch.randn(1, length, 32)).shape == (1, length, 48)
        layer(torch.randn(5, 32))
    assert sorted(set(seen[:-1])) == [8, 16, 24, 32] and seen[-1] == 5
    assert [packed.encoder_rows(n) for n in (1, 8, 9, 100, 127, 1000)] == [8, 8, 16, 104, 128, 1024]


@pytest.mark.parametrize("share", [True, False])
def test_packed_transformer_gives_the_same_logits_and_translations(share):
    model, src, tgt = tiny_model_and_batch(share)
    from nmt_cli.decoding import beam_search

    cfg = SearchConfig(beam=4, max_len_a=1.0, max_len_b=5)
    with torch.inference_mode():
        reference = model(src, tgt)
        want = beam_search(model, src, None, cfg)
        pack_linears(model)
        got = model(src, tgt)
        found = beam_search(model, src, None, cfg)
    assert not any(type(m) is nn.Linear for m in model.modules())
    assert isinstance(model.output_layer.layer, PackedLinear)
    torch.testing.assert_close(got, reference, rtol=1e-4, atol=1e-4)
    assert [[h.tokens for h in hyps] for hyps in found] == [[h.tokens for h in hyps] for hyps in want]


def test_the_rule_follows_the_environment_then_the_vendor(monkeypatch):
    monkeypatch.setenv(packed.ENV, "mkl")
    assert not use_packed()
    monkeypatch.setenv(packed.ENV, "onednn")
    assert use_packed()
    monkeypatch.setenv(packed.ENV, "openblas")
    with pytest.raises(ConfigError, match="choose mkl or onednn"):
        use_packed()
    monkeypatch.delenv(packed.ENV)
    for vendor, expected in (("GenuineIntel", False), ("AuthenticAMD", True), ("", True)):
        monkeypatch.setattr(packed, "cpu_vendor", lambda v=vendor: v)
        assert use_packed() is expected


@pytest.mark.parametrize("precision,int8_gemm,bounded", [("fp32", "", True), ("bf16", "", True),
                                                         ("int8", "fbgemm", False), ("int8", "onednn", True)])
def test_translations_on_onednn_bound_its_caches_unless_the_user_did(tmp_path, toy_tokenizer_bytes, monkeypatch,
                                                                     precision, int8_gemm, bounded):
    """oneDNN's and ideep's caches of compiled products are capped (their default let memory grow with the input),
    by environment variables that the user's own values override. int8 uses oneDNN for its output projection
    only where it is chosen (int8.py; by default on CPUs with AMX)."""
    if int8_gemm == "onednn" and "onednn" not in torch.backends.quantized.supported_engines:
        pytest.skip("this torch build has no oneDNN quantized engine")
    path = make_checkpoint(tmp_path / "model.pt", toy_tokenizer_bytes, seed=0)
    monkeypatch.setenv(packed.ENV, "onednn")
    monkeypatch.setenv("NMT_INT8_GEMM", int8_gemm)
    for name in packed.CACHE_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    Translator(load_checkpoints([path]), "cpu", precision, TranslateConfig())
    want = str(packed.ONEDNN_CACHE) if bounded else None
    assert [os.environ.get(name) for name in packed.CACHE_VARIABLES] == [want, want]
    monkeypatch.setenv("LRU_CACHE_CAPACITY", "7")
    Translator(load_checkpoints([path]), "cpu", "fp32", TranslateConfig())
    assert os.environ["LRU_CACHE_CAPACITY"] == "7"


def test_fp32_translator_packs_where_the_rule_says(tmp_path, toy_tokenizer_bytes, monkeypatch):
    path = make_checkpoint(tmp_path / "model.pt", toy_tokenizer_bytes, seed=0)
    cfg = TranslateConfig(search=SearchConfig(beam=4, max_len_a=1.0, max_len_b=4))
    lines = ["the cat", "", "a dog sat"]
    out = {}
    for choice in ("mkl", "onednn"):
        monkeypatch.setenv(packed.ENV, choice)
        tr = Translator(load_checkpoints([path]), "cpu", "fp32", cfg)
        assert isinstance(getattr(tr.model.output_layer, "layer", None), PackedLinear) is (choice == "onednn")
        assert tr.model.row_multiple == (packed.ROW_MULTIPLE if choice == "onednn" else 1)  # few product shapes
        out[choice] = [[t.text for t in hyps] for hyps in tr.translate(lines)]
    assert out["mkl"] == out["onednn"]
    monkeypatch.setenv(packed.ENV, "onednn")  # bf16 and int8 keep their own products
    bf16 = Translator(load_checkpoints([path]), "cpu", "bf16", cfg).model
    assert bf16.output_layer is None and bf16.row_multiple == packed.ROW_MULTIPLE  # oneDNN's products too
    assert Translator(load_checkpoints([path]), "cpu", "int8", cfg).model.row_multiple == 1
