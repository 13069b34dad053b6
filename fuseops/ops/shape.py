"""Ops that move no maths: Identity, Reshape, Dropout; and ``rows``/``unrows``, the reshapes
the other ops do around their 2-D kernels."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from fuseops.ops import _checks
from fuseops.ops.contract import OpContext, OpGrads, Saved, TensorSpec, activation, meta
from fuseops.ops.op import BasicOp


def rows(t: torch.Tensor, n: int) -> torch.Tensor:
    """``t`` as [rows, n]: itself when it already is (a view costs about a microsecond of
    host time, and the ops make several per call)."""
    return t if t.dim() == 2 and t.shape[1] == n else t.reshape(-1, n)


def unrows(t2d: torch.Tensor, shape: torch.Size | tuple[int, ...]) -> torch.Tensor:
    """``t2d`` viewed as ``shape`` (itself when it has that shape already)."""
    return t2d if t2d.shape == shape else t2d.view(shape)


@dataclass(frozen=True)
class ShapeSaved(Saved):
    shape: tuple[int, ...] = meta(())


class Identity(BasicOp):
    """``y = x``."""

    def op_forward(self, ctx: OpContext, x: torch.Tensor, extra_inputs: tuple[Any, ...]):
        if ctx.needs_backward:
            ctx.saved = ShapeSaved()
        return x, ()

    def op_backward(self, ctx: OpContext, dy: torch.Tensor, extra_output_grads) -> OpGrads:
        return OpGrads(dy)


class Reshape(BasicOp):
    """``y = x.reshape(shape)``; one dim may be -1. ``shape`` is an int or a tuple/list of
    ints, as ``torch.reshape`` takes (``Reshape(4)`` is ``Reshape((4,))``)."""

    def __init__(self, shape: int | tuple[int, ...] | list[int]) -> None:
        super().__init__()
        if isinstance(shape, int) and not isinstance(shape, bool):
            shape = (shape,)
        if not isinstance(shape, (tuple, list, torch.Size)):
            raise TypeError(f"shape: expected an int or a tuple of ints, got {shape!r}")
        shape = tuple(shape)
        if (not all(isinstance(d, int) and not isinstance(d, bool) and (d > 0 or d == -1) for d in shape)
                or shape.count(-1) > 1):
            raise ValueError(f"shape: expected positive ints with at most one -1, got {list(shape)}")
        self.shape = shape

    def extra_repr(self) -> str:
        return f"shape={list(self.shape)}"

    def check(self, x: TensorSpec, extra_inputs: tuple[Any, ...]) -> TensorSpec:
        numel = math.prod(x.shape)
        # A list, not a generator: torch.compile cannot trace math.prod of a generator.
        known = math.prod([d for d in self.shape if d != -1])
        ok = numel % known == 0 if -1 in self.shape else numel == known
        if not ok:
            raise ValueError(f"Reshape input: shape {_checks.shown(x.shape)} cannot be reshaped to {list(self.shape)}")
        return x.with_shape(tuple(numel // known if d == -1 else d for d in self.shape))

    def op_forward(self, ctx: OpContext, x: torch.Tensor, extra_inputs: tuple[Any, ...]):
        if ctx.needs_backward:
            ctx.saved = ShapeSaved(tuple(x.shape))
        return x.reshape(self.shape), ()

    def op_backward(self, ctx: OpContext, dy: torch.Tensor, extra_output_grads) -> OpGrads:
        return OpGrads(dy.reshape(ctx.saved.shape))


@dataclass(frozen=True)
class DropoutSaved(Saved):
    # Kept in the input dtype, already scaled by 1 / (1 - p).
    mask: torch.Tensor | None = activation()


class Dropout(BasicOp):
    """Zeroes each element with probability ``p`` in training and scales the rest by
    ``1 / (1 - p)``; identity in eval mode."""

    def __init__(self, p: float = 0.5) -> None:
        super().__init__()
        self.p = _checks.probability("p", p)

    def extra_repr(self) -> str:
        return f"p={self.p}"

    def op_forward(self, ctx: OpContext, x: torch.Tensor, extra_inputs: tuple[Any, ...]):
        if not ctx.training or self.p == 0.0:
            if ctx.needs_backward:
                ctx.saved = DropoutSaved()
            return x, ()
        keep = torch.empty_like(x).bernoulli_(1.0 - self.p)
        scale = keep.mul_(1.0 / (1.0 - self.p))
        if ctx.needs_backward:
            ctx.saved = DropoutSaved(mask=scale)
        return x * scale, ()

    def op_backward(self, ctx: OpContext, dy: torch.Tensor, extra_output_grads) -> OpGrads:
        mask = ctx.saved.mask
        return OpGrads(dy if mask is None else dy * mask)
