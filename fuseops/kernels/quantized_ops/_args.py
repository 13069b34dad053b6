"""What the quantized custom ops pass instead of None, dataclasses and ``out=`` buffers.

A ``torch.library`` op takes and returns tensors, ints, floats, bools and dtypes: an
``Operand`` goes as its five fields, an ``Emitted`` or ``Buffers`` as its tensors with an
empty tensor where one is absent (the caller knows which are, from the format), and an op
never returns a tensor sharing memory with an input or with another of its outputs
(``owned``): the compiler's functional graph would otherwise alias them.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from fuseops.kernels.quantization import epilogue as qe
from fuseops.kernels.quantization.formats import Scaling
from fuseops.kernels.quantization.operand import Operand

# The schema text of one operand (``operand_schema("a")``) and its arguments (``operand_args``).
_OPERAND = "Tensor {0}, Tensor? {0}_scale, Tensor? {0}_outer, int {0}_rows_per_scale, bool {0}_outer_per_row"


def operand_schema(name: str) -> str:
    return _OPERAND.format(name)


def operand_args(op: Operand) -> tuple:
    return op.data, op.scale, op.outer, op.rows_per_scale, op.outer_per_row


def operand(data, scale, outer, rows_per_scale, outer_per_row) -> Operand:
    return Operand(data, scale, outer, rows_per_scale, outer_per_row)


def empty_like_none(like: torch.Tensor) -> torch.Tensor:
    """Custom ops cannot return None: an empty tensor stands for an absent output."""
    return like.new_empty(0)


def filled(tensors: Sequence[torch.Tensor | None], like: torch.Tensor) -> tuple[torch.Tensor, ...]:
    return tuple(empty_like_none(like) if t is None else t for t in tensors)


def kept(tensors: Sequence[torch.Tensor], present: Sequence[bool]) -> tuple[torch.Tensor | None, ...]:
    """The op's outputs with None back where the format writes nothing."""
    return tuple(t if p else None for t, p in zip(tensors, present, strict=True))


def emitted_present(scaling: Scaling, store_y: bool) -> tuple[bool, bool, bool, bool]:
    """Which of an ``Emitted``'s (y, data, scale, row_amax) a producer writes (``qe.allocate``)."""
    blocks = qe.blocks_in_epilogue(scaling)
    return store_y, blocks, blocks, not blocks


def fake_emitted(rows, cols, dtype: torch.dtype, like: torch.Tensor, scaling: Scaling, element,
                 store_y: bool) -> tuple[torch.Tensor, ...]:
    """Shapes and dtypes of a producer's outputs, absent ones empty (a fake implementation's)."""
    out = qe.allocate(rows, cols, dtype, like.device, scaling=scaling, element=element, store_y=store_y)
    return filled(out, like)


def into(out: Sequence[torch.Tensor | None] | None, values: Sequence[torch.Tensor | None]):
    """``values`` copied into the caller's ``out=`` buffers (where given), as a launcher writes them."""
    if out is None:
        return values
    for buf, value in zip(out, values, strict=True):
        if buf is not None and value is not None:
            buf.copy_(value)
    return out


def owned(outputs: Sequence[torch.Tensor], inputs: Sequence[torch.Tensor | None]) -> tuple[torch.Tensor, ...]:
    """``outputs`` with a copy wherever one shares memory with an input or an earlier output
    (a torch reference may hand back its input: the identity activation of float32 ``x``)."""
    seen = {t.untyped_storage().data_ptr() for t in inputs if t is not None and t.numel()}
    result = []
    for t in outputs:
        if t.numel():
            ptr = t.untyped_storage().data_ptr()
            if ptr in seen:
                t = t.clone()
                ptr = t.untyped_storage().data_ptr()
            seen.add(ptr)
        result.append(t)
    return tuple(result)
