"""Saved state across the autograd boundary, by role: each activation tensor (and each
plain buffer of a quantized storage) becomes a slot filled from ``ctx.save_for_backward``,
so torch's saved-tensor hooks (offloading) see every buffer; parameters and meta stay as
plain references in the op's ``Saved`` record."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import torch

from fuseops.ops.contract import OpContext, Role, Saved


def _pack(value: Any, tensors: list[torch.Tensor]) -> Any:
    """An activation field's value with its tensors replaced by their index in ``tensors``
    (storages buffer by buffer)."""
    if isinstance(value, torch.Tensor):
        tensors.append(value)
        return _Slot((len(tensors) - 1,))
    if hasattr(value, "data_tensors"):
        buffers = value.data_tensors()
        tensors.extend(buffers)
        # The slot keeps the storage's layout over empty meta buffers: holding the real
        # ones here would keep them on the device past an offload.
        skeleton = value.with_data_tensors([torch.empty(0, device="meta") for _ in buffers])
        return _Slot(tuple(range(len(tensors) - len(buffers), len(tensors))), skeleton)
    return value


class _Slot(NamedTuple):
    """Where an activation went among the saved tensors (a named tuple: one is made per
    saved tensor and call)."""

    positions: tuple[int, ...]
    storage: Any = None

    def unpack(self, tensors: Sequence[torch.Tensor]) -> Any:
        if self.storage is None:
            return tensors[self.positions[0]]
        return self.storage.with_data_tensors([tensors[i] for i in self.positions])


def pack_saved(ctxs: Sequence[OpContext]) -> tuple[list[torch.Tensor], list[Saved | None]]:
    """The tensors for ``save_for_backward`` and each op's record with slots in their place."""
    tensors: list[torch.Tensor] = []
    records: list[Saved | None] = []
    for ctx in ctxs:
        saved = ctx.saved
        if saved is not None:
            packed = {}
            for name in saved.fields_of(Role.ACTIVATION):
                value = getattr(saved, name)
                if value is not None:
                    packed[name] = _pack(value, tensors)
            saved = saved.replaced(packed)
            # Drop the op's own reference so the packed copy is the only one.
            ctx.saved = None
        records.append(saved)
    return tensors, records


def unpack_saved(records: Sequence[Saved | None], tensors: Sequence[torch.Tensor]) -> list[Saved | None]:
    """Each op's record with its slots filled from ``tensors`` (``ctx.saved_tensors``)."""
    out = []
    for saved in records:
        if saved is not None:
            fields = {}
            for name in saved.fields_of(Role.ACTIVATION):
                value = getattr(saved, name)
                if isinstance(value, _Slot):
                    fields[name] = value.unpack(tensors)
            saved = saved.replaced(fields)
        out.append(saved)
    return out


def graph_freed_after_backward() -> bool:
    """Whether the backward now running frees its graph (neither ``retain_graph`` nor
    ``create_graph``): saved activations are then read for the last time, so a kernel may
    write its output over one it has consumed. False outside a backward, on a torch that
    cannot tell, or while torch.compile traces (a compiled backward may be replayed)."""
    if torch.compiler.is_compiling():
        return False
    probe = getattr(torch._C._autograd, "_get_current_graph_task_keep_graph", None)
    return probe is not None and not probe()
