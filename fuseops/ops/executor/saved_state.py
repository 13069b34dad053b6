"""Saved state across the autograd boundary, by role: each activation tensor (and each
plain buffer of a quantized storage) becomes a slot filled from ``ctx.save_for_backward``,
so torch's saved-tensor hooks (offloading) see every buffer; parameters and meta stay as
plain references in the op's ``Saved`` record."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any, NamedTuple

import torch

from fuseops.ops.contract import FIELDS_BY_ROLE, OpContext, Saved, replaced_fields, role_fields


def _pack_storage(value: Any, tensors: list[torch.Tensor]) -> Any:
    """An activation field's value that is no plain tensor (``pack_saved`` slots those): a
    storage's buffers replaced by their indices in ``tensors``; anything else as it is."""
    if hasattr(value, "data_tensors"):
        buffers = value.data_tensors()
        tensors.extend(buffers)
        # The slot keeps the storage's layout over empty meta buffers: holding the real
        # ones here would keep them on the device past an offload.
        skeleton = value.with_data_tensors([torch.empty(0, device="meta") for _ in buffers])
        return _Slot(tuple(range(len(tensors) - len(buffers), len(tensors))), skeleton)
    return value


class _Slot(NamedTuple):
    """Where an activation went among the saved tensors (a named tuple: cheap to make and
    to read)."""

    positions: tuple[int, ...]
    storage: Any = None

    def unpack(self, tensors: Sequence[torch.Tensor]) -> Any:
        if self.storage is None:
            return tensors[self.positions[0]]
        return self.storage.with_data_tensors([tensors[i] for i in self.positions])


# A plain tensor's slot depends only on its position: made once, shared by every call.
_TENSOR_SLOTS = tuple(_Slot((i,)) for i in range(64))


def pack_saved(ctxs: Sequence[OpContext], *, compiling: bool) -> tuple[list[torch.Tensor], list[Saved | None]]:
    """The tensors for ``save_for_backward`` and each op's record with slots in their place
    (``compiling``: ``torch.compiler.is_compiling()``, asked once by the caller)."""
    tensors: list[torch.Tensor] = []
    records: list[Saved | None] = []
    for ctx in ctxs:
        saved = ctx.saved
        if saved is not None:
            packed = {}
            # (The eager lookup of ``role_fields`` inline: this runs per op and call.)
            names = None if compiling else FIELDS_BY_ROLE.get(saved.__class__)
            for name in (names or role_fields(saved, compiling=compiling)).activation:
                value = getattr(saved, name)
                if isinstance(value, torch.Tensor):
                    n = len(tensors)
                    # While tracing, a fresh slot: read from the shared table, each slot would
                    # cost guards on its fields at every call.
                    shared = not compiling and n < len(_TENSOR_SLOTS)
                    packed[name] = _TENSOR_SLOTS[n] if shared else _Slot((n,))
                    tensors.append(value)
                elif value is not None:
                    packed[name] = _pack_storage(value, tensors)
            saved = replaced_fields(saved, packed, compiling=compiling)
            # Drop the op's own reference so the packed copy is the only one.
            ctx.saved = None
        records.append(saved)
    return tensors, records


def activation_tensors(ctxs: Sequence[OpContext]) -> list[torch.Tensor]:
    """The tensors ``pack_saved`` would put in ``save_for_backward`` for these contexts'
    records, in its order (eager only: the save notice, ``save_notice.py``); reads the
    records without changing them."""
    tensors: list[torch.Tensor] = []
    for ctx in ctxs:
        saved = ctx.saved
        if saved is None:
            continue
        for name in role_fields(saved, compiling=False).activation:
            value = getattr(saved, name)
            if isinstance(value, torch.Tensor):
                tensors.append(value)
            elif value is not None and hasattr(value, "data_tensors"):
                tensors.extend(value.data_tensors())
    return tensors


def unpack_saved(
    records: Sequence[Saved | None], tensors: Sequence[torch.Tensor], *, compiling: bool
) -> list[Saved | None]:
    """Each op's record with its slots filled from ``tensors`` (``ctx.saved_tensors``)."""
    out = []
    for saved in records:
        if saved is not None:
            fields = {}
            names = None if compiling else FIELDS_BY_ROLE.get(saved.__class__)
            for name in (names or role_fields(saved, compiling=compiling)).activation:
                value = getattr(saved, name)
                if isinstance(value, _Slot):
                    fields[name] = tensors[value.positions[0]] if value.storage is None else value.unpack(tensors)
            saved = replaced_fields(saved, fields, compiling=compiling)
        out.append(saved)
    return out


# Set while a backward may not write into what it was given (``functional()``).
functional_backward: bool = False


@contextlib.contextmanager
def functional() -> Iterator[None]:
    """Inside: no backward writes its outputs over saved activations. For a backward of
    batched cotangents (``function.py``: its gradients are batched, the activations not)."""
    global functional_backward
    previous, functional_backward = functional_backward, True
    try:
        yield
    finally:
        functional_backward = previous


# Whether the running backward keeps its graph; None on a torch that cannot tell.
_KEEP_GRAPH = getattr(torch._C._autograd, "_get_current_graph_task_keep_graph", None)


def graph_freed_after_backward() -> bool:
    """Whether the backward now running frees its graph (neither ``retain_graph`` nor
    ``create_graph``): saved activations are then read for the last time, so a kernel may
    write its output over one it has consumed. False outside a backward, on a torch that
    cannot tell, while torch.compile traces (a compiled backward may be replayed) and inside
    ``functional()``."""
    if functional_backward or _KEEP_GRAPH is None or torch.compiler.is_compiling():
        return False
    return not _KEEP_GRAPH()
