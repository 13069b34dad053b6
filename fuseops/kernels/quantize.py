"""Quantize kernels: per-tensor amax, then one cast pass writing the row-wise and column-wise copies.

``x`` [B, R, C] holds B independent tensors (B = 1 for activations with their rows flattened,
B = G for the stacked weights of G groups), or, with ``offsets`` [G + 1], one [M, C] tensor
(B = 1) whose rows are grouped, each group its own tensor for the per-tensor scale.
``quantize`` writes, in a format of quant_formats.py (whose docstring has the maths):

- row-wise ``data`` [B, R, C] (E2M1: [B, R, ceil(C / 2)] bytes), blocks along C, with ``scale``
  [B, R, cdiv(C, blk)], or [B, cdiv(R, 128), cdiv(C, 128)] for 128x128 tiles (``block_2d``);
- column-wise ``data_t`` [B, C, R'] (E2M1: [B, C, ceil(R' / 2)]), the quantized transpose with
  blocks along rows, with ``scale_t`` [B, C, cdiv(R', blk)] (tiles: ``scale`` transposed);
  R' = R, or ``padded_rows(M, G)`` positions of the padded grouped layout.

TENSOR and NVFP4 read each tensor's ``encode`` scale from device memory (``amax`` then
``tensor_encode_scale``), so nothing syncs with the host.

Tiling: one program per [BLOCK_R, BLOCK_C] tile (for grouped rows, per tile of the padded
layout, which holds one group's rows) loads it once and writes both copies from registers,
padding tiles zeros. The tile is held as [NC, NR, K, V] chunks, a thread's chunk K rows of one
16-byte load (V values): blocks along a row span BLOCK / V threads, blocks along a column
BLOCK / K threads (reductions in registers, then warp shuffles), E2M1 pairs sit in one
thread either way, and the transpose is stored as runs of K codes: the data never goes
through shared memory.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from fuseops.kernels._triton import INTERPRET
from fuseops.kernels.quant_formats import (
    BLOCK_SIZE, FP32_MAX, STORAGE_DTYPE, Element, Scaling, block_scales, cast_fp8, e2m1_bits, e2m1_encode, exp2i,
    finite_amax, group_of_positions, group_positions, pack_e2m1, padded_rows, pow2_exponent, reference_e2m1_encode,
    reference_exp2i, reference_pack_e2m1, reference_pow2_exponent, reference_to_fp8, tile_rows, to_fp8,
)


class Buffers(NamedTuple):
    """What ``quantize`` writes; None where a copy was not asked for (or TENSOR's scales)."""

    data: torch.Tensor | None
    scale: torch.Tensor | None
    data_t: torch.Tensor | None
    scale_t: torch.Tensor | None


def _configs() -> dict[tuple[Scaling, bool], tuple[int, int, int]]:
    """(BLOCK_R, BLOCK_C, num_warps) by (format, whether the column-wise copy is written).
    BLOCK_R divides 128 (the grouped layout's alignment) and is a multiple of the block along
    rows; BLOCK_C a multiple of the block. Chunks of 8 rows (64 values per thread for bf16),
    and blocks along columns within one warp: no spills, no shared memory on the data path
    (sm_90 ptxas). Chosen on the H100 by ``python -m benchmarks.quantize --tune`` (bf16
    [16384, 4096], .notes/quantize.md): the cast pass at 0.88 of a device copy for TENSOR with
    or without the column-wise copy, BLOCK 0.87 / 0.77, MX 0.91 / 0.75, NVFP4 0.49 / 0.35
    counting its amax pass (its cast alone 0.0695 / 0.153 ms).
    """
    if INTERPRET:
        return {(s, c): (128, 128, 4) for s in Scaling for c in (False, True)}
    return {
        (Scaling.TENSOR, False): (32, 256, 4), (Scaling.TENSOR, True): (128, 128, 4),
        (Scaling.BLOCK, False): (128, 128, 4), (Scaling.BLOCK, True): (128, 128, 4),
        (Scaling.MX, False): (32, 256, 4), (Scaling.MX, True): (128, 64, 4),
        (Scaling.NVFP4, False): (32, 128, 4), (Scaling.NVFP4, True): (128, 64, 4),
    }


@triton.jit
def _quantize_blocks(t, enc, SCALING: tl.constexpr, ELEM: tl.constexpr, BLOCK: tl.constexpr,
                     ROWS: tl.constexpr, COLS: tl.constexpr):
    """Quantize blocks of BLOCK along the last dim of [ROWS, COLS] ``t``: (q, s) as stored,
    q [ROWS, COLS] float8 (E2M1 codes for NVFP4), s [ROWS, COLS // BLOCK]."""
    tb = tl.reshape(t, [ROWS, COLS // BLOCK, BLOCK])
    mult, s = block_scales(finite_amax(tb, 2), enc, SCALING, ELEM)
    if SCALING == 3:
        q = e2m1_encode(tb * mult[:, :, None])
    else:
        q = to_fp8(tb * mult[:, :, None], ELEM)
    return tl.reshape(q, [ROWS, COLS]), s


@triton.jit
def _chunk_offsets(NC: tl.constexpr, NR: tl.constexpr, K: tl.constexpr, V: tl.constexpr):
    """Row and column in the tile of the chunked [NC, NR, K, V] layout, (c, r, k, v) at row
    r * K + k and column c * V + v: offs_r [1, NR, K, 1], offs_c [NC, 1, 1, V]."""
    offs_r = tl.arange(0, NR)[None, :, None, None] * K + tl.arange(0, K)[None, None, :, None]
    offs_c = tl.arange(0, NC)[:, None, None, None] * V + tl.arange(0, V)[None, None, None, :]
    return offs_r, offs_c


@triton.jit
def _store_chunks(ptr, q, lines, mask_l, stride_l, start, length, PACKED: tl.constexpr, ALONG_ROWS: tl.constexpr):
    """Store chunked codes ``q`` [NC, NR, K, V] in ``lines`` (the tile's rows, ALONG_ROWS, or
    its columns), at positions ``start``.. below ``length`` along them; PACKED: E2M1 codes,
    two per byte along the line, the first in the low nibble."""
    NC: tl.constexpr = q.shape[0]
    NR: tl.constexpr = q.shape[1]
    K: tl.constexpr = q.shape[2]
    V: tl.constexpr = q.shape[3]
    if PACKED:
        if ALONG_ROWS:
            lo, hi = tl.split(tl.reshape(q, [NC, NR, K, V // 2, 2]))
            _, offs = _chunk_offsets(NC, NR, K, V // 2)
        else:
            # The pairs sit in one thread: (k, k + 1) of its K rows.
            lo, hi = tl.split(tl.permute(tl.reshape(q, [NC, NR, K // 2, 2, V]), (0, 1, 2, 4, 3)))
            offs, _ = _chunk_offsets(NC, NR, K // 2, V)
        q = pack_e2m1(lo, hi)
    else:
        offs_r, offs_c = _chunk_offsets(NC, NR, K, V)
        offs = offs_c if ALONG_ROWS else offs_r
    tl.store(ptr + lines * stride_l + start + offs, q, mask=mask_l & (start + offs < length))


@triton.jit
def _store_blocks(tile, enc, data, scale, lines, mask_l, stride_d, stride_s, start, length, stored_length,
                  ALONG_ROWS: tl.constexpr, SCALING: tl.constexpr, ELEM: tl.constexpr, BLOCK: tl.constexpr):
    """Quantize the chunked ``tile`` [NC, NR, K, V] in blocks of BLOCK along its rows
    (ALONG_ROWS) or its columns and store codes and scales (``_store_chunks``'s arguments;
    ``length`` counts elements along a line, ``stored_length`` stored codes)."""
    NC: tl.constexpr = tile.shape[0]
    NR: tl.constexpr = tile.shape[1]
    K: tl.constexpr = tile.shape[2]
    V: tl.constexpr = tile.shape[3]
    # A block's values sit in axis IN of BLOCK // V threads of V columns (along rows) or of
    # BLOCK // K threads of K rows, axis ACROSS: a reduction in registers, then warp shuffles.
    if ALONG_ROWS:
        t = tl.reshape(tile, [NC // (BLOCK // V), BLOCK // V, NR, K, V])
        IN: tl.constexpr = 4
        ACROSS: tl.constexpr = 1
        offs_s = tl.arange(0, NC // (BLOCK // V))[:, None, None, None]
    else:
        t = tl.reshape(tile, [NC, NR // (BLOCK // K), BLOCK // K, K, V])
        IN: tl.constexpr = 3
        ACROSS: tl.constexpr = 2
        offs_s = tl.arange(0, NR // (BLOCK // K))[None, :, None, None]
    mult, s = block_scales(tl.max(finite_amax(t, IN), ACROSS), enc, SCALING, ELEM)
    v = t * tl.expand_dims(tl.expand_dims(mult, ACROSS), IN)
    if SCALING == 3:
        q = e2m1_bits(v)
    else:
        # Scaled by the block's power of two, values fit the format (infinities saturate).
        q = cast_fp8(v, ELEM)
    # Scales [NC // (BLOCK // V), NR, K, 1] along rows, [NC, NR // (BLOCK // K), 1, V] along columns.
    offs_s += start // BLOCK
    tl.store(scale + lines * stride_s + offs_s, tl.expand_dims(s, IN - 1),
             mask=mask_l & (offs_s < tl.cdiv(length, BLOCK)))
    # E2M1: two codes per stored byte.
    STEP: tl.constexpr = 2 if SCALING == 3 else 1
    _store_chunks(data, tl.reshape(q, [NC, NR, K, V]), lines, mask_l, stride_d, start // STEP, stored_length,
                  SCALING == 3, ALONG_ROWS)


@triton.jit
def quantize_kernel(
    x, offsets, encode, data, scale, data_t, scale_t,
    R, C, G, RP, C_STORED, RP_STORED,
    stride_xb, stride_xr, stride_db, stride_dr, stride_sb, stride_sr,
    stride_tb, stride_tc, stride_ub, stride_uc,
    SCALING: tl.constexpr, ELEM: tl.constexpr, BLOCK: tl.constexpr, BLOCK_2D: tl.constexpr,
    ROWWISE: tl.constexpr, COLUMNWISE: tl.constexpr, GROUPED: tl.constexpr,
    BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_G: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
):
    pid_r = tl.program_id(0)
    pid_c = tl.program_id(1)
    pid_b = tl.program_id(2)
    g, row0, nrows = tile_rows(offsets, pid_r, pid_b, R, G, GROUPED, BLOCK_R, BLOCK_G)
    offs_r, offs_c = _chunk_offsets(BLOCK_C // V, BLOCK_R // K, K, V)
    rows = row0 + offs_r
    cols = pid_c * BLOCK_C + offs_c
    mask_r = offs_r < nrows
    mask_c = cols < C
    # [NC, NR, K, V]
    tile = tl.load(x + pid_b * stride_xb + rows * stride_xr + cols, mask=mask_r & mask_c, other=0.0).to(tl.float32)
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
            if ROWWISE:
                tl.store(scale + pid_b * stride_sb + pid_r * stride_sr + pid_c, exp2i(k))
            if COLUMNWISE:
                tl.store(scale_t + pid_b * stride_ub + pid_c * stride_uc + pid_r, exp2i(k))
        q = cast_fp8(tile * mult, ELEM)
        if ROWWISE:
            _store_chunks(data, q, rows, mask_r, stride_dr, pid_c * BLOCK_C, C, False, True)
        if COLUMNWISE:
            _store_chunks(data_t, q, cols, mask_c, stride_tc, pid_r * BLOCK_R, RP, False, False)
    else:
        # The row-wise copy is stored before the column-wise one is computed (fewer live registers).
        if ROWWISE:
            _store_blocks(tile, enc, data, scale + pid_b * stride_sb, rows, mask_r, stride_dr, stride_sr,
                          pid_c * BLOCK_C, C, C_STORED, True, SCALING, ELEM, BLOCK)
        if COLUMNWISE:
            _store_blocks(tile, enc, data_t, scale_t + pid_b * stride_ub, cols, mask_c, stride_tc, stride_uc,
                          pid_r * BLOCK_R, RP, RP_STORED, False, SCALING, ELEM, BLOCK)


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
        return triton.cdiv(n, 2) if element == Element.E2M1 else n

    data = scale = data_t = scale_t = None
    if rowwise:
        data = empty(B, R, length(C), dtype=elem)
        if block_2d:
            scale = empty(B, triton.cdiv(R, 128), triton.cdiv(C, 128), dtype=torch.float32)
        elif scaling != Scaling.TENSOR:
            scale = empty(B, R, triton.cdiv(C, blk), dtype=scale_dtype)
    if columnwise:
        data_t = empty(B, C, length(rp), dtype=elem)
        if block_2d:
            scale_t = empty(B, triton.cdiv(C, 128), triton.cdiv(R, 128), dtype=torch.float32)
        elif scaling != Scaling.TENSOR:
            scale_t = empty(B, C, triton.cdiv(rp, blk), dtype=scale_dtype)
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
    """
    cfg = _configs()[Scaling.BLOCK if block_2d else scaling, columnwise]
    return launch_quantize(x, offsets, encode, scaling, element, block_2d, rowwise, columnwise, out, cfg)


def launch_quantize(x, offsets, encode, scaling, element, block_2d, rowwise, columnwise, out,
                    cfg: tuple[int, int, int]) -> Buffers:
    """``quantize`` with an explicit (BLOCK_R, BLOCK_C, num_warps) (the benchmark's sweep)."""
    B, R, C = x.shape
    groups = offsets.shape[0] - 1 if offsets is not None else None
    bufs = out if out is not None else allocate(
        (B, R, C), groups, scaling=scaling, element=element, block_2d=block_2d,
        rowwise=rowwise, columnwise=columnwise, device=x.device)
    rp = padded_rows(R, groups) if groups is not None else R
    if C == 0 or rp == 0 or B == 0:
        return bufs
    x = x if x.stride(2) == 1 else x.contiguous()
    br, bc, warps = cfg
    # Chunks of one 16-byte load per row, K rows: what the tile leaves per thread, at least a
    # pair (E2M1) and at most 16 (the shortest block along rows).
    v = 16 // x.element_size()
    k = max(2, min(16, br, br * bc // (v * 32 * warps)))
    packed = element == Element.E2M1
    data, scale, data_t, scale_t = (_kernel_view(t, x) for t in bufs)
    # Triton 3.6 on sm_90 miscompiles the one-pass form on float32 input for the whole-tile
    # formats (the column-wise copy lost about half its elements; seen on the H100,
    # .notes/quantize_fp32_transpose.md): there the two copies take a pass each.
    one_pass = not (x.dtype == torch.float32 and (scaling == Scaling.TENSOR or block_2d))
    # NVFP4's column-wise copy of float32 input comes out wrong from the sm_90 build of this
    # kernel (a quarter to a half of its bytes, in one pass or two; exact in the interpreter and
    # for 16-bit input): on CUDA the torch reference writes it (bit-identical by construction).
    reference_columns = columnwise and packed and x.dtype == torch.float32 and x.is_cuda
    if reference_columns:
        reference_quantize(x, offsets, encode, scaling=scaling, element=element, rowwise=False,
                           columnwise=True, out=Buffers(None, None, bufs.data_t, bufs.scale_t))
        columnwise = False
    for copies in [(rowwise, columnwise)] if one_pass else [(rowwise, False), (False, columnwise)]:
        if not any(copies):
            continue
        quantize_kernel[(triton.cdiv(rp, br), triton.cdiv(C, bc), B)](
            x, offsets if offsets is not None else x, encode if encode is not None else x,
            data, scale, data_t, scale_t,
            R, C, groups or B, rp, triton.cdiv(C, 2) if packed else C, triton.cdiv(rp, 2) if packed else rp,
            x.stride(0), x.stride(1), *_strides(bufs.data), *_strides(bufs.scale),
            *_strides(bufs.data_t), *_strides(bufs.scale_t),
            SCALING=int(scaling), ELEM=int(element), BLOCK=BLOCK_SIZE[scaling] or 1, BLOCK_2D=block_2d,
            ROWWISE=copies[0], COLUMNWISE=copies[1], GROUPED=offsets is not None,
            BLOCK_R=br, BLOCK_C=bc, BLOCK_G=max(16, triton.next_power_of_2(groups or 1)), K=k, V=v,
            num_warps=warps,
        )
    return bufs


def _reference_blocks(v: torch.Tensor, enc: torch.Tensor, scaling: Scaling, element: Element):
    """Blocks along the last dim of float32 ``v`` [..., L]: (q [..., L] as stored before
    packing, s [..., cdiv(L, blk)] as stored); ``enc`` [..., 1 or L] is the encode scale."""
    blk = BLOCK_SIZE[scaling]
    L = v.shape[-1]
    nb = triton.cdiv(L, blk)
    vb = torch.nn.functional.pad(v, (0, nb * blk - L)).unflatten(-1, (nb, blk))
    amax = vb.abs().amax(-1).clamp(max=FP32_MAX)
    if scaling == Scaling.NVFP4:
        enc = enc[..., ::blk]
        s = reference_to_fp8(amax / 6.0 * enc, Element.E4M3)
        sf = s.float()
        q = reference_e2m1_encode(vb * torch.where(sf > 0, enc / sf, 0.0)[..., None])
    else:
        k = reference_pow2_exponent(amax, element)
        q = reference_to_fp8(vb * reference_exp2i(-k)[..., None], element)
        s = reference_exp2i(k) if scaling == Scaling.BLOCK else (k + 127).to(torch.uint8).view(torch.float8_e8m0fnu)
    return q.flatten(-2)[..., :L], s


def _reference_tiles(x: torch.Tensor, element: Element) -> tuple[torch.Tensor, torch.Tensor]:
    """128x128 tiles of float32 ``x`` [B, R, C]: (q [B, R, C] float8, s [B, R / 128, C / 128])."""
    B, R, C = x.shape
    pr, pc = triton.cdiv(R, 128), triton.cdiv(C, 128)
    tiles = torch.nn.functional.pad(x, (0, pc * 128 - C, 0, pr * 128 - R)).view(B, pr, 128, pc, 128)
    k = reference_pow2_exponent(tiles.abs().amax((2, 4)).clamp(max=FP32_MAX), element)
    q = reference_to_fp8(tiles * reference_exp2i(-k)[:, :, None, :, None], element)
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
) -> Buffers:
    """The formats of quant_formats.py in float32 torch: row-wise, blocks along C; column-wise,
    ``x[b].T`` (grouped: scattered to the padded layout, zeros elsewhere) with blocks along
    rows; 128x128 tiles share one scale both ways. Each row (position) uses the encode scale
    of its tensor or group."""
    B, R, C = x.shape
    groups = offsets.shape[0] - 1 if offsets is not None else None
    xf = x.float()
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
        q, s = _reference_tiles(xf, element)
        values = {"data": q, "scale": s, "data_t": q.transpose(1, 2), "scale_t": s.transpose(1, 2)}
    elif scaling == Scaling.TENSOR:
        if bufs.data is not None:
            values["data"] = reference_to_fp8(xf * enc_x, element)
        if bufs.data_t is not None:
            values["data_t"] = reference_to_fp8(xt * enc_t, element)
    else:
        if bufs.data is not None:
            values.update(zip(("data", "scale"), _reference_blocks(xf, enc_x, scaling, element)))
        if bufs.data_t is not None:
            values.update(zip(("data_t", "scale_t"), _reference_blocks(xt, enc_t, scaling, element)))
    for name, buf in bufs._asdict().items():
        if buf is not None:
            value = values[name]
            packed = element == Element.E2M1 and name.startswith("data")
            buf.copy_(reference_pack_e2m1(value) if packed else value)
    return bufs
