"""The op contract as data: what a basic op saves (a frozen ``Saved`` record whose fields
carry a ``Role``), what the plan knows of a tensor before running (``TensorSpec``), an op's
per-call decisions (``OpContext``) and what its backward returns (``OpGrads``). ``op.py``
holds ``BasicOp``, the class that implements it; the executor needs only this module."""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple

import torch

if TYPE_CHECKING:
    from fuseops.quant.recipes import Recipe


_new_object = object.__new__


class Role(enum.Enum):
    """What a saved tensor is, which decides where it may live until backward."""

    ACTIVATION = "activation"
    PARAMETER = "parameter"
    META = "meta"

    # Enum's own hash, not an identity override: torch 2.11's dynamo refuses to hash an enum
    # whose __hash__ is overridden (fullgraph compile failed on the H100; test_compile.py).


def activation(default: Any = None) -> Any:
    """A ``Saved`` field holding an activation (offloadable)."""
    return dataclasses.field(default=default, metadata={"role": Role.ACTIVATION})


def parameter(default: Any = None) -> Any:
    """A ``Saved`` field holding a parameter (never offloaded)."""
    return dataclasses.field(default=default, metadata={"role": Role.PARAMETER})


def meta(default: Any = None) -> Any:
    """A ``Saved`` field holding small metadata (stays where it is)."""
    return dataclasses.field(default=default, metadata={"role": Role.META})


class RoleFields(NamedTuple):
    """A ``Saved`` class's field names by role, in ``Role``'s order. Attributes, not a dict
    keyed by ``Role``: an Enum member hashes through Python code, and the executor reads
    these per op and call."""

    activation: tuple[str, ...]
    parameter: tuple[str, ...]
    meta: tuple[str, ...]


# Per Saved class, the names of its fields of each role: read on every call by the executor,
# built once in eager mode (while torch.compile traces, built afresh: no side effect to trace).
FIELDS_BY_ROLE: dict[type, RoleFields] = {}
# A tuple, not the Enum class: dynamo cannot iterate an Enum class inside an autograd.Function's
# forward (``mode="reduce-overhead"`` on CUDA failed on it).
_ROLES: tuple[Role, ...] = tuple(Role)


def role_fields(record: Saved, *, compiling: bool) -> RoleFields:
    """Per role, the names of ``record``'s fields of that role. ``compiling`` is
    ``torch.compiler.is_compiling()``, asked once by the caller (the executor asks once a
    call, not once a record)."""
    if compiling:
        return RoleFields(*_traced_field_names(type(record))[:3])
    names = FIELDS_BY_ROLE.get(type(record))
    if names is None:
        names = FIELDS_BY_ROLE[type(record)] = RoleFields(*_field_names(type(record))[:3])
    return names


def _field_names(cls: type) -> tuple[tuple[str, ...], ...]:
    """A ``Saved`` class's field names of each role (``_ROLES``' order), then those its
    ``__init__`` takes."""
    fields = dataclasses.fields(cls)
    roles = [(f.name, f.metadata.get("role", Role.META)) for f in fields]
    by_role = tuple(tuple(name for name, r in roles if r is role) for role in _ROLES)
    return (*by_role, tuple(f.name for f in fields if f.init))


@torch.compiler.assume_constant_result
def _traced_field_names(cls: type) -> tuple[tuple[str, ...], ...]:
    """``_field_names`` as a constant of the trace: walked by dynamo, a record's fields cost
    guards on every field's metadata (and on the dataclass machinery) at every call."""
    return _field_names(cls)


def replaced_fields(record: Saved, changes: dict[str, Any], *, compiling: bool) -> Saved:
    """``record`` with ``changes``: ``dataclasses.replace`` without re-running ``__init__``
    and its field walk in eager mode (records have no ``__post_init__``); the executor
    makes two per op and call. ``compiling`` as for ``role_fields``."""
    if not changes:
        return record
    if compiling:
        # ``dataclasses.replace`` by hand, over field names dynamo takes as a constant.
        names = _traced_field_names(type(record))[3]
        return type(record)(**{n: changes[n] if n in changes else getattr(record, n) for n in names})
    new = object.__new__(type(record))
    new.__dict__.update(record.__dict__)
    new.__dict__.update(changes)
    return new


@dataclass(frozen=True)
class Saved:
    """Base of every op's saved-state record. Fields without a role are meta."""

    def fields_of(self, role: Role) -> tuple[str, ...]:
        """The names of this record's fields that hold ``role``."""
        return role_fields(self, compiling=torch.compiler.is_compiling())[_ROLES.index(role)]

    def fields_by_role(self) -> Iterator[tuple[str, Any, Role]]:
        for role, names in zip(_ROLES, role_fields(self, compiling=torch.compiler.is_compiling())):
            for name in names:
                yield name, getattr(self, name), role

    def replaced(self, changes: dict[str, Any]) -> Saved:
        """A copy with ``changes`` (``replaced_fields``)."""
        return replaced_fields(self, changes, compiling=torch.compiler.is_compiling())


@dataclass(frozen=True)
class TensorSpec:
    """What the plan knows about a tensor before running: enough to validate a chain."""

    shape: tuple[int, ...]
    dtype: torch.dtype
    device: torch.device
    # The ``torch.autocast`` dtype in effect for the chain (None outside autocast).
    autocast: torch.dtype | None = None

    @classmethod
    def of(cls, t: torch.Tensor, autocast: torch.dtype | None = None) -> TensorSpec:
        return cls(tuple(t.shape), t.dtype, t.device, autocast)

    # Constructor calls, not ``dataclasses.replace``: traced by torch.compile, that walks the
    # class's fields and guards on each at every call.
    def with_dtype(self, dtype: torch.dtype) -> TensorSpec:
        return TensorSpec(self.shape, dtype, self.device, self.autocast)

    def with_shape(self, shape: tuple[int, ...]) -> TensorSpec:
        return TensorSpec(tuple(shape), self.dtype, self.device, self.autocast)


@dataclass
class OpContext:
    """One op's per-call state: the decisions it is handed, and what it saved.

    ``input_requires_grad`` says whether backward must produce ``dx``;
    ``weight_requires_grad`` whether it must produce parameter gradients;
    ``extra_requires_grad`` the same for each extra input. ``saved`` is filled by the
    op's forward (or by a fused forward on its behalf) when backward will run.
    ``autocast`` is the ``torch.autocast`` dtype the call runs under (None outside
    autocast); backward reads it too, since torch's autocast is off by then
    (``fuseops/ops/_autocast.py`` has the policy).
    """

    recipe: "Recipe | None" = None
    training: bool = True
    input_requires_grad: bool = False
    weight_requires_grad: bool = False
    extra_requires_grad: tuple[bool, ...] = ()
    saved: Saved | None = None
    autocast: torch.dtype | None = None
    # The dtype of the op's input (its gradient goes back in it under autocast).
    input_dtype: torch.dtype | None = None

    def with_saved(self, saved: Saved | None) -> OpContext:
        """A copy holding ``saved`` (a constructor call, not ``dataclasses.replace``, so that
        torch.compile traces it)."""
        return OpContext(
            self.recipe, self.training, self.input_requires_grad, self.weight_requires_grad,
            self.extra_requires_grad, saved, self.autocast, self.input_dtype,
        )

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


def fresh_contexts(templates: Sequence[OpContext], records: Sequence[Saved | None] | None = None) -> list[OpContext]:
    """Copies of ``templates`` holding ``records`` (None: holding nothing): ``with_saved`` in
    eager mode, one call for all ops and no ``__init__`` per op (the executor makes a set in
    forward and another in backward, every call). Not for torch.compile's tracing, which takes
    ``with_saved``."""
    out = []
    for i, template in enumerate(templates):
        new = _new_object(OpContext)
        d = new.__dict__
        d.update(template.__dict__)
        d["saved"] = None if records is None else records[i]
        out.append(new)
    return out
