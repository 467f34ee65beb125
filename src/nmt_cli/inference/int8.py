"""int8 linear layers for CPU translation (`nmt translate --precision int8`), as CTranslate2's `int8` compute type.

Every linear layer and the output projection keep int8 weights (one scale per output row) and run as an int8 product
on activations quantized per call (one scale and zero point per call, computed from the input's range); attention,
layer norms, softmax and the search stay float32. The products are FBGEMM's, through torch's `quantized` ops
(`quantized::linear_prepack`, `quantized::linear_dynamic`). Activations use 7 bits (`reduce_range`): CPUs without
VNNI multiply-add unsigned x signed bytes into saturating 16-bit sums, and 7 bits keep those sums exact.

Why: at a decoding step's shapes int8 products are faster than float32 ones (docs/results-history.md#int8-products).

This is an inference-only transformation: an int8 model is never trained or saved.
"""

from __future__ import annotations

import warnings

import torch
from torch import Tensor, nn

from nmt_cli.errors import DeviceError
from nmt_cli.model import replace_linears


def int8_available() -> bool:
    """Whether this torch build has FBGEMM's int8 products (x86 CPUs)."""
    try:
        return "fbgemm" in torch.backends.quantized.supported_engines and hasattr(torch.ops.quantized,
                                                                                 "linear_dynamic")
    except (AttributeError, RuntimeError):
        return False


class Int8Linear(nn.Module):
    """y = x W^T + b with W in int8 (per-row scales) and x quantized to 7-bit unsigned integers on each call;
    `relu`: max(0, y) in the same pass."""

    def __init__(self, weight: Tensor, bias: Tensor | None = None, relu: bool = False):
        super().__init__()
        self.relu = relu
        weight = weight.detach().float().cpu()
        self.in_features, self.out_features = weight.size(1), weight.size(0)
        scales = (weight.abs().amax(dim=1) / 127.0).clamp(min=1e-8).double()  # [out]
        zero_points = torch.zeros(self.out_features, dtype=torch.long)
        with warnings.catch_warnings():  # torch marks its quantized tensor types deprecated; FBGEMM's ops need them
            warnings.simplefilter("ignore")
            qweight = torch.quantize_per_channel(weight, scales, zero_points, 0, torch.qint8)
        bias = None if bias is None else bias.detach().float().cpu()
        self._packed = torch.ops.quantized.linear_prepack(qweight, bias)
        # the resolved overload's C++ function: the op packet, and the overload itself, check their arguments in
        # Python first, on every call
        overload = (torch.ops.quantized.linear_relu_dynamic if relu else torch.ops.quantized.linear_dynamic).default
        self._op = getattr(overload, "_op", overload)

    def forward(self, x: Tensor) -> Tensor:
        if x.dim() == 2 and x.dtype == torch.float32:  # a decoding step's rows: no reshape to pay for
            return self._op(x, self._packed, True)
        y = self._op(x.reshape(-1, self.in_features).float().contiguous(), self._packed, True)  # True: 7-bit inputs
        return y.view(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, int8" + (", relu" if self.relu else "")


def quantize_int8(model: nn.Module) -> nn.Module:
    """Replace every nn.Linear of `model` (a float32 Transformer on CPU) by an Int8Linear (the feed-forward ReLU fused
    into the first), and give it an int8 output projection (`model.output_layer`, used by `Transformer.decode`).
    In place; returns the model."""
    if not int8_available():
        raise DeviceError("--precision int8 needs a torch build with FBGEMM (x86 CPUs); use --precision fp32")
    if any(p.device.type != "cpu" for p in model.parameters()):
        raise DeviceError("--precision int8 is for CPUs; on a GPU use --precision fp16 or bf16")
    return replace_linears(model, Int8Linear)
