"""float32 linear layers for CPU translation through oneDNN, with the weights laid out once for its kernels.

torch's float32 `F.linear` on CPU goes to Intel MKL, which on CPUs from other vendors runs far below the hardware,
where oneDNN with prepacked weights (`mkldnn::_reorder_linear_weight`, the layout torch's own compiler uses for
frozen CPU models) runs several times faster (docs/results-history.md#onednn-products-with-packed-weights). CTranslate2 makes the same choice: MKL on Intel CPUs, oneDNN elsewhere.

`use_packed()` says where: on CPUs that are not Intel's (by /proc/cpuinfo's vendor), unless `NMT_CPU_GEMM=mkl`
(MKL everywhere) or `NMT_CPU_GEMM=onednn` (oneDNN on Intel CPUs too) says otherwise. Outputs are float32 products
like MKL's, summed in another order: they differ from MKL's in the last bits, not in precision
(docs/results-history.md#cpu-decoding-on-machine-e-2026-11-25-and-2026-11-26 has how often a translation
changes).

oneDNN, and torch's ideep layer over it, prepare a kernel with its buffers for every product shape they see (the
first call of a new shape is slower than the next ones), and keep up to 1024 shapes each; a decoding step's row
count changes every step, so unbounded, memory grows with the input. So a step's rows are padded with zero rows
towards a multiple of ROW_MULTIPLE (`Transformer.row_multiple`, `decoding.step.padded_rows`: at most 1/8 more rows,
none for one sentence's few), the encoder's tokens likewise here (`encoder_rows`: a multiple of 8 at least, so that
one sentence a call makes a shape per 8 lengths, not one per length: 41 MB less peak memory over 50 Multi30k
sentences), and `bound_caches()` caps both caches at ONEDNN_CACHE shapes before oneDNN's first use (which reads them
once per process): the shapes recur and stay prepared, and memory is bounded by the cap (a cached output projection
holds buffers of its rows x vocabulary). The Translator does both for every CPU translation that runs on oneDNN (fp32 here, bf16).

This is an inference-only transformation, as int8.py's: a packed model is never trained or saved.
"""

from __future__ import annotations

import os

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from nmt_cli.decoding.step import padded_rows
from nmt_cli.errors import ConfigError
from nmt_cli.model import replace_linears

ENV = "NMT_CPU_GEMM"  # mkl | onednn; unset: oneDNN on non-Intel CPUs
ONEDNN_CACHE = 256  # product shapes oneDNN and ideep each keep prepared (their default, 1024, let memory grow)
ROW_MULTIPLE = 32  # a decoding step's rows are padded towards a multiple of this (decoding.step.padded_rows): few shapes
CACHE_VARIABLES = ("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "LRU_CACHE_CAPACITY")  # oneDNN's, ideep's


def bound_caches(capacity: int = ONEDNN_CACHE) -> None:
    """Cap oneDNN's and ideep's caches of compiled products at `capacity` shapes each (see the module docstring),
    where the environment does not set them already. Takes effect only before oneDNN's first use in the process.
    """
    for name in CACHE_VARIABLES:
        os.environ.setdefault(name, str(capacity))


def cpu_vendor() -> str:
    """/proc/cpuinfo's vendor_id (GenuineIntel, AuthenticAMD, ...), '' where it does not say."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("vendor_id"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""


def packed_available() -> bool:
    """Whether this torch build has oneDNN's prepacked linear products (x86 and arm64 CPU builds do)."""
    try:
        return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")
    except (AttributeError, RuntimeError):
        return False


def use_packed() -> bool:
    """Whether float32 CPU translation runs its linear layers through oneDNN (see the module docstring)."""
    choice = os.environ.get(ENV, "").strip().lower()
    if choice not in ("", "mkl", "onednn"):
        raise ConfigError(f"{ENV}={choice!r}: choose mkl or onednn (or leave it unset)")
    if choice == "mkl" or not packed_available():
        return False
    return choice == "onednn" or cpu_vendor() != "GenuineIntel"


def encoder_rows(rows: int) -> int:
    """The rows an encoder's product runs with: `rows` (tokens) padded as a decoding step's rows
    (decoding.step.padded_rows), but to a multiple of 8 at least: one sentence's lengths make a few shapes."""
    return padded_rows(rows, ROW_MULTIPLE, least=8)


class PackedLinear(nn.Module):
    """y = x W^T + b in float32 through oneDNN, W laid out once for its kernels; `relu`: max(0, y) in the same
    pass."""

    def __init__(self, weight: Tensor, bias: Tensor | None = None, relu: bool = False):
        super().__init__()
        weight = weight.detach().float().contiguous()
        self.in_features, self.out_features = weight.size(1), weight.size(0)
        self.relu = relu
        self._packed = torch.ops.mkldnn._reorder_linear_weight(weight)
        self._bias = None if bias is None else bias.detach().float().contiguous()
        self._attr = "relu" if relu else "none"
        self._op = torch.ops.mkldnn._linear_pointwise.default

    def forward(self, x: Tensor) -> Tensor:
        if x.dim() == 2:  # a decoding step's rows (padded by the step: decoding.step.padded_rows)
            return self._op(x, self._packed, self._bias, self._attr, [], "")
        shape, rows = x.shape[:-1], x.numel() // self.in_features  # the encoder's tokens: padded here (few shapes)
        x, padded = x.reshape(rows, self.in_features), encoder_rows(rows)
        if padded != rows:
            x = F.pad(x, (0, 0, 0, padded - rows))
        return self._op(x, self._packed, self._bias, self._attr, [], "")[:rows].view(*shape, self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, oneDNN" + (
            ", relu" if self.relu else "")


def pack_linears(model: nn.Module) -> nn.Module:
    """Replace every nn.Linear of `model` (a float32 Transformer on CPU, in eval mode) by a PackedLinear (the
    feed-forward ReLU fused into the first), and give it a packed output projection (`model.output_layer`). In
    place; returns the model."""
    return replace_linears(model, PackedLinear)
