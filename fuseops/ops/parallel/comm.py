"""Collectives as basic ops: ``AllGather``, ``ReduceScatter`` and ``AllReduce`` over the
first dim, on a given ``torch.distributed`` process group, each with its matching
backward. Every rank of the group must run the same ops in the same order.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from fuseops.ops.contract import OpContext, OpGrads, Saved, TensorSpec
from fuseops.ops.op import BasicOp
from fuseops.ops.parallel import tensor_parallel as tp


@dataclass(frozen=True)
class CommSaved(Saved):
    pass


class _Collective(BasicOp):
    communicates = True

    def __init__(self, group: dist.ProcessGroup) -> None:
        super().__init__()
        self.group = tp.check_group("group", group)
        self.world_size = dist.get_world_size(group)

    def extra_repr(self) -> str:
        return f"world_size={self.world_size}"

    def _save(self, ctx: OpContext) -> None:
        if ctx.needs_backward:
            ctx.saved = CommSaved()


class _AdjointPair(_Collective):
    """A collective whose backward is another one (all-gather and reduce-scatter are each
    other's adjoint)."""

    forward_collective: Any
    backward_collective: Any

    def op_forward(self, ctx: OpContext, x: torch.Tensor, extra_inputs: tuple[Any, ...]):
        self._save(ctx)
        return type(self).forward_collective(x, self.group), ()

    def op_backward(self, ctx: OpContext, dy: torch.Tensor, extra_output_grads) -> OpGrads:
        return OpGrads(type(self).backward_collective(dy, self.group) if ctx.input_requires_grad else None)


class AllGather(_AdjointPair):
    """``y`` = every rank's ``x`` concatenated along the first dim, in rank order.

    Backward: reduce-scatter (each rank's ``dx`` is the sum over the ranks of their
    gradient for its chunk).

    Args:
        group: the ``torch.distributed`` process group of the P ranks.
    Shapes: x [n, ...] -> y [P * n, ...].
    """

    forward_collective = staticmethod(tp.all_gather)
    backward_collective = staticmethod(tp.reduce_scatter)

    def check(self, x: TensorSpec, extra_inputs: tuple[Any, ...]) -> TensorSpec:
        n = tp.first_dim("AllGather", x)
        return x.with_shape((n * self.world_size,) + x.shape[1:])


class ReduceScatter(_AdjointPair):
    """``y`` = this rank's chunk (by rank, along the first dim) of the sum of every
    rank's ``x``.

    Backward: all-gather of the output gradients.

    Args:
        group: the ``torch.distributed`` process group of the P ranks.
    Shapes: x [P * n, ...] (the first dim must divide by P) -> y [n, ...].
    """

    forward_collective = staticmethod(tp.reduce_scatter)
    backward_collective = staticmethod(tp.all_gather)

    def check(self, x: TensorSpec, extra_inputs: tuple[Any, ...]) -> TensorSpec:
        n = tp.divisible_first_dim("ReduceScatter", x, self.world_size)
        return x.with_shape((n // self.world_size,) + x.shape[1:])


class AllReduce(_Collective):
    """``y`` = the sum of every rank's ``x``.

    Backward: identity. As in Megatron's row-parallel reduction, what follows the sum is
    assumed to run redundantly on every rank, so each rank already holds the whole
    gradient of ``y`` (summing it again would count it P times).

    Args:
        group: the ``torch.distributed`` process group of the P ranks.
    Shapes: x [...] -> y [...] (same shape on every rank).
    """

    def check(self, x: TensorSpec, extra_inputs: tuple[Any, ...]) -> TensorSpec:
        return x

    def op_forward(self, ctx: OpContext, x: torch.Tensor, extra_inputs: tuple[Any, ...]):
        self._save(ctx)
        # The input may be the caller's tensor: reduce a copy.
        return tp.all_reduce_(x.clone(memory_format=torch.contiguous_format), self.group), ()

    def op_backward(self, ctx: OpContext, dy: torch.Tensor, extra_output_grads) -> OpGrads:
        return OpGrads(dy if ctx.input_requires_grad else None)
