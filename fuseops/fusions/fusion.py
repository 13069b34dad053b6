"""What a fusion is: a pattern of ops, the stage(s) it replaces, a guard, and the fused
forward and/or backward written against the basic ops' ``Saved`` records.

A forward-only fusion must leave every op's ``ctx.saved`` as that op's own forward
would, so that any backward plan can follow it. A fusion of both stages always runs
its own backward after its forward (the fuser places it in both directions), so its
forward may save only what its backward reads, still in the ops' ``Saved`` records.
"""

from __future__ import annotations

import contextlib
import enum
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from fuseops.ops.contract import OpContext, OpGrads
from fuseops.ops.op import BasicOp


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
    # The torch.autocast dtype the ops compute matmuls in (None outside autocast).
    autocast: torch.dtype | None = None
    # Inside ``measured_declines_ignored()``: guards skip their declines for measured speed.
    ignore_measured: bool = False


def same_extra_input(a: Any, b: Any) -> bool:
    """The same object, or equal host-side values (never reads device data; under
    torch.compile, tensors only by identity)."""
    if a is b:
        return True
    if torch.compiler.is_compiling() and (isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor)):
        # While tracing, a tensor's values are unknown: only the same object is the same.
        return False
    host = (list, tuple)
    if isinstance(a, torch.Tensor) and a.device.type == "cpu" and not a.is_floating_point():
        a = a.tolist()
    if isinstance(b, torch.Tensor) and b.device.type == "cpu" and not b.is_floating_point():
        b = b.tolist()
    return isinstance(a, host) and isinstance(b, host) and list(a) == list(b)


_ignore_measured = False


@contextlib.contextmanager
def measured_declines_ignored() -> Iterator[None]:
    """Plans made inside this block apply fusions that decline a case only because the unfused
    ops measured faster there (``measured_slower``): the property suites check such fusions
    this way, so that one declined everywhere by measurement stays verified."""
    global _ignore_measured
    before, _ignore_measured = _ignore_measured, True
    try:
        yield
    finally:
        _ignore_measured = before


def measured_declines_are_ignored() -> bool:
    return _ignore_measured


def measured_slower(cfg: PlanConfig, why: str) -> str | None:
    """A guard's decline that rests on a measurement (``why`` says which): ``why``, unless the
    plan is made inside ``measured_declines_ignored()``."""
    return None if cfg.ignore_measured else why


def unquantized(cfg: PlanConfig) -> str | None:
    """Fusions built on plain GEMMs step aside under a recipe: the ops' quantized GEMMs run."""
    return "quantized recipes run the ops' quantized GEMMs" if cfg.recipe is not None else None


def quantized(cfg: PlanConfig) -> str | None:
    """Fusions that hand a GEMM its input already quantized apply only under a recipe."""
    return "no recipe is active, so nothing is quantized" if cfg.recipe is None else None


class Fusion:
    """Base of every fusion. Subclasses declare ``pattern`` and ``stage`` and override
    ``guard`` and ``fused_forward`` and/or ``fused_backward``."""

    pattern: ClassVar[tuple[OpMatch, ...]]
    stage: ClassVar[Stage]

    @property
    def name(self) -> str:
        return type(self).__name__

    def guard(
        self, ops: Sequence[BasicOp], cfg: PlanConfig, extra_inputs: Sequence[tuple[Any, ...]]
    ) -> str | None:
        """Why this fusion does not apply to ``ops`` under ``cfg``, or None when it does.

        ``extra_inputs`` are the window's extra inputs per op, for checks such as two ops
        sharing one split-size tensor; plans are cached per which extra inputs are the
        same object, never per their values.
        """
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
