"""Whether torch differentiates the work being done now other than by our autograd Functions.

Under a torch.func transform (``maybe_current_level()`` is set) or inside a
``torch.autograd.forward_ad.dual_level`` block, tensors may be a transform's wrappers or carry
tangents: the references must run as plain torch ops (no ``out=``, no Triton kernel), which
``ops/executor/plain_autograd.py``, the grouped references and the MoE routing ask here.
``forward_ad._current_level`` is torch's private record of the open dual levels (no public
reader exists): read in this one place.

``torch.autograd.grad(..., is_grads_batched=True)`` and
``torch.autograd.functional.jacobian(..., vectorize=True)`` batch the cotangents with torch's
older vmap (``torch._vmap_internals``), which pushes no torch.func level: only the gradients
tell (``batched_cotangents``). A backward given them runs the references too.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch._C._functorch import is_legacy_batchedtensor, maybe_current_level
from torch.autograd import forward_ad


def dual_level_active() -> bool:
    """Inside a ``forward_ad.dual_level`` block (forward-mode AD outside torch.func)."""
    return forward_ad._current_level >= 0


def differentiated_by_torch() -> bool:
    """Under a torch.func transform or inside a ``forward_ad.dual_level`` block."""
    return maybe_current_level() is not None or forward_ad._current_level >= 0


def batched_cotangents(*grads: object) -> bool:
    """Whether any of a backward's incoming ``grads`` is batched by torch's older vmap
    (``is_grads_batched=True``; ``jacobian(vectorize=True)``): a tensor without storage. False
    while torch.compile traces (a compiled backward's operators take them: ``fuseops_op``)."""
    if torch.compiler.is_compiling():
        return False
    for g in grads:  # (a loop: ~170 ns less than any() of a generator on every backward)
        if g is not None and is_legacy_batchedtensor(g):
            return True
    return False


def refuse_batched_cotangents(quantized: bool, communicating: Sequence[str], into_main_grad: Sequence[str] = ()
                              ) -> None:
    """Raises ``RuntimeError`` for a backward of batched cotangents that cannot batch: under a
    quantized recipe (the quantize kernels' references reinterpret and regroup storage, which
    the older vmap cannot batch), through ``communicating`` ops (a collective sends storage) or
    ops whose weight gradient goes ``into_main_grad`` (one float32 buffer: a batch of
    gradients has nowhere to go)."""
    why = ("a quantized recipe is active" if quantized else
           f"op {', '.join(communicating)} communicates" if communicating else
           f"op {', '.join(into_main_grad)} adds its weight gradient into main_grad "
           "(accumulate_into_main_grad=True)" if into_main_grad else None)
    if why is not None:
        raise RuntimeError(
            f"fuseops: batched cotangents (torch.autograd.grad(..., is_grads_batched=True), "
            f"torch.autograd.functional.jacobian(..., vectorize=True)) are not supported where {why}; "
            "pass the cotangents one at a time (vectorize=False)")
