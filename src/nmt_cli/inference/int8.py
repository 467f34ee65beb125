"""int8 linear layers for CPU translation (`nmt translate --precision int8`), as CTranslate2's `int8` compute type.

Every linear layer and the output projection keep int8 weights (one scale per output row) and run as an int8 product
on activations quantized per call (one scale and zero point per call, computed from the input's range); attention,
layer norms, softmax and the search stay float32. The products are FBGEMM's, through torch's `quantized` ops
(`quantized::linear_prepack`, `quantized::linear_dynamic`). Activations use 7 bits (`reduce_range`): CPUs without
VNNI multiply-add unsigned x signed bytes into saturating 16-bit sums, and 7 bits keep those sums exact.

On CPUs with AMX's int8 tiles the output projection (the widest product) is oneDNN's instead, through torch's
`onednn` quantized engine, with 8-bit activations: FBGEMM's is slow at a vocabulary's width there (it fills an int32
buffer as large as the logits), oneDNN's 1.5-8x faster (bench/tools/int8_engines.py); the narrower layers stay
FBGEMM's, as fast or faster at a step's few rows. `NMT_INT8_GEMM=fbgemm` or `onednn` chooses for the output
projection on any CPU; oneDNN's activations are 7-bit too where its products have no VNNI (`onednn_vnni`: 8-bit
ones saturate there, ~10x the error).

Why: at a decoding step's shapes int8 products are faster than float32 ones (docs/results-history.md#int8-products).

This is an inference-only transformation: an int8 model is never trained or saved.
"""

from __future__ import annotations

import functools
import os
import warnings

import torch
from torch import Tensor, nn

from nmt_cli.errors import ConfigError, DeviceError
from nmt_cli.model import replace_linears
from nmt_cli.runtime.precision import cpu_flags

ENV = "NMT_INT8_GEMM"  # fbgemm or onednn: whose product the output projection is (`output_engine`)


def int8_available() -> bool:
    """Whether this torch build has FBGEMM's int8 products (x86 CPUs)."""
    try:
        return "fbgemm" in torch.backends.quantized.supported_engines and hasattr(torch.ops.quantized,
                                                                                 "linear_dynamic")
    except (AttributeError, RuntimeError):
        return False


def onednn_available() -> bool:
    """Whether this torch build has oneDNN's int8 products (torch's `onednn` quantized engine)."""
    return "onednn" in torch.backends.quantized.supported_engines


ISA_WITHOUT_VNNI = ("SSE41", "AVX", "AVX2", "AVX512_CORE")  # ONEDNN_MAX_CPU_ISA values below VNNI's


def onednn_vnni() -> bool:
    """Whether oneDNN's int8 products multiply 8-bit activations exactly: the CPU has VNNI (or AMX's int8 tiles), and
    no ONEDNN_MAX_CPU_ISA / DNNL_MAX_CPU_ISA holds oneDNN below it. Without VNNI, unsigned x signed bytes are summed
    in pairs into saturating 16 bits, as for FBGEMM (the module docstring)."""
    cap = (os.environ.get("ONEDNN_MAX_CPU_ISA") or os.environ.get("DNNL_MAX_CPU_ISA") or "").strip().upper()
    return bool({"avx512_vnni", "avx_vnni", "amx_int8"} & cpu_flags()) and cap not in ISA_WITHOUT_VNNI


def output_engine() -> str:
    """Whose int8 product the output projection is: oneDNN's on CPUs with AMX's int8 tiles, FBGEMM's elsewhere
    (module docstring); NMT_INT8_GEMM chooses."""
    choice = os.environ.get(ENV, "").strip().lower()
    if choice not in ("", "fbgemm", "onednn"):
        raise ConfigError(f"{ENV}={choice!r}: choose fbgemm or onednn (or leave it unset)")
    has_onednn = onednn_available()
    if choice == "onednn" and not has_onednn:
        raise ConfigError(f"{ENV}=onednn: this torch build has no oneDNN quantized engine; use fbgemm")
    if choice:
        return choice
    return "onednn" if "amx_int8" in cpu_flags() and has_onednn else "fbgemm"


class Int8Linear(nn.Module):
    """y = x W^T + b with W in int8 (per-row scales) and x quantized on each call to unsigned integers of 7 bits
    (FBGEMM) or 8 (`engine="onednn"` where `onednn_vnni`); `relu`: max(0, y), in the same pass with FBGEMM."""

    def __init__(self, weight: Tensor, bias: Tensor | None = None, relu: bool = False, engine: str = "fbgemm"):
        """`engine`: "fbgemm" (torch's default quantized engine on x86, which packs for FBGEMM) or "onednn"."""
        super().__init__()
        self.relu, self.engine = relu, engine
        weight = weight.detach().float().cpu()
        self.in_features, self.out_features = weight.size(1), weight.size(0)
        scales = (weight.abs().amax(dim=1) / 127.0).clamp(min=1e-8).double()  # [out]
        zero_points = torch.zeros(self.out_features, dtype=torch.long)
        with warnings.catch_warnings():  # torch marks its quantized tensor types deprecated; FBGEMM's ops need them
            warnings.simplefilter("ignore")
            qweight = torch.quantize_per_channel(weight, scales, zero_points, 0, torch.qint8)
        bias = None if bias is None else bias.detach().float().cpu()
        before = torch.backends.quantized.engine
        if engine == "onednn":
            torch.backends.quantized.engine = engine  # (prepack packs for the current engine)
        try:
            self._packed = torch.ops.quantized.linear_prepack(qweight, bias)
        finally:
            torch.backends.quantized.engine = before
        self.reduce_range = engine == "fbgemm" or not onednn_vnni()  # 7-bit activations (module docstring)
        self.relu_after = relu and engine != "fbgemm"  # (oneDNN's dynamic product ignores a fused ReLU)
        # the resolved overload's C++ function: the op packet, and the overload itself, check their arguments in
        # Python first, on every call
        overload = (torch.ops.quantized.linear_relu_dynamic if relu and not self.relu_after
                    else torch.ops.quantized.linear_dynamic).default
        self._op = getattr(overload, "_op", overload)

    def forward(self, x: Tensor) -> Tensor:
        if x.dim() == 2 and x.dtype == torch.float32:  # a decoding step's rows: no reshape to pay for
            y = self._op(x, self._packed, self.reduce_range)
        else:
            y = self._op(x.reshape(-1, self.in_features).float().contiguous(), self._packed, self.reduce_range)
            y = y.view(*x.shape[:-1], self.out_features)
        return y.relu_() if self.relu_after else y

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, int8"
                + ("" if self.engine == "fbgemm" else f", {self.engine}") + (", relu" if self.relu else ""))


def quantize_int8(model: nn.Module) -> nn.Module:
    """Replace every nn.Linear of `model` (a float32 Transformer on CPU) by an Int8Linear (the feed-forward ReLU fused
    into the first), and give it an int8 output projection (`model.output_layer`, used by `Transformer.decode`).
    In place; returns the model."""
    if not int8_available():
        raise DeviceError("--precision int8 needs a torch build with FBGEMM (x86 CPUs); use --precision fp32")
    if any(p.device.type != "cpu" for p in model.parameters()):
        raise DeviceError("--precision int8 is for CPUs; on a GPU use --precision fp16 or bf16")
    output = None
    if output_engine() == "onednn":
        from nmt_cli.inference.packed import bound_caches

        bound_caches()  # oneDNN's caches of prepared products, bounded as for its float32 products
        output = functools.partial(Int8Linear, engine="onednn")
    return replace_linears(model, Int8Linear, output)
