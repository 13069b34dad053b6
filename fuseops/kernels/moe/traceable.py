"""The routing kernels (``permute.py``) as ``torch.library`` custom ops, so that a compiled MoE
layer runs the same permute and unpermute kernels as an eager one.

Their torch references (a stable sort, index_put, index_add, a float32 gather-sum) are
traceable, but compiled they cost what the kernels save. On the H100 the compiled OLMoE /
Qwen3 layers ran 22-59 % slower than the eager ones with them, at every token count, and
0.97-1.21x eager with these ops at T=4096 and 16384 (``benchmarks/sizes.py``); every
reference op is also one more kernel a host-bound step launches. Output shapes follow from
input shapes alone (no split size is read), so each op's fake implementation is exact and row
counts stay dynamic.

As in ``fuseops.kernels.library``: each public function calls the launcher directly outside a
trace and the op while ``torch.compile`` traces. The range checks are not the ops' business:
under a trace ``fuseops.moe.routing`` checks ids and rows with torch ops before calling them
(the kernels clamp, so nothing is read out of bounds before that assert reports).
"""

from __future__ import annotations

import torch

from fuseops.kernels.custom_op import fuseops_op
from fuseops.kernels.dispatch import Kernel, launcher


@fuseops_op("permute(Tensor x, Tensor expert_ids, int num_experts) -> (Tensor, Tensor, Tensor)")
def _permute_op(x: torch.Tensor, expert_ids: torch.Tensor, num_experts: int
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return launcher(Kernel.PERMUTE, x)(x, expert_ids, num_experts)


@torch.library.register_fake("fuseops::permute")
def _(x, expert_ids, num_experts):
    T, top_k = expert_ids.shape
    return (x.new_empty(T * top_k, x.shape[1]), x.new_empty(num_experts, dtype=torch.int64),
            x.new_empty(T, top_k, dtype=torch.int64))


def permute(x: torch.Tensor, expert_ids: torch.Tensor, num_experts: int
            ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``permute.py``'s ``permute`` without a range flag (or its reference), traceable."""
    if not torch.compiler.is_compiling():
        return launcher(Kernel.PERMUTE, x)(x, expert_ids, num_experts)
    return _permute_op(x, expert_ids, num_experts)


@fuseops_op("unpermute(Tensor y_sorted, Tensor row_map, Tensor? weights) -> Tensor")
def _unpermute_op(y_sorted: torch.Tensor, row_map: torch.Tensor, weights: torch.Tensor | None) -> torch.Tensor:
    return launcher(Kernel.UNPERMUTE, y_sorted)(y_sorted, row_map, weights)


@torch.library.register_fake("fuseops::unpermute")
def _(y_sorted, row_map, weights):
    return y_sorted.new_empty(row_map.shape[0], y_sorted.shape[1])


def unpermute(y_sorted: torch.Tensor, row_map: torch.Tensor, weights: torch.Tensor | None) -> torch.Tensor:
    """``permute.py``'s ``unpermute`` without a range flag (or its reference), traceable."""
    if not torch.compiler.is_compiling():
        return launcher(Kernel.UNPERMUTE, y_sorted)(y_sorted, row_map, weights)
    return _unpermute_op(y_sorted, row_map, weights)


@fuseops_op("unpermute_bwd(Tensor dy, Tensor row_map, Tensor? weights, Tensor? y_sorted) -> (Tensor, Tensor)")
def _unpermute_bwd_op(dy: torch.Tensor, row_map: torch.Tensor, weights: torch.Tensor | None,
                      y_sorted: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    dy_sorted, dweights = launcher(Kernel.UNPERMUTE_BWD, dy)(dy, row_map, weights, y_sorted)
    # A custom op cannot return None: an empty tensor stands for no weights' gradient.
    return dy_sorted, dweights if dweights is not None else dy.new_empty(0)


@torch.library.register_fake("fuseops::unpermute_bwd")
def _(dy, row_map, weights, y_sorted):
    dy_sorted = dy.new_empty(row_map.numel(), dy.shape[1])
    if y_sorted is None:
        return dy_sorted, dy.new_empty(0)
    return dy_sorted, dy.new_empty(row_map.shape, dtype=weights.dtype if weights is not None else dy.dtype)


def unpermute_bwd(dy: torch.Tensor, row_map: torch.Tensor, weights: torch.Tensor | None,
                  y_sorted: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``permute.py``'s ``unpermute_bwd`` (or its reference), traceable: ``(dy_sorted,
    dweights)``, ``dweights`` None without ``y_sorted``."""
    if not torch.compiler.is_compiling():
        return launcher(Kernel.UNPERMUTE_BWD, dy)(dy, row_map, weights, y_sorted)
    dy_sorted, dweights = _unpermute_bwd_op(dy, row_map, weights, y_sorted)
    return dy_sorted, dweights if y_sorted is not None else None
