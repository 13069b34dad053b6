"""The padded layout of grouped quantized tensors, and how kernels find a tile's rows in it.

Grouped tensors (rows grouped by device offsets) keep their column-wise (transposed) copy in a
padded layout: row r of group g lands at position ``128 * (offsets[g] // 128 + g) + r``; rows
between a group's end and the next multiple of 128 hold zeros. Blocks along rows then never
straddle groups, each group starts 128-aligned (TMA), and a reduction over a group's rows needs
no masks. ``padded_rows(M, G)`` positions cover every group.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

GROUP_ALIGN = 128
_GROUP_ALIGN = tl.constexpr(GROUP_ALIGN)


def padded_rows(rows: int, groups: int) -> int:
    """Positions of the padded grouped layout for ``rows`` rows in ``groups`` groups."""
    return GROUP_ALIGN * (rows // GROUP_ALIGN + groups)


@triton.jit
def locate_rows(offsets, pos, G, BLOCK_G: tl.constexpr):
    """For padded position ``pos`` of a grouped layout: ``(g, row, rows)``, the group whose
    rows it holds, the (global) row at ``pos`` and how many of the group's rows remain from
    it; rows = 0 where ``pos`` lies in padding (g = 0 then)."""
    offs_g = tl.arange(0, BLOCK_G)
    mask_g = offs_g < G
    start = tl.load(offsets + offs_g, mask=mask_g, other=0)
    end = tl.load(offsets + offs_g + 1, mask=mask_g, other=0)
    first = (start // _GROUP_ALIGN + offs_g) * _GROUP_ALIGN
    inside = mask_g & (first <= pos) & (pos < first + end - start)
    g = tl.sum(tl.where(inside, offs_g, 0))
    row = tl.sum(tl.where(inside, start + pos - first, 0))
    rows = tl.sum(tl.where(inside, end - start - (pos - first), 0))
    return g, row, rows.to(tl.int32)


@triton.jit
def tile_rows(offsets, pid_r, pid_b, R, G, GROUPED: tl.constexpr, BLOCK_R: tl.constexpr,
              BLOCK_G: tl.constexpr):
    """Row tile ``pid_r``: (its tensor or group, first row, valid rows from there)."""
    pos = pid_r * BLOCK_R
    if GROUPED:
        g, row0, rows = locate_rows(offsets, pos, G, BLOCK_G)
    else:
        g = pid_b
        row0 = pos
        rows = R - pos
    return g, row0, rows


@triton.jit
def source_rows(src_rows, rows, mask, GATHER: tl.constexpr):
    """The rows of ``x`` that the tensor's rows ``rows`` are: ``src_rows[rows]`` with GATHER (the
    tensor is ``x[src_rows]``, never written out: MoE's permuted tokens), else ``rows``. In
    ``rows``' dtype whatever ``src_rows``' is: the compiler wants one return type across both
    branches (int64 picked rows fail to compile on the GPU; the interpreter does not check), and
    a row of ``x`` fits it (the host check bounds picked rows by x's row count)."""
    if GATHER:
        return tl.load(src_rows + rows, mask=mask, other=0).to(rows.dtype)
    return rows


@triton.jit
def load_tile(x, src_rows, pid_b, row0, rows, pid_c, C, stride_xb, stride_xr, BLOCK_R: tl.constexpr,
              BLOCK_C: tl.constexpr, GATHER: tl.constexpr):
    """Float32 [BLOCK_R, BLOCK_C] tile at (row0, column tile pid_c), zeros outside; rows
    through ``src_rows`` with GATHER (``source_rows``)."""
    offs_r = tl.arange(0, BLOCK_R)
    cols = pid_c * BLOCK_C + tl.arange(0, BLOCK_C)
    mask_r = offs_r < rows
    x_rows = source_rows(src_rows, row0 + offs_r, mask_r, GATHER)
    ptrs = x + pid_b * stride_xb + x_rows[:, None] * stride_xr + cols[None, :]
    # [BLOCK_R, BLOCK_C]
    return tl.load(ptrs, mask=mask_r[:, None] & (cols < C)[None, :], other=0.0).to(tl.float32)


@triton.jit
def group_first_position(offsets, g):
    """Padded position of group g's first row."""
    return (tl.load(offsets + g) // _GROUP_ALIGN + g) * _GROUP_ALIGN


def group_positions(offsets: torch.Tensor, rows: int) -> torch.Tensor:
    """Padded position (int64 [rows]) of each row of a grouped tensor, on device without a sync."""
    row = torch.arange(rows, device=offsets.device)
    g = torch.searchsorted(offsets[1:], row, right=True)
    start = offsets[g]
    return GROUP_ALIGN * (start // GROUP_ALIGN + g) + row - start


def group_of_positions(offsets: torch.Tensor, positions: int) -> torch.Tensor:
    """Group (int64 [positions]) whose rows or padding each padded position belongs to."""
    first = GROUP_ALIGN * (offsets[:-1] // GROUP_ALIGN + torch.arange(offsets.shape[0] - 1, device=offsets.device))
    pos = torch.arange(positions, device=offsets.device)
    return (torch.searchsorted(first, pos, right=True) - 1).clamp(min=0)
