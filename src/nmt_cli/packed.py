"""float32 linear layers for CPU translation through oneDNN, with the weights laid out once for its kernels.

torch's float32 `F.linear` on CPU goes to Intel MKL, which on CPUs from other vendors runs far below the hardware:
on an AMD EPYC (Zen 5, AVX-512) a decoding step's products (40-400 rows x 256 x 8000) ran at 130-180 GFLOP/s through
MKL and at 420-460 through oneDNN with prepacked weights (`mkldnn::_reorder_linear_weight`, the layout torch's own
compiler uses for frozen CPU models). CTranslate2 makes the same choice: MKL on Intel CPUs, oneDNN elsewhere.

`use_packed()` says whether: only when asked, with `NMT_CPU_GEMM=onednn` (`mkl` or unset: MKL, today's default).
It is not the default yet because the process's memory grows with the input through it: translating the Multi30k
test set 1x and 4x in one process peaked at 0.94 and 1.47 GB through oneDNN against 0.56 and 0.59 GB through MKL
(the heap keeps what oneDNN's calls of ever new shapes allocated; a 64 kB mmap threshold bounds it at 2x the time).
Outputs are float32 products like MKL's, summed in another order: they differ from MKL's in the last bits, not in
precision (docs/results.md#cpu-translation has how often a translation changes).

This is an inference-only transformation, as int8.py's: a packed model is never trained or saved.
"""

from __future__ import annotations

import os

import torch
from torch import Tensor, nn

from nmt_cli.errors import ConfigError
from nmt_cli.model import FeedForward

ENV = "NMT_CPU_GEMM"  # mkl | onednn; unset: mkl


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
    return choice == "onednn" and packed_available()


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
        if x.dim() == 2:  # a decoding step's rows
            return self._op(x, self._packed, self._bias, self._attr, [], "")
        y = self._op(x.reshape(-1, self.in_features), self._packed, self._bias, self._attr, [], "")
        return y.view(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, oneDNN" + (
            ", relu" if self.relu else "")


def pack_linears(model: nn.Module) -> nn.Module:
    """Replace every nn.Linear of `model` (a float32 Transformer on CPU, in eval mode) by a PackedLinear (the
    feed-forward ReLU fused into the first), and give it a packed output projection (`model.output_layer`). In
    place; returns the model."""
    untied = getattr(model, "out_proj", None)
    output_weight = untied.weight if untied is not None else model.embed.weight
    with torch.no_grad():
        for ffn in [m for m in model.modules() if isinstance(m, FeedForward) and isinstance(m.activation, nn.ReLU)]:
            ffn.fc1, ffn.activation = PackedLinear(ffn.fc1.weight, ffn.fc1.bias, relu=True), nn.Identity()
        for module in list(model.modules()):
            for name, child in list(module.named_children()):
                if type(child) is nn.Linear:
                    setattr(module, name, PackedLinear(child.weight, child.bias))
        model.output_layer = PackedLinear(output_weight, model.output_bias)
    return model
