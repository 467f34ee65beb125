"""Precisions and devices, in one place for training and inference: the precision table, its enum, the device
rule and the hardware checks (native bf16 on this CPU or GPU) that `nmt train` and `nmt translate` both apply.

Training (training/distributed/process.py) and inference (translate.py) import this module; it imports neither. torch is
imported only inside the functions, so that `nmt --help` (which builds the options' choices from this table) starts
without it.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING

from nmt_cli.errors import DeviceError

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class Spec:
    """One precision: the torch dtype the model's weights and activations take, and which commands accept it."""

    dtype_name: str | None  # a torch dtype's name; None: resolved against the hardware (auto)
    train: bool
    translate: bool

    @property
    def dtype(self) -> torch.dtype | None:
        import torch

        return getattr(torch, self.dtype_name) if self.dtype_name else None


# The one precision table. int8 is a float32 model whose linear layers and output projection run as int8 products
# (int8.py; CPU translation only); auto picks bf16 where the hardware runs it natively (training only).
PRECISIONS: dict[str, Spec] = {
    "auto": Spec(None, True, False),  # bf16 where the hardware runs it natively, fp16 on older GPUs, else fp32
    "fp32": Spec("float32", True, True),
    "bf16": Spec("bfloat16", True, True),  # fast on CPUs with AMX or AVX512-BF16 and GPUs of capability >= 8.0
    "fp16": Spec("float16", True, True),  # GPUs only
    "int8": Spec("float32", False, True),  # CPU translation only: int8 linear layers (FBGEMM)
}
TRAIN_PRECISIONS = tuple(name for name, spec in PRECISIONS.items() if spec.train)
TRANSLATE_PRECISIONS = tuple(name for name, spec in PRECISIONS.items() if spec.translate)


def _enum(name: str, names: tuple[str, ...]) -> type[Enum]:
    return Enum(name, {n: n for n in names}, type=str, module=__name__)


# The enum of the table, and the choices of each command drawn from it (typer lists an option's choices from an
# Enum and has no way to offer a subset of one, so each command's subset is an Enum made here from the table).
Precision = _enum("Precision", tuple(PRECISIONS))
TrainPrecision = _enum("TrainPrecision", TRAIN_PRECISIONS)
TranslatePrecision = _enum("TranslatePrecision", TRANSLATE_PRECISIONS)


def dtypes(names: tuple[str, ...] = TRAIN_PRECISIONS) -> dict[str, torch.dtype]:
    """{name: torch dtype} of the resolved precisions among `names` (training's autocast dtypes by default)."""
    return {n: PRECISIONS[n].dtype for n in names if PRECISIONS[n].dtype_name}

DEVICES = ("auto", "cpu", "cuda")


# ---------------------------------------------------------------------------------------------------- hardware


def cpu_flags() -> set[str]:
    """The CPU feature flags of /proc/cpuinfo (empty where it does not exist)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def cpu_has_fast_bf16() -> bool:
    """True where bf16 matrix products run natively (AMX or AVX512-BF16), i.e. faster than fp32."""
    return bool({"amx_bf16", "avx512_bf16"} & cpu_flags())


def gpu_has_native_bf16(index: int) -> bool:
    """Compute capability >= 8.0 (Ampere and later: bf16 tensor cores). `torch.cuda.is_bf16_supported()` is not
    this test: it also says True on a V100 or T4, where bf16 is emulated and slow, and it asks the current device."""
    import torch

    return tuple(torch.cuda.get_device_capability(index)) >= (8, 0)


# ---------------------------------------------------------------------------------------------------- devices


def resolve_device(name: str) -> torch.device:
    """auto -> cuda when available, else cpu; an unavailable cuda is a DeviceError."""
    import torch

    if name not in DEVICES:
        raise DeviceError(f"unknown device {name!r}; choose one of {', '.join(DEVICES)}")
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise DeviceError("--device cuda was requested but no CUDA GPU is available; use --device cpu")
    return torch.device(name)


# ---------------------------------------------------------------------------------------------------- inference


def resolve_dtype(precision: str, device: torch.device) -> torch.dtype:
    """The dtype to translate in on `device`; a DeviceError for a precision the device cannot run."""
    if precision not in TRANSLATE_PRECISIONS:
        raise DeviceError(f"unknown precision {precision!r}; choose one of {', '.join(TRANSLATE_PRECISIONS)}")
    if precision == "fp16" and device.type == "cpu":
        raise DeviceError("fp16 is for GPUs; on CPU use --precision bf16 (fast on CPUs with AMX/AVX512-BF16) or fp32")
    if precision == "int8" and device.type != "cpu":
        raise DeviceError("--precision int8 is for CPUs; on a GPU use --precision fp16 or bf16")
    return PRECISIONS[precision].dtype


def slow_bf16_warning(dtype: torch.dtype, device: torch.device) -> str | None:
    """Why bf16 will be slow on this device (no native bf16), or None."""
    import torch

    if dtype != torch.bfloat16:
        return None
    if device.type == "cpu" and not cpu_has_fast_bf16():
        return ("this CPU has no native bf16 (AMX or AVX512-BF16): bf16 runs several times slower than fp32 "
                "here; use --precision fp32")
    if device.type == "cuda" and not gpu_has_native_bf16(device.index or 0):
        return ("this GPU has no native bf16 (compute capability below 8.0): bf16 is emulated and slow here; use "
                "--precision fp16")
    return None


# ---------------------------------------------------------------------------------------------------- training


def resolve_precision(precision: str, device_type: str, gpus: list[int] | tuple[int, ...] = (0,)) -> str:
    """Training: auto -> bf16 where the hardware runs it natively (CPU with AMX/AVX512-BF16, GPUs of compute
    capability >= 8.0, all of `gpus`), fp16 with loss scaling on older GPUs, else fp32. Raises DeviceError for fp16
    on CPU and bf16 on a GPU without native bf16."""
    import torch

    if precision == "auto":
        if device_type == "cuda":
            return "bf16" if all(gpu_has_native_bf16(i) for i in gpus) else "fp16"
        return "bf16" if cpu_has_fast_bf16() else "fp32"
    if precision == "fp16" and device_type == "cpu":
        raise DeviceError("fp16 training needs a GPU; on CPU use --precision bf16 (or fp32)")
    if precision == "bf16" and device_type == "cuda":
        for i in gpus:
            if not gpu_has_native_bf16(i):
                major, minor = torch.cuda.get_device_capability(i)
                raise DeviceError(f"GPU {i} ({torch.cuda.get_device_name(i)}, compute capability {major}.{minor}) has "
                                  "no native bf16 (it needs 8.0 or later); use --precision fp16 (or fp32)")
    return precision
