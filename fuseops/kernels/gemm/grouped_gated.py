"""FC1 of a gated MoE expert MLP: a grouped GEMM with a gated-activation epilogue over rows
grouped by device offsets (FC2's dgrad twin, gemm/grouped_gated_bwd.py, shares the helpers).

``z = a[rows of g] @ b[g] + bias[g]`` [M, 2F] (``b`` [G, K, 2F], FC1's [G, 2F, K] weight
transposed; with ``a_rows`` grouped row i is ``a[a_rows[i]]``, gathered in the loads: the MoE
layer's tokens read in place, with no permuted copy), ``h = gated(z_a, z_b) * probs[:, None]`` [M, F], and optionally ``z`` saved in
its column layout: ``z_a, z_b`` are ``z[:, :F], z[:, F:]``, or with ``interleaved``
``z[:, 0::2], z[:, 1::2]``; ``gated`` is _activations.gated (clamped or not).

Tiling: gemm/grouped.py's persistent walk over group tiles (its helpers, imported). A program
owns BLOCK_N gated columns: two [BLOCK_M, BLOCK_N] accumulators for the gate and up columns,
or (interleaved) one [BLOCK_M, 2 * BLOCK_N] accumulator split in the epilogue.
"""

from __future__ import annotations

import dataclasses
import functools

import torch
import triton
import triton.language as tl

from fuseops.kernels._triton import INTERPRET, cdiv, dot, float32_dot_precision, float32_matmul_in_tf32, next_power_of_2
from fuseops.kernels.dtypes import as_dtype
from fuseops.kernels.elementwise.activation_math import AnyActivation, gated, kernel_act, reference_gated
from fuseops.kernels.gemm.grouped import (
    _group_tiles,
    _locate,
    _swizzle,
    a_tile_of,
    epilogue,
    gathered_rows,
    halves,
    load_b,
    per_group_matmul,
    persistent_programs,
    ragged_descriptor,
    ragged_load,
    ragged_store,
    tensor_descriptor,
    tma_ok,
)
from fuseops.kernels.launch import launch


@dataclasses.dataclass(frozen=True)
class GatedGemmConfig:
    """One tile; ``block_n`` counts gated columns (a forward tile reads 2 * block_n of ``b``)."""

    block_m: int
    block_n: int
    block_k: int
    group_m: int
    num_warps: int
    num_stages: int
    # The epilogue runs on this many column slices of the tile (fewer live registers).
    epilogue_parts: int = 1
    flatten: bool = True
    # Hopper: TMA loads in their own warps (needs flatten off).
    warp_specialize: bool = False
    # Programs of the persistent grid per SM (grouped_gemm.GemmConfig says when above 1).
    programs_per_sm: int = 1
    # Whether the epilogue's [M, F]-sized loads (z, in the dgrad) and stores go through TMA
    # when the tensors allow it, else through pointers in the accumulator's layout: Triton 3.6
    # puts block-wide barriers around every TMA copy of a column slice.
    tma_epilogue_loads: bool = True
    tma_epilogue_stores: bool = True


@functools.cache
def _configs() -> dict[str, GatedGemmConfig]:
    """Tiles by operand class: 16-bit behind TMA, unaligned 16-bit (``pointer``), float32 in
    IEEE (``fp32``) and in TF32 (``tf32``, under torch's TF32 setting).
    Under the interpreter the TMA class slices its epilogue as on GPU (both forms tested).

    ``tma`` was timed on an H100 (bf16 SwiGLU with probs, z saved; ``benchmarks/gated_gemm.py``):
    the flattened persistent loop ran the two accumulators at 476 TFLOP/s at the Mixtral
    shape (E=8, M=16384, K=4096, 2F=28672) and 491 at Qwen3-30B-A3B's (E=128, M=262144,
    K=2048, 2F=1536); without flattening 703 / 611, and with warp-specialized loads and 4
    stages 707 / 637. ``tma_interleaved``: the interleaved layout stores z in [128, 128]
    pairs, whose buffer does not fit beside 4 stages (246 KB): 3 stages (663 for the
    concatenated layout). ``pointer`` is the largest tile that compiles for sm_90 without
    spills (ptxas), not timed. ``gathered``, rows of ``a`` read through a row map, was chosen
    on an H200 (``python -m benchmarks.gathered_gemm``,
    benchmarks/results/gathered_gemm-h200-2026-11-29.json): 0.87-1.01x the permute copy plus
    the TMA GEMM at four of the five MoE shapes, uniform and skewed, 0.62-0.75x at
    DeepSeek-V3's (H=7168); the tile loop is not flattened into the K loop. ``fp32`` /
    ``tf32`` were timed on an H100 (SiLU-gated, z saved,
    E=64, M=32768, K=2048, 2F=2816, uniform; ``benchmarks/float32_precision.py``): 18.8 ms in
    IEEE (0.44x a per-expert torch.mm loop of the same product; a 64x32 tile, 55.1 ms), 2.14 ms
    in TF32 (0.96x; the 64x32 tile 10.5 ms; the IEEE entry's tile ran 2.48 ms in TF32).
    """
    if INTERPRET:
        tiny = GatedGemmConfig(32, 32, 32, 2, 4, 1)
        sliced = dataclasses.replace(tiny, epilogue_parts=2)
        return {"tma": sliced, "tma_interleaved": sliced, "pointer": tiny, "gathered": tiny, "fp32": tiny,
                "tf32": tiny}
    return {
        "tma": GatedGemmConfig(128, 128, 64, 8, 8, 4, epilogue_parts=2, flatten=False, warp_specialize=True),
        "tma_interleaved": GatedGemmConfig(128, 128, 64, 8, 8, 3, epilogue_parts=2, flatten=False,
                                           warp_specialize=True),
        "pointer": GatedGemmConfig(64, 64, 64, 8, 8, 3),
        "gathered": GatedGemmConfig(128, 128, 64, 8, 8, 3, epilogue_parts=2, flatten=False),
        "fp32": GatedGemmConfig(128, 128, 32, 8, 8, 2, epilogue_parts=2),
        "tf32": GatedGemmConfig(128, 64, 32, 8, 8, 3),
    }


def pick_config(table: dict[str, GatedGemmConfig], dtype: torch.dtype, tma: bool,
                interleaved: bool = False, gathered: bool = False) -> GatedGemmConfig:
    """The entry of a ``_configs()`` table for the operands' class (and z's layout, where the
    table tells the two apart); ``gathered``: the row operand is read through a row map."""
    if dtype == torch.float32:
        return table["tf32" if float32_matmul_in_tf32() else "fp32"]
    if gathered:
        return table["gathered"]
    if not tma:
        return table["pointer"]
    return table.get("tma_interleaved", table["tma"]) if interleaved else table["tma"]


@triton.jit
def _pair_cols(offs_n, F, INTERLEAVED: tl.constexpr):
    """Columns of z holding gate and up for gated columns ``offs_n``."""
    if INTERLEAVED:
        cols_a = 2 * offs_n
        cols_b = cols_a + 1
    else:
        cols_a = offs_n
        cols_b = offs_n + F
    return cols_a, cols_b


@triton.jit
def store_pair(z_a, z_b, ta, tb, row0, size, off_m, off_n, F, stride_zm,
               INTERLEAVED: tl.constexpr, TMA: tl.constexpr,
              BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """Write gate and up tiles into z's layout. TMA: ``z_a``, ``z_b`` are ragged descriptors
    over z's halves, or (interleaved) ``z_a`` one over all of z; else both are z itself."""
    if TMA:
        if INTERLEAVED:
            pair = tl.reshape(tl.join(ta, tb), [BLOCK_M, 2 * BLOCK_N]).to(z_a.dtype)
            ragged_store(z_a, row0, size, off_m, 2 * off_n, pair, BLOCK_M, 2 * BLOCK_N)
        else:
            ragged_store(z_a, row0, size, off_m, off_n, ta.to(z_a.dtype), BLOCK_M, BLOCK_N)
            ragged_store(z_b, row0, size, off_m, off_n, tb.to(z_b.dtype), BLOCK_M, BLOCK_N)
    else:
        offs_m = off_m + tl.arange(0, BLOCK_M)
        offs_n = off_n + tl.arange(0, BLOCK_N)
        cols_a, cols_b = _pair_cols(offs_n, F, INTERLEAVED)
        mask = (offs_m < size)[:, None] & (offs_n < F)[None, :]
        rows = (row0 + offs_m)[:, None] * stride_zm
        tl.store(z_a + rows + cols_a[None, :], ta.to(z_a.dtype.element_ty), mask=mask)
        tl.store(z_a + rows + cols_b[None, :], tb.to(z_a.dtype.element_ty), mask=mask)


@triton.jit
def load_pair(z_a, z_b, row0, size, off_m, off_n, F, stride_zm,
              INTERLEAVED: tl.constexpr, TMA: tl.constexpr,
              BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """Gate and up float32 tiles of z (layouts as ``store_pair``); zeros outside the group."""
    if TMA:
        if INTERLEAVED:
            pair = ragged_load(z_a, row0, size, off_m, 2 * off_n, BLOCK_M, 2 * BLOCK_N)
            za, zb = tl.split(tl.reshape(pair, [BLOCK_M, BLOCK_N, 2]))
        else:
            za = ragged_load(z_a, row0, size, off_m, off_n, BLOCK_M, BLOCK_N)
            zb = ragged_load(z_b, row0, size, off_m, off_n, BLOCK_M, BLOCK_N)
    else:
        offs_m = off_m + tl.arange(0, BLOCK_M)
        offs_n = off_n + tl.arange(0, BLOCK_N)
        cols_a, cols_b = _pair_cols(offs_n, F, INTERLEAVED)
        mask = (offs_m < size)[:, None] & (offs_n < F)[None, :]
        rows = (row0 + offs_m)[:, None] * stride_zm
        # [BLOCK_M, BLOCK_N] each
        za = tl.load(z_a + rows + cols_a[None, :], mask=mask, other=0.0)
        zb = tl.load(z_a + rows + cols_b[None, :], mask=mask, other=0.0)
    return za.to(tl.float32), zb.to(tl.float32)


@triton.jit
def _fwd_epilogue(acc_a, acc_b, h, z_a, z_b, bias, probs, g, row0, size, off_m, off_n, F,
                  stride_hm, stride_zm, stride_bias_g, limit, alpha,
                  ACT: tl.constexpr, CLAMPED: tl.constexpr, INTERLEAVED: tl.constexpr,
                  HAS_BIAS: tl.constexpr, HAS_PROBS: tl.constexpr, SAVE_PREACT: tl.constexpr,
                  TMA_STORE: tl.constexpr, PARTS: tl.constexpr,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """Bias, z, gate, probs and h's store, on PARTS column slices (fewer live registers)."""
    if PARTS > 1:
        a_l, a_r = halves(acc_a, BLOCK_M, BLOCK_N)
        b_l, b_r = halves(acc_b, BLOCK_M, BLOCK_N)
        _fwd_epilogue(a_l, b_l, h, z_a, z_b, bias, probs, g, row0, size, off_m, off_n, F,
                      stride_hm, stride_zm, stride_bias_g, limit, alpha, ACT, CLAMPED, INTERLEAVED,
                      HAS_BIAS, HAS_PROBS, SAVE_PREACT, TMA_STORE, PARTS // 2, BLOCK_M, BLOCK_N // 2)
        _fwd_epilogue(a_r, b_r, h, z_a, z_b, bias, probs, g, row0, size, off_m,
                      off_n + BLOCK_N // 2, F, stride_hm, stride_zm, stride_bias_g, limit, alpha,
                      ACT, CLAMPED, INTERLEAVED, HAS_BIAS, HAS_PROBS, SAVE_PREACT, TMA_STORE,
                      PARTS // 2, BLOCK_M, BLOCK_N // 2)
    else:
        offs_n = off_n + tl.arange(0, BLOCK_N)
        if HAS_BIAS:
            cols_a, cols_b = _pair_cols(offs_n, F, INTERLEAVED)
            mask_n = offs_n < F
            acc_a += tl.load(bias + g * stride_bias_g + cols_a, mask=mask_n, other=0.0).to(tl.float32)[None, :]
            acc_b += tl.load(bias + g * stride_bias_g + cols_b, mask=mask_n, other=0.0).to(tl.float32)[None, :]
        if SAVE_PREACT:
            store_pair(z_a, z_b, acc_a, acc_b, row0, size, off_m, off_n, F, stride_zm,
                       INTERLEAVED, TMA_STORE, BLOCK_M, BLOCK_N)
        out = gated(acc_a, acc_b, ACT, CLAMPED, limit, alpha)
        # grouped_gemm's epilogue with only its row scale and store.
        epilogue(out, h, g, row0, size, off_m, off_n, F, stride_hm, probs, 0, probs, 0, probs,
                 probs, 0, alpha, 0, False, False, HAS_PROBS, False, TMA_STORE, BLOCK_M, BLOCK_N)


@triton.jit
def grouped_gemm_gated_fwd_kernel(
    a, a_rows, b_a, b_b, h, z_a, z_b, offsets, bias, probs,
    G, F, K,
    stride_am, stride_bg, stride_bk, stride_bn, stride_hm, stride_zm, stride_bias_g,
    limit, alpha,
    ACT: tl.constexpr, CLAMPED: tl.constexpr, INTERLEAVED: tl.constexpr,
    HAS_BIAS: tl.constexpr, HAS_PROBS: tl.constexpr, SAVE_PREACT: tl.constexpr,
    TMA_LOAD: tl.constexpr, TMA_STORE: tl.constexpr, B_TRANS: tl.constexpr, GATHER_A: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    EPILOGUE_PARTS: tl.constexpr, BLOCK_G: tl.constexpr, NUM_PROGRAMS: tl.constexpr,
    FLATTEN: tl.constexpr, WARP_SPECIALIZE: tl.constexpr, F32_DOT: tl.constexpr,
):
    # b_a / b_b: the gate and up halves of b (views or descriptors); interleaved, b_a is all
    # of b and a tile reads its 2 * BLOCK_N columns from 2 * off_n.
    tiles_n = tl.cdiv(F, BLOCK_N)
    tiles, first = _group_tiles(offsets, G, tiles_n, BLOCK_M, BLOCK_G)
    k_tiles = tl.cdiv(K, BLOCK_K)
    for tile in tl.range(tl.program_id(0), tl.sum(tiles), NUM_PROGRAMS, flatten=FLATTEN,
                         warp_specialize=WARP_SPECIALIZE):
        g, local = _locate(tile, tiles, first, BLOCK_G)
        row0 = tl.load(offsets + g)
        size = (tl.load(offsets + g + 1) - row0).to(tl.int32)
        pid_m, pid_n = _swizzle(local, tl.cdiv(size, BLOCK_M), tiles_n, GROUP_M)
        off_m = pid_m * BLOCK_M
        off_n = pid_n * BLOCK_N
        src_rows, mask_m = gathered_rows(a_rows, row0, size, off_m, GATHER_A, BLOCK_M)
        if INTERLEAVED:
            acc = tl.zeros((BLOCK_M, 2 * BLOCK_N), dtype=tl.float32)
            for ki in range(k_tiles):
                a_tile = a_tile_of(a, src_rows, mask_m, row0, size, off_m, ki * BLOCK_K, K, stride_am,
                                   TMA_LOAD, GATHER_A, BLOCK_M, BLOCK_K)
                b_tile = load_b(b_a, g, ki * BLOCK_K, 2 * off_n, K, 2 * F, stride_bg, stride_bk,
                                stride_bn, TMA_LOAD, B_TRANS, BLOCK_K, 2 * BLOCK_N)
                acc = dot(a_tile, b_tile, acc, F32_DOT)
            acc_a, acc_b = tl.split(tl.reshape(acc, [BLOCK_M, BLOCK_N, 2]))
        else:
            acc_a = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
            acc_b = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
            for ki in range(k_tiles):
                a_tile = a_tile_of(a, src_rows, mask_m, row0, size, off_m, ki * BLOCK_K, K, stride_am,
                                   TMA_LOAD, GATHER_A, BLOCK_M, BLOCK_K)
                b_tile = load_b(b_a, g, ki * BLOCK_K, off_n, K, F, stride_bg, stride_bk,
                                stride_bn, TMA_LOAD, B_TRANS, BLOCK_K, BLOCK_N)
                acc_a = dot(a_tile, b_tile, acc_a, F32_DOT)
                b_tile = load_b(b_b, g, ki * BLOCK_K, off_n, K, F, stride_bg, stride_bk,
                                stride_bn, TMA_LOAD, B_TRANS, BLOCK_K, BLOCK_N)
                acc_b = dot(a_tile, b_tile, acc_b, F32_DOT)
        _fwd_epilogue(acc_a, acc_b, h, z_a, z_b, bias, probs, g, row0, size, off_m, off_n, F,
                      stride_hm, stride_zm, stride_bias_g, limit, alpha, ACT, CLAMPED, INTERLEAVED,
                      HAS_BIAS, HAS_PROBS, SAVE_PREACT, TMA_STORE, EPILOGUE_PARTS, BLOCK_M, BLOCK_N)


def pair_views(t: torch.Tensor | None, interleaved: bool) -> tuple[torch.Tensor | None, ...]:
    """Gate and up halves along the last dim (``t`` twice when interleaved: kernels stride)."""
    if t is None or interleaved:
        return t, t
    F = t.shape[-1] // 2
    return t[..., :F], t[..., F:]


def pair_tma_ok(t: torch.Tensor | None, interleaved: bool) -> bool:
    """``tma_ok(*pair_views(t, interleaved))`` without making the views: the second half starts
    ``F`` elements on, with ``t``'s strides."""
    if t is None or interleaved:
        return tma_ok(t)
    F = t.shape[-1] // 2
    return F > 0 and not F * t.element_size() & 15 and tma_ok(t)


def pair_args(t, interleaved, tma, block_m, block_n):
    """Kernel arguments for a [M, 2F] tensor: ragged descriptors (``store_pair``) or ``t``."""
    if not tma:
        return t, t
    if interleaved:
        desc = ragged_descriptor(t, [block_m, 2 * block_n])
        return desc, desc
    return tuple(ragged_descriptor(v, [block_m, block_n]) for v in pair_views(t, False))


def b_args(b_pair, b_trans, tma, block_k, width):
    """Descriptors over the weight halves as they lie in memory, or the [G, K, F] views."""
    if not tma:
        return b_pair
    return [tensor_descriptor(t, [1, width, block_k] if b_trans else [1, block_k, width]) for t in b_pair]


def grouped_gemm_gated(
    a: torch.Tensor,
    b: torch.Tensor,
    offsets: torch.Tensor,
    *,
    bias: torch.Tensor | None = None,
    act: AnyActivation,
    interleaved: bool = False,
    clamped: bool = False,
    limit: float = 7.0,
    alpha: float = 1.0,
    probs: torch.Tensor | None = None,
    save_preact: bool = False,
    out: torch.Tensor | None = None,
    a_rows: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """FC1 of a gated expert MLP: ``h`` from ``z = a @ b[g] + bias[g]`` (module docstring).

    Args:
        a: [M, K], rows grouped contiguously; M == offsets[G] (never checked: no sync). With
            ``a_rows``, any number of rows: the grouped rows are ``a[a_rows]``.
        b: [G, K, 2F], any strides (FC1's [G, 2F, K] weight transposed).
        offsets: int64 [G + 1] device tensor from ``group_offsets``.
        bias: [G, 2F] or None. probs: [M] row scale (router probabilities) or None.
        act, interleaved, clamped, limit, alpha: the gate (``_activations.gated``).
        save_preact: also return ``z`` [M, 2F] (``a``'s dtype, original column layout).
        out: [M, F] for ``h``, else allocated in ``a``'s dtype.
        a_rows: int64 [M] or None: grouped row i is ``a[a_rows[i]]``, read through pointers
            (indices in range: the MoE layer's row map, never checked here).
    Returns:
        ``(h, z)``; ``z`` is None unless ``save_preact``.
    """
    return launch_grouped_gemm_gated(a, b, offsets, bias, act, interleaved, clamped, limit, alpha,
                                     probs, save_preact, out, None, a_rows)


def launch_grouped_gemm_gated(a, b, offsets, bias, act, interleaved, clamped, limit, alpha, probs,
                              save_preact, out, cfg: GatedGemmConfig | None, a_rows: torch.Tensor | None = None):
    """``grouped_gemm_gated`` with an explicit tile config (for a tuner), else the table's."""
    K = a.shape[1]
    M = a.shape[0] if a_rows is None else a_rows.shape[0]
    G, F = b.shape[0], b.shape[2] // 2
    a = a if a.stride(1) == 1 else a.contiguous()
    b = b if b.stride(1) == 1 or b.stride(2) == 1 else b.contiguous()
    h = out if out is not None else torch.empty(M, F, dtype=a.dtype, device=a.device)
    z = torch.empty(M, 2 * F, dtype=a.dtype, device=a.device) if save_preact else None
    b_trans = b.stride(2) != 1
    b_pair = pair_views(b, interleaved)
    b_mem = [t.transpose(1, 2) if b_trans else t for t in b_pair]
    # Gathered rows are loaded through pointers (TMA on sm_90 loads boxes, not rows).
    tma_load = a_rows is None and tma_ok(a, *b_mem)
    tma_store = tma_ok(h) and pair_tma_ok(z, interleaved)
    cfg = cfg or pick_config(_configs(), a.dtype, tma_load and tma_store, interleaved, a_rows is not None)
    tma_store = tma_store and cfg.tma_epilogue_stores
    bm, bn, bk = cfg.block_m, cfg.block_n, cfg.block_k
    epi_n = bn // cfg.epilogue_parts
    a_arg = tensor_descriptor(a, [bm, bk]) if tma_load else a
    programs = persistent_programs(a, (cdiv(M, bm) + G) * cdiv(F, bn), cfg.programs_per_sm)
    launch(grouped_gemm_gated_fwd_kernel, (programs,),
        a_arg, a_rows if a_rows is not None else offsets,
        *b_args(b_mem if tma_load else b_pair, b_trans, tma_load, bk, 2 * bn if interleaved else bn),
        ragged_descriptor(h, [bm, epi_n]) if tma_store else h,
        *(pair_args(z, interleaved, tma_store, bm, epi_n) if z is not None else (h, h)),
        offsets, bias if bias is not None else h, probs if probs is not None else h,
        G, F, K,
        a.stride(0), b.stride(0), b.stride(1), b.stride(2), h.stride(0),
        z.stride(0) if z is not None else 0, bias.stride(0) if bias is not None else 0,
        float(limit), float(alpha),
        ACT=kernel_act(act), CLAMPED=clamped, INTERLEAVED=interleaved, HAS_BIAS=bias is not None,
        HAS_PROBS=probs is not None, SAVE_PREACT=save_preact, TMA_LOAD=tma_load,
        TMA_STORE=tma_store, B_TRANS=b_trans, GATHER_A=a_rows is not None, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk,
        GROUP_M=cfg.group_m, EPILOGUE_PARTS=cfg.epilogue_parts,
        BLOCK_G=max(16, next_power_of_2(G)), NUM_PROGRAMS=programs, FLATTEN=cfg.flatten,
        WARP_SPECIALIZE=cfg.warp_specialize, F32_DOT=float32_dot_precision(a.dtype),
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )
    return h, z


def gate_up(z: torch.Tensor, interleaved: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """z's gate and up columns, as strided views."""
    return (z[:, 0::2], z[:, 1::2]) if interleaved else z.chunk(2, dim=1)


def reference_grouped_gemm_gated(
    a: torch.Tensor,
    b: torch.Tensor,
    offsets: torch.Tensor,
    *,
    bias: torch.Tensor | None = None,
    act: AnyActivation,
    interleaved: bool = False,
    clamped: bool = False,
    limit: float = 7.0,
    alpha: float = 1.0,
    probs: torch.Tensor | None = None,
    save_preact: bool = False,
    out: torch.Tensor | None = None,
    a_rows: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """For each group g and its rows r = offsets[g]:offsets[g+1], in float32 (float64 for
    float64 inputs), ``a`` standing for ``a[a_rows]`` where given: ``z[r] = a[r] @ b[g]
    (+ bias[g])``; ``z_a, z_b = z[:, :F], z[:, F:]`` (interleaved: ``z[:, 0::2], z[:, 1::2]``); ``h = reference_gated(z_a, z_b) * probs[:,
    None]`` (no ``probs`` means 1), cast to ``a``'s dtype or written into ``out``; ``z``
    returned in ``a``'s dtype when ``save_preact``.
    """
    if a_rows is not None:
        a = a.index_select(0, a_rows)
    z = per_group_matmul(a, b, offsets)
    if bias is not None:
        z += torch.repeat_interleave(bias.to(z.dtype), offsets.diff(), dim=0, output_size=a.shape[0])
    h = reference_gated(*gate_up(z, interleaved), act, clamped, limit, alpha)
    if probs is not None:
        h = h * probs.to(h.dtype)[:, None]
    h = out.copy_(h) if out is not None else as_dtype(h, a.dtype)
    return h, as_dtype(z, a.dtype) if save_preact else None
