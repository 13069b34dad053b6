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
import enum
from typing import Any, ClassVar, NoReturn

import torch

from fuseops.ops.contract import OpContext, OpGrads, TensorSpec
from fuseops.ops.executor.execute import run_ops

# What ``_changed`` reads as a setting (an IntEnum is an int; a plain Enum is listed).
_SETTING_TYPES = (bool, int, float, str, tuple, type(None), enum.Enum, torch.dtype)


# Moves whenever an op's setting (a plain attribute value: ``_SETTING_TYPES``) changes value after
# it was first set, or a public object attribute of it is replaced (``_changed``), on any op: a
# ``Sequential`` drops what it decided from its ops' settings (its plans and prepared runs) at its
# next call after it moved, as torch.nn reads ``eps`` at every call. One counter for every op:
# such a change is rare, and an op knows no Sequential that holds it.
settings_epoch = 0
_UNSET = object()


def _changed(name: str, old: Any, new: Any) -> bool:
    """Whether setting attribute ``name`` to ``new`` over ``old`` (its value before, ``_UNSET``
    where it had none) changes what the op does: a setting of another value, or a public object
    replaced by another (a ``TensorParallel``, a process group: a plan holds what it read of
    them). Not an object under a private name (an op's own state)."""
    if old is _UNSET or old is new:
        return False
    old_setting, new_setting = isinstance(old, _SETTING_TYPES), isinstance(new, _SETTING_TYPES)
    if old_setting and new_setting:
        return type(old) is not type(new) or old != new
    return old_setting or new_setting or not name.startswith("_")


# Every op class, at the position its ``class_code`` says (set when the class is defined). The
# fuser matches op types by these ints under torch.compile: reading the classes themselves in
# a trace costs guards on every call (``fuseops.fuser``).
OP_CLASSES: list[type[BasicOp]] = []


def refuse_torchscript(module: torch.nn.Module) -> NoReturn:
    """``torch.jit.script`` of a fuseops module, or of a model holding one (torch calls each
    submodule's ``__prepare_scriptable__`` first): TorchScript compiles neither the executor's
    Python nor the Triton kernels, and failed deep inside its frontend with an unrelated message."""
    raise TypeError(
        f"torch.jit.script: {type(module).__name__} cannot be scripted (TorchScript compiles neither fuseops' "
        "executor nor its Triton kernels); use torch.compile, or torch.export for a saved program"
    )


class BasicOp(torch.nn.Module, metaclass=abc.ABCMeta):
    """Base class of every basic op.

    Subclasses set ``num_extra_inputs`` / ``num_extra_outputs``, define a ``Saved``
    record, and implement ``check``, ``op_forward`` and ``op_backward``. Ops are run by
    ``fuseops.Sequential``; calling one directly runs it as a one-op Sequential would.
    """

    num_extra_inputs: ClassVar[int] = 0
    num_extra_outputs: ClassVar[int] = 0
    class_code: ClassVar[int]
    # Whether its forward runs ``torch.distributed`` collectives, which torch does not
    # differentiate: such an op refuses forward-mode derivatives (``executor/plain_autograd.py``).
    communicates: ClassVar[bool] = False
    # A fusion takes an op by its class, so it must know what the class computes: fuseops' own
    # op classes, and a subclass that sets ``computes_as_parent = True`` in its own body (a promise
    # that its forward and backward compute what its parent's do, e.g. one that only adds a
    # ``extra_repr``). Any other subclass runs its own ``op_forward`` / ``op_backward``, never a
    # fusion of its parent; ``Sequential.plan.declined`` says so.
    computes_as_parent: ClassVar[bool] = False
    # Set per class when it is defined: whether fusions may take its ops (see above).
    fusible: ClassVar[bool] = False

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

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        # Appended first, then found: two classes defined at once in two threads cannot share
        # a code (``append`` is atomic; a length read before it is not).
        OP_CLASSES.append(cls)
        cls.class_code = OP_CLASSES.index(cls)
        shipped = cls.__module__.partition(".")[0] == "fuseops"
        declared = cls.__dict__.get("computes_as_parent", False) is True
        parents = [b for b in cls.__bases__ if issubclass(b, BasicOp)]
        cls.fusible = shipped or (declared and all(b is BasicOp or b.fusible for b in parents))

    def __setattr__(self, name: str, value: Any) -> None:
        global settings_epoch
        old = self.__dict__.get(name, _UNSET)
        super().__setattr__(name, value)
        # (The training flag is part of each call's signature: flipping it drops nothing.)
        if name != "training" and _changed(name, old, value):
            settings_epoch += 1

    @classmethod
    def unfusible_reason(cls) -> str | None:
        """Why no fusion may take an op of this class (None when fusions may)."""
        if cls.fusible:
            return None
        parent = next((b for b in cls.__mro__[1:] if issubclass(b, BasicOp) and b.fusible), BasicOp)
        return (f"{cls.__name__} subclasses {parent.__name__} without declaring computes_as_parent = True: "
                "it runs its own forward and backward, never a fusion of its parent's")

    def own_parameters(self) -> list[tuple[str, torch.nn.Parameter]]:
        """``named_parameters(recurse=False)`` without its generator machinery (the
        executor reads it per call)."""
        return [(name, p) for name, p in self._parameters.items() if p is not None]

    def __prepare_scriptable__(self) -> NoReturn:
        refuse_torchscript(self)

    def forward(self, x: torch.Tensor, *extra_inputs: Any) -> Any:
        """Run this op alone, exactly as a one-op ``fuseops.Sequential`` would."""
        return run_ops([self], x, extra_inputs)
