"""The basic-op contract.

A basic op is an ``nn.Module`` that owns its parameters and spells out its forward and
backward. It declares, as data, how many extra inputs it takes and extra outputs it
makes, and what it keeps for backward: a frozen ``Saved`` dataclass whose fields carry a
``Role`` (activations may be offloaded, parameters never, meta stays). The fuser runs
ops (or fused ops that borrow them) inside one autograd function; a fused forward fills
each op's ``Saved`` exactly as the op would, so the op's own backward can run after it.
"""

from __future__ import annotations

import abc
import dataclasses
import enum
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import torch

if TYPE_CHECKING:
    from fuseops.quant.recipes import Recipe


class Role(enum.Enum):
    """What a saved tensor is, which decides where it may live until backward."""

    ACTIVATION = "activation"
    PARAMETER = "parameter"
    META = "meta"


def activation(default: Any = None) -> Any:
    """A ``Saved`` field holding an activation (offloadable)."""
    return dataclasses.field(default=default, metadata={"role": Role.ACTIVATION})


def parameter(default: Any = None) -> Any:
    """A ``Saved`` field holding a parameter (never offloaded)."""
    return dataclasses.field(default=default, metadata={"role": Role.PARAMETER})


def meta(default: Any = None) -> Any:
    """A ``Saved`` field holding small metadata (stays where it is)."""
    return dataclasses.field(default=default, metadata={"role": Role.META})


@dataclass(frozen=True)
class Saved:
    """Base of every op's saved-state record. Fields without a role are meta."""

    def fields_by_role(self) -> Iterator[tuple[str, Any, Role]]:
        for f in dataclasses.fields(self):
            yield f.name, getattr(self, f.name), f.metadata.get("role", Role.META)


@dataclass(frozen=True)
class TensorSpec:
    """What the plan knows about a tensor before running: enough to validate a chain."""

    shape: tuple[int, ...]
    dtype: torch.dtype
    device: torch.device

    @classmethod
    def of(cls, t: torch.Tensor) -> TensorSpec:
        return cls(tuple(t.shape), t.dtype, t.device)

    def with_shape(self, shape: tuple[int, ...]) -> TensorSpec:
        return dataclasses.replace(self, shape=tuple(shape))


@dataclass
class OpContext:
    """One op's per-call state: the decisions it is handed, and what it saved.

    ``input_requires_grad`` says whether backward must produce ``dx``;
    ``weight_requires_grad`` whether it must produce parameter gradients;
    ``extra_requires_grad`` the same for each extra input. ``saved`` is filled by the
    op's forward (or by a fused forward on its behalf) when backward will run.
    """

    recipe: "Recipe | None" = None
    training: bool = True
    input_requires_grad: bool = False
    weight_requires_grad: bool = False
    extra_requires_grad: tuple[bool, ...] = ()
    saved: Saved | None = None

    @property
    def needs_backward(self) -> bool:
        return (
            self.input_requires_grad
            or self.weight_requires_grad
            or any(self.extra_requires_grad)
        )


@dataclass
class OpGrads:
    """What an op's backward returns: ``dx``, parameter grads by name, extra-input grads."""

    dx: torch.Tensor | None
    params: dict[str, torch.Tensor | None] = dataclasses.field(default_factory=dict)
    extra_inputs: tuple[torch.Tensor | None, ...] = ()


class BasicOp(torch.nn.Module, metaclass=abc.ABCMeta):
    """Base class of every basic op.

    Subclasses set ``num_extra_inputs`` / ``num_extra_outputs``, define a ``Saved``
    record, and implement ``check``, ``op_forward`` and ``op_backward``. Ops are run by
    ``fuseops.Sequential``; calling one directly runs it as a one-op Sequential would.
    """

    num_extra_inputs: ClassVar[int] = 0
    num_extra_outputs: ClassVar[int] = 0

    def check(self, x: TensorSpec, extra_inputs: tuple[Any, ...]) -> TensorSpec:
        """Validate the input (and extra inputs) and return the output's spec.

        Raises ``TypeError``/``ValueError`` naming the argument, the value given and
        the value expected. Runs on the host before anything is launched.
        """
        return x

    @abc.abstractmethod
    def op_forward(
        self, ctx: OpContext, x: torch.Tensor, extra_inputs: tuple[Any, ...]
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
        """Compute ``(y, extra_outputs)``; set ``ctx.saved`` when ``ctx.needs_backward``."""

    @abc.abstractmethod
    def op_backward(
        self,
        ctx: OpContext,
        dy: torch.Tensor,
        extra_output_grads: tuple[torch.Tensor | None, ...],
    ) -> OpGrads:
        """Gradients from ``ctx.saved`` and the output gradient(s)."""

    def forward(self, x: torch.Tensor, *extra_inputs: Any) -> Any:
        """Run this op alone, exactly as a one-op ``fuseops.Sequential`` would."""
        from fuseops.ops.execute import run_ops

        return run_ops([self], x, extra_inputs)
