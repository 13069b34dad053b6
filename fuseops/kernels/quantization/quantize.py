"""Quantize kernels: per-tensor amax, then one cast pass writing the row-wise and column-wise copies.

``x`` [B, R, C] holds B independent tensors (B = 1 for activations with their rows flattened,
B = G for the stacked weights of G groups), or, with ``offsets`` [G + 1], one [M, C] tensor
(B = 1) whose rows are grouped, each group its own tensor for the per-tensor scale.
``quantize`` writes, in a format of quantization/formats.py (whose docstring has the maths):

- row-wise ``data`` [B, R, C] (E2M1: [B, R, ceil(C / 2)] bytes), blocks along C, with ``scale``
  [B, R, cdiv(C, blk)], or [B, cdiv(R, 128), cdiv(C, 128)] for 128x128 tiles (``block_2d``);
- column-wise ``data_t`` [B, C, R'] (E2M1: [B, C, ceil(R' / 2)]), the quantized transpose with
  blocks along rows, with ``scale_t`` [B, C, cdiv(R', blk)] (tiles: ``scale`` transposed);
  R' = R, or ``padded_rows(M, G)`` positions of the padded grouped layout.

TENSOR and NVFP4 read each tensor's ``encode`` scale from device memory (``amax`` then
``tensor_encode_scale``), so nothing syncs with the host. With ``rows`` (int64 [R']) the tensor
quantized is ``x[0, rows]``, each of its rows loaded from where it lies in ``x`` (GATHER): MoE's
permuted tokens quantized without writing the permuted copy (the amax kernel takes ``rows`` too).

Tiling: one program per [BLOCK_R, BLOCK_C] tile (for grouped rows, per tile of the padded
layout, which holds one group's rows) loads it once and writes both copies from registers,
padding tiles zeros. The tile is held as [NC, NR, K, V] chunks, a thread's chunk K rows of one
16-byte load (V values): blocks along a row span BLOCK / V threads, blocks along a column
BLOCK / K threads (reductions in registers, then warp shuffles), E2M1 pairs sit in one
thread either way. The transpose is stored from registers as runs of K codes, or (``staged``)
through shared memory as the tile's whole column segments. Row tiles run in groups across the
column tiles (``group_r``), so each scale line fills while it is in L2.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import torch
import triton
import triton.language as tl

from fuseops.kernels._triton import INTERPRET, cdiv, next_power_of_2
from fuseops.kernels.launch import launch
from fuseops.kernels.quantization.finite import (
    any_non_finite,
    dtype_max,
    fit_limit,
    non_finite,
    plain_limit,
    reference_finite_abs,
    reference_fit_source,
)
from fuseops.kernels.quantization.formats import (
    BLOCK_SIZE,
    STORAGE_DTYPE,
    Element,
    Scaling,
    cast_fp8,
    cast_fp8_within,
    convert_fp8,
    exp2i,
    finite_amax,
    pow2_exponent,
    reference_e2m1_encode,
    reference_exp2i,
    reference_pack_e2m1,
    reference_pow2_exponent,
    reference_to_fp8,
)
from fuseops.kernels.quantization.grouped_layout import (
    group_of_positions,
    group_positions,
    padded_rows,
    source_rows,
    tile_rows,
)
from fuseops.kernels.quantization.tiles import block_peaks, chunk_offsets, store_blocks, store_chunks


class Buffers(NamedTuple):
    """What ``quantize`` writes; None where a copy was not asked for (or TENSOR's scales)."""

    data: torch.Tensor | None
    scale: torch.Tensor | None
    data_t: torch.Tensor | None
    scale_t: torch.Tensor | None


class QuantizeConfig(NamedTuple):
    """A tiling of ``quantize_kernel`` (a plain (block_r, block_c, num_warps) takes the defaults).

    staged: the column-wise codes of 1D-block formats go through shared memory, so that a warp
        stores whole column segments, 16 bytes a thread; from registers a warp's runs along a
        column are 8 to 32 bytes (K codes a thread; on the H100, 16-byte runs cost the cast
        half again as much as 32-byte ones).
    group_r: 0 runs every row tile of a column strip before the next strip, so the column tiles
        sharing a 32-byte sector of row-wise scales run tens of MB of traffic apart and the
        sector may leave L2 half written; else groups of ``group_r`` row tiles cross all column
        tiles in turn, filling the sectors of either copy's scales within a group.
    maxnreg: a register cap for ptxas (0: its own choice), which otherwise sizes the kernel for
        the rare path of the 1D-block formats (``_quantize_tile_whole_rules``) and spends
        registers on the plain one that it does not need: under the cap the plain path keeps
        the same instructions and does not spill.
    """

    block_r: int
    block_c: int
    num_warps: int
    staged: bool = False
    group_r: int = 0
    maxnreg: int = 0


@functools.cache
def _configs() -> dict[tuple[Scaling, bool], QuantizeConfig]:
    """The tiling by (format, whether the column-wise copy is written). BLOCK_R divides 128
    (the grouped layout's alignment) and is a multiple of the block along rows; BLOCK_C a
    multiple of the block. Chosen on the H100 by ``python -m benchmarks.quantize --tune``
    (bf16 [16384, 4096]): with the column-wise copy, 8 warps staging the transpose in groups of
    8 row tiles took BLOCK from 0.78 to 0.85 of a device copy, MX from 0.75 to 0.82 and NVFP4's
    cast from 0.156 to 0.114 ms (CUDA graphs; TENSOR's copies share one multiplier, so staging
    would move the bf16 input instead). The sweep's candidates compile for sm_90 without spills.

    TENSOR with the column-wise copy: 128x64 (with 128x128 the four grouped casts of a
    Qwen3-30B-A3B FP8 step took 3.97 ms against 3.37, ``benchmarks.moe_quantize``, H100). With
    the non-finite codes on a rare path (``_store_non_finite``) 128x128 takes 168 registers
    without spills (sm_90a), and grouped casts of a permuted tensor use it (``_GROUPED_TENSOR``;
    picked rows ``_GATHERED_TENSOR``).

    Register caps (``python -m benchmarks.sm90_report quantize``, bf16): uncapped, ptxas sizes
    the staged column-wise tiles for the rare non-finite path, BLOCK 167 registers (one
    256-thread program per SM), NVFP4 144, MX 94; capped at 128 / 80 / 64 (two, three and four
    programs per SM) the plain path does not spill (the rare path: 8, 192 and 0 bytes). BLOCK
    row-wise: 4 warps capped at 128 registers (the plain path spills a little), timed on the
    H100 against 8 warps uncapped (71 registers) and 4 uncapped (154): 0.0785 / 0.0855 /
    0.0895 ms for bf16 [16384, 4096] (``benchmarks.quantize --tune``).
    """
    if INTERPRET:
        # Staged and grouped, so the tests cover both (the plain path: test_every_chunk_height).
        return {(s, c): QuantizeConfig(128, 128, 4, staged=True, group_r=2) for s in Scaling for c in (False, True)}
    return {
        (Scaling.TENSOR, False): QuantizeConfig(32, 256, 4), (Scaling.TENSOR, True): QuantizeConfig(128, 64, 4),
        (Scaling.BLOCK, False): QuantizeConfig(128, 128, 4, group_r=8, maxnreg=128),
        (Scaling.BLOCK, True): QuantizeConfig(128, 128, 8, staged=True, group_r=8, maxnreg=128),
        (Scaling.MX, False): QuantizeConfig(32, 256, 4, group_r=8),
        (Scaling.MX, True): QuantizeConfig(128, 64, 8, staged=True, group_r=8, maxnreg=64),
        (Scaling.NVFP4, False): QuantizeConfig(32, 128, 4),
        (Scaling.NVFP4, True): QuantizeConfig(128, 64, 8, staged=True, group_r=8, maxnreg=80),
    }


# TENSOR with the column-wise copy, grouped, rows read in place (an MoE layer's permuted
# activations: h, dz; the composition's x_sorted, dy_sorted): 128x128 in groups of 8 row tiles.
# ``benchmarks.moe_quantize`` on the H100 (buffers bit for bit equal across tilings) at
# Qwen3-30B-A3B's 128 groups: x_sorted / h / dy_sorted / dz 0.768 / 0.293 / 0.769 / 0.580 ms
# against 128x64's 0.965 / 0.367 / 0.962 / 0.732 (1.17 / 0.94 / 1.17 / 0.94 of a device copy
# against 0.93 / 0.75 / 0.94 / 0.74). Not where rows are picked (``rows=``, the quantized
# layer's x and dy: 0.755 ms against 128x64's 0.679) nor for other casts: with it for every
# per-tensor cast the quantized layer's step at Qwen3 is slower (13.01 ms a micro-batch of
# eight against 12.77-12.81, 14.67 against 14.11 with one).
_GROUPED_TENSOR = QuantizeConfig(128, 128, 4, group_r=8)
# The same cast where rows are picked (``rows=``): 128x128 in program order
# (``benchmarks.moe_quantize``, H100, rows in permute's order, Qwen3-30B-A3B): x / dy 0.567 /
# 0.572 ms against 128x64's 0.681 / 0.682 and 0.766 / 0.766 in groups of 8 (1.58 of a device
# copy against 1.32 and 1.17): the picked rows are scattered, so grouping row tiles keeps
# nothing in cache and only delays the column-wise stores.
_GATHERED_TENSOR = QuantizeConfig(128, 128, 4)
# 128x128 blocks (weights): one multiplier a tile, which is one block; 0.89 of a device copy
# row-wise, 0.92 with the column-wise copy on the H100.
_TILE_2D = QuantizeConfig(128, 128, 4)


def pick_config(scaling: Scaling, block_2d: bool, columnwise: bool, *, grouped: bool, gathered: bool) -> QuantizeConfig:
    """The tiling ``quantize`` launches with: ``_TILE_2D``, ``_GROUPED_TENSOR``, ``_GATHERED_TENSOR``
    or ``_configs()``'s."""
    if block_2d:
        return _TILE_2D
    if scaling == Scaling.TENSOR and columnwise and grouped and not INTERPRET:
        return _GATHERED_TENSOR if gathered else _GROUPED_TENSOR
    return _configs()[scaling, columnwise]


@triton.jit
def quantize_kernel(
    x, src_rows, offsets, encode, data, scale, data_t, scale_t,
    R, C, G, RP, C_STORED, RP_STORED,
    stride_xb, stride_xr, stride_db, stride_dr, stride_sb, stride_sr,
    stride_tb, stride_tc, stride_ub, stride_uc,
    SCALING: tl.constexpr, ELEM: tl.constexpr, BLOCK: tl.constexpr, BLOCK_2D: tl.constexpr,
    ROWWISE: tl.constexpr, COLUMNWISE: tl.constexpr, GROUPED: tl.constexpr,
    BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_G: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
    STAGED: tl.constexpr, GROUP_R: tl.constexpr, GATHER: tl.constexpr,
):
    if GROUP_R == 0:
        pid_r = tl.program_id(0)
        pid_c = tl.program_id(1)
    else:
        # Axis 0 runs a group of GROUP_R row tiles across every column tile, axis 1 the groups
        # (tiles of the last group past RP are masked off).
        pid_r = tl.program_id(1) * GROUP_R + tl.program_id(0) % GROUP_R
        pid_c = tl.program_id(0) // GROUP_R
    pid_b = tl.program_id(2)
    g, row0, nrows = tile_rows(offsets, pid_r, pid_b, R, G, GROUPED, BLOCK_R, BLOCK_G)
    offs_r, offs_c = chunk_offsets(BLOCK_C // V, BLOCK_R // K, K, V)
    rows = row0 + offs_r
    cols = pid_c * BLOCK_C + offs_c
    mask_r = offs_r < nrows
    mask_c = cols < C
    # [NC, NR, K, V]
    tile = tl.load(x + pid_b * stride_xb + source_rows(src_rows, rows, mask_r, GATHER) * stride_xr + cols,
                   mask=mask_r & mask_c, other=0.0).to(tl.float32)
    data += pid_b * stride_db
    data_t += pid_b * stride_tb
    enc = 1.0
    if SCALING == 0 or SCALING == 3:
        enc = tl.load(encode + g)
    # Column-wise stores cover positions < RP: whole tiles of the padded grouped layout
    # (zeros past a group's rows), the valid rows otherwise.
    if SCALING == 0 or BLOCK_2D:
        # One multiplier for the whole tile: the tensor's encode scale, or the tile's power of two.
        mult = enc
        if BLOCK_2D:
            k = pow2_exponent(finite_amax(tile, None), ELEM)
            mult = exp2i(-k)
            inside = pid_r * BLOCK_R < RP
            if ROWWISE:
                tl.store(scale + pid_b * stride_sb + pid_r * stride_sr + pid_c, exp2i(k), mask=inside)
            if COLUMNWISE:
                tl.store(scale_t + pid_b * stride_ub + pid_c * stride_uc + pid_r, exp2i(k), mask=inside)
        v = tile * mult
        if BLOCK_2D:
            q = cast_fp8_within(v, fit_limit(mult, dtype_max(x), ELEM), ELEM)
        else:
            # Plainly (satfinite): a tile holding a NaN or an infinity (rare) has those elements'
            # codes written over below. Their per-element rules in line took the E5M2 cast to 138
            # registers (E4M3: 90; this way 80; sm_90a), three programs a multiprocessor instead
            # of five, and 0.77 of copy against E4M3's 0.93 (H100).
            q = convert_fp8(v, ELEM)
        # Not staged: Triton would move the transpose onto the input tile (twice the bytes
        # through shared memory, in up to 18 rounds with barriers).
        if ROWWISE:
            store_chunks(data, q, rows, mask_r, stride_dr, pid_c * BLOCK_C, C, False, True, False)
        if COLUMNWISE:
            store_chunks(data_t, q, cols, mask_c, stride_tc, pid_r * BLOCK_R, RP, False, False, False)
        if not BLOCK_2D:
            if any_non_finite(v, None) != 0:
                # After every plain store of the tile, whichever thread made it.
                tl.debug_barrier()
                _store_non_finite(x + pid_b * stride_xb, src_rows, enc, data, data_t, row0, nrows, pid_r, pid_c, C,
                                  stride_xr, stride_dr, stride_tc, ROWWISE, COLUMNWISE, ELEM, BLOCK_R, BLOCK_C,
                                  GATHER)
    else:
        # Every tile takes the plain path, which assumes no NaN or infinity and no value that
        # rounds past the source dtype's maximum (the per-element work of the formats without
        # those rules). Its block maxima tell whether the tile is such a one (``plain_limit``);
        # a tile that is not (rare) is quantized again by the whole rules, overwriting both
        # copies, in a function of its own. (A branch between the two paths, each from the
        # loaded tile, would keep its 16-bit and float32 values live together.)
        peak = block_peaks(tile, ROWWISE, BLOCK)
        if ROWWISE:
            store_blocks(tile, peak, enc, dtype_max(x), data, scale + pid_b * stride_sb, rows, mask_r, stride_dr,
                         stride_sr, pid_c * BLOCK_C, C, C_STORED, True, True, SCALING, ELEM, BLOCK, STAGED)
        if COLUMNWISE:
            peak_t = block_peaks(tile, False, BLOCK) if ROWWISE else peak
            store_blocks(tile, peak_t, enc, dtype_max(x), data_t, scale_t + pid_b * stride_ub, cols, mask_c,
                         stride_tc, stride_uc, pid_r * BLOCK_R, RP, RP_STORED, True, False, SCALING, ELEM, BLOCK,
                         STAGED)
        if tl.max(tl.where(peak <= plain_limit(x, SCALING), 0, 1)) != 0:
            # Every plain store of the tile (and its use of shared memory) before the rewrite,
            # whichever thread made it.
            tl.debug_barrier()
            _quantize_tile_whole_rules(
                x + pid_b * stride_xb, src_rows, enc, data, scale + pid_b * stride_sb, data_t,
                scale_t + pid_b * stride_ub,
                row0, nrows, pid_r, pid_c, C, RP, C_STORED, RP_STORED, stride_xr, stride_dr, stride_sr, stride_tc,
                stride_uc, ROWWISE, COLUMNWISE, SCALING, ELEM, BLOCK, BLOCK_R, BLOCK_C, K, V, STAGED, GATHER)


@triton.jit(noinline=True)
def _store_non_finite(x, src_rows, enc, data, data_t, row0, nrows, pid_r, pid_c, C, stride_xr, stride_dr, stride_tc,
                      ROWWISE: tl.constexpr, COLUMNWISE: tl.constexpr, ELEM: tl.constexpr, BLOCK_R: tl.constexpr,
                      BLOCK_C: tl.constexpr, GATHER: tl.constexpr):
    """The codes of the NaN and infinities of ``quantize_kernel``'s per-tensor tile at (``row0``,
    column tile ``pid_c``), written over its plain (satfinite) copies as ``cast_fp8`` has them.
    Only those elements are stored, 16 rows at a time: ptxas sizes the kernel's registers by
    its callees too."""
    tl.static_assert(BLOCK_R % 16 == 0, "per-tensor row tiles are whole multiples of 16 rows")
    cols = pid_c * BLOCK_C + tl.arange(0, BLOCK_C)[None, :]
    for start in tl.range(0, BLOCK_R, 16):
        offs_r = start + tl.arange(0, 16)[:, None]
        mask_r = offs_r < nrows
        mask = mask_r & (cols < C)
        v = tl.load(x + source_rows(src_rows, row0 + offs_r, mask_r, GATHER) * stride_xr + cols, mask=mask,
                    other=0.0).to(tl.float32) * enc
        special = cast_fp8(v, ELEM)
        mask &= non_finite(v)
        if ROWWISE:
            tl.store(data + (row0 + offs_r) * stride_dr + cols, special, mask=mask)
        if COLUMNWISE:
            tl.store(data_t + cols * stride_tc + pid_r * BLOCK_R + offs_r, special, mask=mask)


@triton.jit(noinline=True)
def _quantize_tile_whole_rules(x, src_rows, enc, data, scale, data_t, scale_t, row0, nrows, pid_r, pid_c, C, RP,
                               C_STORED, RP_STORED, stride_xr, stride_dr, stride_sr, stride_tc, stride_uc,
                               ROWWISE: tl.constexpr, COLUMNWISE: tl.constexpr, SCALING: tl.constexpr,
                               ELEM: tl.constexpr, BLOCK: tl.constexpr, BLOCK_R: tl.constexpr,
                               BLOCK_C: tl.constexpr, K: tl.constexpr, V: tl.constexpr, STAGED: tl.constexpr,
                               GATHER: tl.constexpr):
    """``quantize_kernel``'s 1D-block copies of the tile at (``row0``, column tile ``pid_c``;
    ``nrows`` valid rows from there) by the whole rules: for tiles that hold NaN, infinities or
    values near the source dtype's maximum. Not inlined, so that its registers (the tile
    loaded again, the addresses computed again) are not held through the plain path."""
    offs_r, offs_c = chunk_offsets(BLOCK_C // V, BLOCK_R // K, K, V)
    rows = row0 + offs_r
    cols = pid_c * BLOCK_C + offs_c
    mask_r = offs_r < nrows
    mask_c = cols < C
    tile = tl.load(x + source_rows(src_rows, rows, mask_r, GATHER) * stride_xr + cols, mask=mask_r & mask_c,
                   other=0.0).to(tl.float32)
    if ROWWISE:
        store_blocks(tile, None, enc, dtype_max(x), data, scale, rows, mask_r, stride_dr, stride_sr, pid_c * BLOCK_C, C,
                     C_STORED, False, True, SCALING, ELEM, BLOCK, STAGED)
    if COLUMNWISE:
        store_blocks(tile, None, enc, dtype_max(x), data_t, scale_t, cols, mask_c, stride_tc, stride_uc,
                     pid_r * BLOCK_R, RP, RP_STORED, False, False, SCALING, ELEM, BLOCK, STAGED)


def written(scaling: Scaling, block_2d: bool, rowwise: bool, columnwise: bool) -> Buffers:
    """Which of ``quantize``'s buffers a call writes, as ``allocate`` makes them (each copy
    asked for, with its block scales unless the format has only a tensor scale): for callers
    that get the buffers back without their Nones (the custom op). ``allocate`` keeps its own
    branches, on the eager hot path; a test checks that the two agree."""
    scales = block_2d or scaling != Scaling.TENSOR
    return Buffers(rowwise, rowwise and scales, columnwise, columnwise and scales)


def allocate(shape: tuple[int, int, int], groups: int | None, *, scaling: Scaling, element: Element,
             block_2d: bool, rowwise: bool, columnwise: bool, device: torch.device) -> Buffers:
    """Uninitialised buffers of ``quantize``'s outputs for ``x`` of ``shape`` [B, R, C];
    ``groups``: the number of row groups (padded column-wise layout), or None."""
    B, R, C = shape
    rp = padded_rows(R, groups) if groups is not None else R
    blk = BLOCK_SIZE[scaling]
    elem = STORAGE_DTYPE[element]
    scale_dtype = {Scaling.BLOCK: torch.float32, Scaling.MX: torch.float8_e8m0fnu,
                   Scaling.NVFP4: torch.float8_e4m3fn}.get(scaling)

    def empty(*dims, dtype):
        return torch.empty(*dims, dtype=dtype, device=device)

    def length(n):  # elements per row as stored (E2M1 two per byte)
        return cdiv(n, 2) if element == Element.E2M1 else n

    data = scale = data_t = scale_t = None
    if rowwise:
        data = empty(B, R, length(C), dtype=elem)
        if block_2d:
            scale = empty(B, cdiv(R, 128), cdiv(C, 128), dtype=torch.float32)
        elif scaling != Scaling.TENSOR:
            scale = empty(B, R, cdiv(C, blk), dtype=scale_dtype)
    if columnwise:
        data_t = empty(B, C, length(rp), dtype=elem)
        if block_2d:
            scale_t = empty(B, cdiv(C, 128), cdiv(R, 128), dtype=torch.float32)
        elif scaling != Scaling.TENSOR:
            scale_t = empty(B, C, cdiv(rp, blk), dtype=scale_dtype)
    return Buffers(data, scale, data_t, scale_t)


def _kernel_view(t: torch.Tensor | None, dummy: torch.Tensor) -> torch.Tensor:
    """E8M0 scales go to the kernels as their uint8 codes (Triton has no E8M0 type)."""
    if t is None:
        return dummy
    return t.view(torch.uint8) if t.dtype == torch.float8_e8m0fnu else t


def _strides(t: torch.Tensor | None) -> tuple[int, int]:
    return (0, 0) if t is None else (t.stride(0), t.stride(1))


def quantize(
    x: torch.Tensor,
    offsets: torch.Tensor | None,
    encode: torch.Tensor | None,
    *,
    scaling: Scaling,
    element: Element,
    block_2d: bool = False,
    rowwise: bool = True,
    columnwise: bool = False,
    out: Buffers | None = None,
    rows: torch.Tensor | None = None,
) -> Buffers:
    """Quantize ``x`` (module docstring) in one pass.

    Args:
        x: [B, R, C] float32/float16/bfloat16, last dim contiguous.
        offsets: int64 [G + 1] row offsets of a grouped ``x`` (B = 1), or None.
        encode: float32 [G] (grouped) or [B] per-tensor encode scales for TENSOR and NVFP4
            (``tensor_encode_scale(amax(...))``), else None.
        scaling, element: the format; E2M1 goes with NVFP4, E4M3/E5M2 with the others.
        block_2d: 128x128 tiles (BLOCK scaling, not grouped) instead of 1x128.
        rowwise, columnwise: which copies to write.
        out: buffers to write into (from ``allocate``), else allocated.
        rows: int64 [R'] indices into ``x``'s rows (B = 1, 1x``blk`` blocks): quantize the
            tensor ``x[0, rows]`` [R', C] without writing it out, each row read where it lies
            (MoE's permuted tokens: ``x`` the tokens, ``rows`` each sorted row's token); its
            rows are the ones ``offsets`` groups. Indices must lie in [0, R) (the caller checks).
    """
    cfg = pick_config(scaling, block_2d, columnwise, grouped=offsets is not None, gathered=rows is not None)
    return launch_quantize(x, offsets, encode, scaling, element, block_2d, rowwise, columnwise, out, cfg, rows=rows)


def launch_quantize(x, offsets, encode, scaling, element, block_2d, rowwise, columnwise, out,
                    cfg: QuantizeConfig | tuple[int, int, int], *, rows: torch.Tensor | None = None) -> Buffers:
    """``quantize`` with an explicit tiling (the benchmark's sweep)."""
    B, R, C = x.shape
    if rows is not None:
        R = rows.shape[0]
    groups = offsets.shape[0] - 1 if offsets is not None else None
    bufs = out if out is not None else allocate(
        (B, R, C), groups, scaling=scaling, element=element, block_2d=block_2d,
        rowwise=rowwise, columnwise=columnwise, device=x.device)
    rp = padded_rows(R, groups) if groups is not None else R
    if C == 0 or rp == 0 or B == 0:
        return bufs
    x = x if x.stride(2) == 1 else x.contiguous()
    br, bc, warps, staged, group_r, maxnreg = QuantizeConfig(*cfg)
    # Triton's default is no cap (None).
    options = {"maxnreg": maxnreg} if maxnreg else {}
    # Chunks of one 16-byte load per row, K rows: what the tile leaves per thread, at least a
    # pair (E2M1) and at most 16 (the shortest block along rows).
    v = 16 // x.element_size()
    k = max(2, min(16, br, br * bc // (v * 32 * warps)))
    packed = element == Element.E2M1
    data, scale, data_t, scale_t = (_kernel_view(t, x) for t in bufs)
    # Triton 3.6 on sm_90 miscompiles the one-pass form on float32 input for the whole-tile
    # formats (the column-wise copy lost about half its elements on the H100): there the two
    # copies take a pass each.
    one_pass = not (x.dtype == torch.float32 and (scaling == Scaling.TENSOR or block_2d))
    # NVFP4's column-wise copy of float32 input comes out wrong from the sm_90 build of this
    # kernel (a quarter to a half of its bytes, in one pass or two; exact in the interpreter and
    # for 16-bit input): on CUDA the torch reference writes it (bit-identical by construction).
    reference_columns = columnwise and packed and x.dtype == torch.float32 and x.is_cuda
    if reference_columns:
        reference_quantize(x, offsets, encode, scaling=scaling, element=element, rowwise=False,
                           columnwise=True, out=Buffers(None, None, bufs.data_t, bufs.scale_t), rows=rows)
        columnwise = False
    tiles_r, tiles_c = cdiv(rp, br), cdiv(C, bc)
    for copies in [(rowwise, columnwise)] if one_pass else [(rowwise, False), (False, columnwise)]:
        if not any(copies):
            continue
        grid = (tiles_r, tiles_c, B) if not group_r else (group_r * tiles_c, cdiv(tiles_r, group_r), B)
        launch(quantize_kernel, grid,
            x, rows if rows is not None else x, offsets if offsets is not None else x,
            encode if encode is not None else x,
            data, scale, data_t, scale_t,
            R, C, groups or B, rp, cdiv(C, 2) if packed else C, cdiv(rp, 2) if packed else rp,
            x.stride(0), x.stride(1), *_strides(bufs.data), *_strides(bufs.scale),
            *_strides(bufs.data_t), *_strides(bufs.scale_t),
            SCALING=int(scaling), ELEM=int(element), BLOCK=BLOCK_SIZE[scaling] or 1, BLOCK_2D=block_2d,
            ROWWISE=copies[0], COLUMNWISE=copies[1], GROUPED=offsets is not None,
            BLOCK_R=br, BLOCK_C=bc, BLOCK_G=max(16, next_power_of_2(groups or 1)), K=k, V=v,
            STAGED=staged, GROUP_R=group_r, GATHER=rows is not None,
            num_warps=warps, **options,
        )
    return bufs


def _reference_blocks(v: torch.Tensor, enc: torch.Tensor, scaling: Scaling, element: Element, src_max: float):
    """Blocks along the last dim of float32 ``v`` [..., L]: (q [..., L] as stored before
    packing, s [..., cdiv(L, blk)] as stored); ``enc`` [..., 1 or L] is the encode scale,
    ``src_max`` the source dtype's maximum."""
    blk = BLOCK_SIZE[scaling]
    L = v.shape[-1]
    nb = cdiv(L, blk)
    vb = torch.nn.functional.pad(v, (0, nb * blk - L)).unflatten(-1, (nb, blk))
    amax = reference_finite_abs(vb).amax(-1)
    if scaling == Scaling.NVFP4:
        enc = enc[..., ::blk]
        s = reference_to_fp8(amax / 6.0 * enc, Element.E4M3)
        sf = s.float()
        q = reference_e2m1_encode(vb * torch.where(sf > 0, enc / sf, 0.0)[..., None])
        # E2M1 holds no NaN or inf: their block's scale is NaN (formats.py).
        bad = ~vb.isfinite().all(-1)
        s = torch.where(bad, torch.full_like(s.view(torch.uint8), 0x7F), s.view(torch.uint8)).view(s.dtype)
    else:
        k = reference_pow2_exponent(amax, element)
        mult = reference_exp2i(-k)[..., None]
        q = reference_fit_source(reference_to_fp8(vb * mult, element), vb, mult, src_max)
        s = reference_exp2i(k) if scaling == Scaling.BLOCK else (k + 127).to(torch.uint8).view(torch.float8_e8m0fnu)
    return q.flatten(-2)[..., :L], s


def _reference_tiles(x: torch.Tensor, element: Element, src_max: float) -> tuple[torch.Tensor, torch.Tensor]:
    """128x128 tiles of float32 ``x`` [B, R, C]: (q [B, R, C] float8, s [B, R / 128, C / 128])."""
    B, R, C = x.shape
    pr, pc = cdiv(R, 128), cdiv(C, 128)
    tiles = torch.nn.functional.pad(x, (0, pc * 128 - C, 0, pr * 128 - R)).view(B, pr, 128, pc, 128)
    k = reference_pow2_exponent(reference_finite_abs(tiles).amax((2, 4)), element)
    mult = reference_exp2i(-k)[:, :, None, :, None]
    q = reference_fit_source(reference_to_fp8(tiles * mult, element), tiles, mult, src_max)
    return q.view(B, pr * 128, pc * 128)[:, :R, :C], reference_exp2i(k)


def reference_quantize(
    x: torch.Tensor,
    offsets: torch.Tensor | None,
    encode: torch.Tensor | None,
    *,
    scaling: Scaling,
    element: Element,
    block_2d: bool = False,
    rowwise: bool = True,
    columnwise: bool = False,
    out: Buffers | None = None,
    rows: torch.Tensor | None = None,
) -> Buffers:
    """The formats of quantization/formats.py in float32 torch: row-wise, blocks along C; column-wise,
    ``x[b].T`` (grouped: scattered to the padded layout, zeros elsewhere) with blocks along
    rows; 128x128 tiles share one scale both ways. Each row (position) uses the encode scale
    of its tensor or group. With ``rows``, of ``x[:, rows]``."""
    if rows is not None:
        x = x.index_select(1, rows)
    B, R, C = x.shape
    groups = offsets.shape[0] - 1 if offsets is not None else None
    xf = x.float()
    src_max = torch.finfo(x.dtype).max
    enc = encode.float() if encode is not None else torch.ones(groups or B, device=x.device)
    if groups is not None:
        rp = padded_rows(R, groups)
        xt = xf.new_zeros(1, C, rp)
        xt[0][:, group_positions(offsets, R)] = xf[0].T
        row_group = torch.searchsorted(offsets[1:], torch.arange(R, device=x.device), right=True)
        enc_x, enc_t = enc[row_group].view(1, R, 1), enc[group_of_positions(offsets, rp)].view(1, 1, rp)
    else:
        xt = xf.transpose(1, 2)
        enc_x = enc_t = enc.view(B, 1, 1)
    bufs = out if out is not None else allocate(
        (B, R, C), groups, scaling=scaling, element=element, block_2d=block_2d,
        rowwise=rowwise, columnwise=columnwise, device=x.device)
    # Only the copies written are computed (on CUDA this also serves one kernel copy alone).
    values = {}
    if block_2d:
        q, s = _reference_tiles(xf, element, src_max)
        values = {"data": q, "scale": s, "data_t": q.transpose(1, 2), "scale_t": s.transpose(1, 2)}
    elif scaling == Scaling.TENSOR:
        if bufs.data is not None:
            values["data"] = reference_to_fp8(xf * enc_x, element)
        if bufs.data_t is not None:
            values["data_t"] = reference_to_fp8(xt * enc_t, element)
    else:
        if bufs.data is not None:
            values.update(zip(("data", "scale"), _reference_blocks(xf, enc_x, scaling, element, src_max)))
        if bufs.data_t is not None:
            values.update(zip(("data_t", "scale_t"), _reference_blocks(xt, enc_t, scaling, element, src_max)))
    for name, buf in bufs._asdict().items():
        if buf is not None:
            value = values[name]
            packed = element == Element.E2M1 and name.startswith("data")
            buf.copy_(reference_pack_e2m1(value) if packed else value)
    return bufs
