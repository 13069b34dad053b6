"""What a fusion is: a pattern of ops, the stage(s) it replaces, a guard, and the fused
forward and/or backward written against the basic ops' ``Saved`` records.

A fused forward must leave every op's ``ctx.saved`` as that op's own forward would
(or as the matching fused backward expects), so that forward and backward can be
planned independently.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from fuseops.ops.op import BasicOp, OpContext, OpGrads


class Stage(enum.Flag):
    FORWARD = enum.auto()
    BACKWARD = enum.auto()
    BOTH = FORWARD | BACKWARD


@dataclass(frozen=True)
class OpMatch:
    """One pattern element: an op of one of ``types`` for which ``where`` holds."""

    types: tuple[type[BasicOp], ...]
    where: Callable[[BasicOp], bool] | None = None

    def matches(self, op: BasicOp) -> bool:
        return isinstance(op, self.types) and (self.where is None or self.where(op))


def match(*types: type[BasicOp], where: Callable[[BasicOp], bool] | None = None) -> OpMatch:
    return OpMatch(tuple(types), where)


@dataclass(frozen=True)
class PlanConfig:
    """What a plan is cached by, and what guards may look at besides the ops."""

    recipe: Any
    dtype: torch.dtype
    device_type: str
    input_requires_grad: bool
    grad_enabled: bool
    # Kernels run for this device (CUDA, or CPU under interpreted_kernels()).
    triton: bool


class Fusion:
    """Base of every fusion. Subclasses declare ``pattern`` and ``stage`` and override
    ``guard`` and ``fused_forward`` and/or ``fused_backward``."""

    pattern: ClassVar[tuple[OpMatch, ...]]
    stage: ClassVar[Stage]

    @property
    def name(self) -> str:
        return type(self).__name__

    def matches(self, ops: Sequence[BasicOp]) -> bool:
        return len(ops) == len(self.pattern) and all(m.matches(op) for m, op in zip(self.pattern, ops))

    def guard(self, ops: Sequence[BasicOp], cfg: PlanConfig) -> str | None:
        """Why this fusion does not apply to ``ops`` under ``cfg``, or None when it does."""
        return None

    def fused_forward(
        self,
        ops: Sequence[BasicOp],
        ctxs: Sequence[OpContext],
        x: torch.Tensor,
        extra_inputs: Sequence[tuple[Any, ...]],
    ) -> tuple[torch.Tensor, list[tuple[torch.Tensor, ...]]]:
        raise TypeError(f"{self.name} declares stage {self.stage} and has no fused forward")

    def fused_backward(
        self,
        ops: Sequence[BasicOp],
        ctxs: Sequence[OpContext],
        dy: torch.Tensor,
        extra_output_grads: Sequence[tuple[torch.Tensor | None, ...]],
    ) -> list[OpGrads]:
        raise TypeError(f"{self.name} declares stage {self.stage} and has no fused backward")
