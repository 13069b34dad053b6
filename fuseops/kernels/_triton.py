"""Where Triton kernels run, and the few helpers every kernel shares.

This is the only module that reads ``TRITON_INTERPRET``. Triton reads it when it is
imported, so it must be set before the first ``import triton`` (the test suite's
conftest does that).

Kernels launch on CUDA tensors. On CPU tensors the ops run each launcher's torch
reference, unless ``interpreted_kernels()`` is active and the interpreter is on: then
CPU tensors go through the Triton kernels too (how the tests exercise them without a
GPU).
"""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Iterator

import torch
import triton
import triton.language as tl

INTERPRET: bool = os.environ.get("TRITON_INTERPRET", "0") == "1"

# The interpreter's tl.dot returns garbage on bfloat16 operands (TRITON_ON_CPU.md).
_UPCAST_BF16_DOT = tl.constexpr(INTERPRET)
# The interpreter runs no inline PTX.
_PTX = tl.constexpr(not INTERPRET)

_cpu_kernels_depth = 0


@contextlib.contextmanager
def interpreted_kernels() -> Iterator[None]:
    """Run Triton kernels (through the interpreter) for CPU tensors inside this block."""
    if not INTERPRET:
        raise RuntimeError(
            "interpreted_kernels() needs TRITON_INTERPRET=1 set before triton is imported"
        )
    global _cpu_kernels_depth
    _cpu_kernels_depth += 1
    try:
        yield
    finally:
        _cpu_kernels_depth -= 1


def cpu_kernels_active() -> bool:
    """Whether CPU tensors run the Triton kernels now (inside ``interpreted_kernels()``)."""
    return INTERPRET and _cpu_kernels_depth > 0


def runs_triton(t: torch.Tensor) -> bool:
    """Whether work on ``t`` goes through the Triton kernels (float64, the dtype of
    references and oracles, always runs the torch references)."""
    if t.dtype == torch.float64:
        return False
    if t.is_cuda:
        return True
    # ``cpu_kernels_active()`` inline: this runs per launcher and call.
    return INTERPRET and _cpu_kernels_depth > 0


@functools.lru_cache(maxsize=None)
def num_sms(device_index: int) -> int:
    """Multiprocessor count of a CUDA device (a few programs per SM under the interpreter)."""
    if INTERPRET or not torch.cuda.is_available():
        return 4
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def cdiv(a: int, b: int) -> int:
    """``ceil(a / b)`` for host code: ``triton.cdiv`` is a constexpr function whose call
    unwraps its arguments, a few microseconds that a launcher computing a grid pays per call."""
    return -(-a // b)


def next_power_of_2(n: int) -> int:
    """The smallest power of 2 >= ``n`` (0 for 0), ``triton.next_power_of_2`` for host code
    (the same per-call unwrapping as ``cdiv``)."""
    return 1 << (n - 1).bit_length() if n > 0 else 0


def device_sms(t: torch.Tensor) -> int:
    return num_sms(t.device.index if t.is_cuda else -1)


@triton.jit
def reciprocal(x):
    """``1 / x`` for a float32 tile: on the GPU the approximate reciprocal (1 ulp, subnormals
    flushed), one MUFU.RCP where ``/`` adds range fix-ups around it (six instructions in
    all), which activation maths in GEMM epilogues pays per element."""
    if _PTX:
        return tl.inline_asm_elementwise("rcp.approx.ftz.f32 $0, $1;", "=r,r", [x],
                                         dtype=tl.float32, is_pure=True, pack=1)
    return 1.0 / x


@triton.jit
def dot(a, b, acc, F32_DOT: tl.constexpr):
    """``acc + a @ b`` on the tensor cores; float32 operands in ``F32_DOT`` precision
    ("ieee" or "tf32": ``float32_dot_precision``)."""
    if _UPCAST_BF16_DOT:
        if a.dtype == tl.bfloat16:
            a = a.to(tl.float32)
        if b.dtype == tl.bfloat16:
            b = b.to(tl.float32)
    if a.dtype == tl.float32:
        return tl.dot(a, b.to(tl.float32), acc, input_precision=F32_DOT)
    return tl.dot(a, b, acc)


def float32_dot_precision(dtype: torch.dtype) -> str:
    """The ``F32_DOT`` constexpr of a GEMM kernel whose operands are ``dtype``: "tf32" for
    float32 operands where torch runs float32 matmuls in TF32 on CUDA
    (``torch.set_float32_matmul_precision("high")``, ``torch.backends.cuda.matmul.fp32_precision
    = "tf32"`` or the older ``allow_tf32 = True``), as cuBLAS then does for ``torch.mm``; else
    "ieee", torch's default. Other dtypes: "ieee" (unused by their products, and one
    specialization whatever the setting). The interpreter multiplies float32 in IEEE either way."""
    return "tf32" if dtype == torch.float32 and float32_matmul_in_tf32() else "ieee"


def float32_matmul_in_tf32() -> bool:
    """Whether torch runs CUDA float32 matmuls in TF32 now: ``torch.backends.cuda.matmul.
    fp32_precision == "tf32"``, as inductor reads it (it sees a setting made through either API;
    the older ``allow_tf32`` getter raises once the new one was used). Through the attribute's
    own getter: 0.1 us a read against the module ``__getattr__``'s 0.7; every GEMM launch reads it."""
    return _fp32_precision("cuda", "matmul") == "tf32"


_fp32_precision = torch._C._get_fp32_precision_getter
