"""`--precision int8`: int8 linear layers (int8.py) agree with float32, and the whole path translates."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
from torch import nn

from helpers_translate import make_checkpoint, tiny_config, tiny_model_and_batch
from nmt_cli.decoding import SearchConfig
from nmt_cli.errors import ConfigError, DeviceError
from nmt_cli.inference import int8 as int8_module
from nmt_cli.inference.int8 import Int8Linear, quantize_int8
from nmt_cli.inference.translate import TranslateConfig, Translator, load_checkpoints
from nmt_cli.model import Transformer
from nmt_cli.runtime.precision import resolve_dtype

pytestmark = pytest.mark.skipif(not int8_module.int8_available(), reason="this torch build has no FBGEMM")


def relative_error(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm())


@pytest.mark.parametrize("bias", [True, False])
def test_int8_linear_matches_float_linear(bias):
    torch.manual_seed(0)
    dense = nn.Linear(64, 96, bias=bias)
    quantized = Int8Linear(dense.weight, dense.bias)
    with torch.inference_mode():
        for shape in [(37, 64), (2, 5, 64), (1, 64)]:
            x = torch.randn(*shape)
            y, yq = dense(x), quantized(x)
            assert yq.shape == y.shape and yq.dtype == torch.float32
            assert relative_error(yq, y) < 0.02  # 8-bit weights, 7-bit activations: ~1% error on random data
        if bias:  # a zero input gives exactly the bias
            assert torch.allclose(quantized(torch.zeros(3, 64)), dense.bias.expand(3, 96), atol=1e-6)


@pytest.mark.parametrize("share", [True, False])
def test_quantized_transformer_gives_the_float_distribution(share):
    model, src, tgt = tiny_model_and_batch(share)
    with torch.inference_mode():
        reference = model(src, tgt).log_softmax(-1)
        quantize_int8(model)
        got = model(src, tgt).log_softmax(-1)
    assert not any(type(m) is nn.Linear for m in model.modules())
    assert isinstance(model.output_layer.layer, Int8Linear)
    assert (got - reference).abs().max() < 0.25  # log-probabilities of a 50-token vocabulary (~ -3.9 each)
    assert relative_error(got.exp(), reference.exp()) < 0.05


def test_int8_translator_and_cli(tmp_path, toy_tokenizer_bytes):
    path = make_checkpoint(tmp_path / "model.pt", toy_tokenizer_bytes, seed=0)
    other = make_checkpoint(tmp_path / "other.pt", toy_tokenizer_bytes, seed=3, share_embeddings=False)
    cfg = TranslateConfig(search=SearchConfig(beam=4, max_len_a=1.0, max_len_b=4))
    for checkpoints in ([path], [path, other]):  # one model, and an ensemble
        out = Translator(load_checkpoints(checkpoints), "cpu", "int8", cfg).translate(["the cat", "", "a dog"])
        assert len(out) == 3 and out[1][0].text == ""
    run = subprocess.run([sys.executable, "-m", "nmt_cli.cli", "translate", "-m", str(path), "--precision", "int8",
                          "--max-len-b", "4"], input=b"the cat\nold man\n", capture_output=True, timeout=120)
    assert run.returncode == 0, run.stderr.decode()
    assert len(run.stdout.decode().splitlines()) == 2
    assert b"deprecated" not in run.stderr


def test_int8_errors(monkeypatch):
    with pytest.raises(DeviceError, match="CPUs"):
        resolve_dtype("int8", torch.device("cuda"))
    monkeypatch.setattr(int8_module, "int8_available", lambda: False)
    with pytest.raises(DeviceError, match="FBGEMM"):
        quantize_int8(Transformer(tiny_config(50)))


def test_int8_linear_fuses_relu():
    torch.manual_seed(2)
    dense = nn.Linear(64, 128)
    with torch.inference_mode():
        x = torch.randn(9, 64)
        fused = Int8Linear(dense.weight, dense.bias, relu=True)(x)
        assert fused.min() == 0.0
        torch.testing.assert_close(fused, torch.relu(Int8Linear(dense.weight, dense.bias)(x)))


needs_onednn = pytest.mark.skipif("onednn" not in torch.backends.quantized.supported_engines,
                                  reason="this torch build has no oneDNN quantized engine")


@needs_onednn
@pytest.mark.parametrize("relu", [False, True])
def test_onednn_int8_linear_matches_float_linear_with_8_bit_activations(relu):
    torch.manual_seed(4)
    dense = nn.Linear(64, 300)
    with torch.inference_mode():
        x = torch.randn(21, 64)
        ref = torch.relu(dense(x)) if relu else dense(x)
        onednn = Int8Linear(dense.weight, dense.bias, relu=relu, engine="onednn")
        fbgemm = Int8Linear(dense.weight, dense.bias, relu=relu)
        got = onednn(x)
        assert torch.backends.quantized.engine != "onednn"  # (the engine put back)
        assert onednn.reduce_range is not int8_module.onednn_vnni()
        assert relative_error(got, ref) < 0.02
        if not onednn.reduce_range:  # 8-bit activations, not 7: closer than FBGEMM's
            assert relative_error(got, ref) < relative_error(fbgemm(x), ref)
        if relu:  # applied after oneDNN's product, which would ignore a fused one
            assert got.min() == 0.0
        assert onednn(x.view(3, 7, 64)).shape == (3, 7, 300)


def test_onednn_activations_are_7_bit_where_its_products_have_no_vnni(monkeypatch):
    """Without VNNI oneDNN sums unsigned x signed bytes in pairs into saturating 16 bits, as FBGEMM does: 8-bit
    activations would overflow there (~10x the error), so they are 7-bit; ONEDNN_MAX_CPU_ISA below VNNI counts too."""
    for name in ("ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(int8_module, "cpu_flags", lambda: {"avx2", "avx512f", "avx512_vnni"})
    assert int8_module.onednn_vnni()
    for flags in ({"avx2", "avx_vnni"}, {"amx_tile", "amx_int8"}):
        monkeypatch.setattr(int8_module, "cpu_flags", lambda flags=flags: flags)
        assert int8_module.onednn_vnni()
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "avx2")
    assert not int8_module.onednn_vnni()
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX512_CORE_VNNI")
    assert int8_module.onednn_vnni()
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA")
    monkeypatch.setattr(int8_module, "cpu_flags", lambda: {"avx2", "fma", "avx512f", "avx512bw"})
    assert not int8_module.onednn_vnni()
    if "onednn" in torch.backends.quantized.supported_engines:
        assert Int8Linear(torch.randn(8, 16), engine="onednn").reduce_range


def test_the_output_projections_engine_follows_the_cpu_and_the_environment(monkeypatch):
    monkeypatch.delenv(int8_module.ENV, raising=False)
    monkeypatch.setattr(int8_module, "cpu_flags", lambda: {"avx512f", "amx_tile", "amx_int8"})
    amx = int8_module.output_engine()
    assert amx == ("onednn" if int8_module.onednn_available() else "fbgemm")
    monkeypatch.setattr(int8_module, "cpu_flags", lambda: {"avx2", "avx512_vnni"})
    assert int8_module.output_engine() == "fbgemm"
    monkeypatch.setenv(int8_module.ENV, "onednn")
    assert int8_module.output_engine() == "onednn"
    monkeypatch.setenv(int8_module.ENV, "mkl")
    with pytest.raises(ConfigError, match="NMT_INT8_GEMM='mkl': choose fbgemm or onednn"):
        int8_module.output_engine()
    monkeypatch.setattr(int8_module, "onednn_available", lambda: False)  # a build without oneDNN's
    monkeypatch.setattr(int8_module, "cpu_flags", lambda: {"amx_int8"})
    monkeypatch.setenv(int8_module.ENV, "onednn")
    with pytest.raises(ConfigError, match="no oneDNN quantized engine; use fbgemm"):
        int8_module.output_engine()
    monkeypatch.delenv(int8_module.ENV)
    assert int8_module.output_engine() == "fbgemm"


@needs_onednn
@pytest.mark.parametrize("engine", ["fbgemm", "onednn"])
def test_a_quantized_model_has_the_chosen_output_projection_and_the_float_distribution(engine, monkeypatch):
    monkeypatch.setenv(int8_module.ENV, engine)
    model, src, tgt = tiny_model_and_batch(True)
    with torch.inference_mode():
        reference = model(src, tgt).log_softmax(-1)
        quantize_int8(model)
        got = model(src, tgt).log_softmax(-1)
    assert model.output_layer.layer.engine == engine
    assert all(m.engine == "fbgemm" for m in model.modules() if isinstance(m, Int8Linear) and m is not model.output_layer)
    assert relative_error(got.exp(), reference.exp()) < 0.05


def test_a_bad_int8_engine_is_one_line_from_the_cli(tmp_path, toy_tokenizer_bytes):
    path = make_checkpoint(tmp_path / "model.pt", toy_tokenizer_bytes, seed=0)
    run = subprocess.run([sys.executable, "-m", "nmt_cli.cli", "translate", "-m", str(path), "--precision", "int8"],
                         input=b"the cat\n", capture_output=True, timeout=120, env={**os.environ, "NMT_INT8_GEMM": "x"})
    assert run.returncode != 0
    lines = run.stderr.decode().strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: NMT_INT8_GEMM='x': choose fbgemm or onednn"), lines
