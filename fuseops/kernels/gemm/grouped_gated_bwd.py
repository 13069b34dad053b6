"""FC2's dgrad in a gated MoE expert MLP: a grouped GEMM whose epilogue applies the gate's
derivative, over rows grouped by device offsets (the forward is gemm/grouped_gated.py).

``dh = dy[rows of g] @ b[g]`` [M, F] (``b`` [G, H, F], FC2's weight), then from the saved
``z`` [M, 2F]: ``dz``, the gradient of ``gated(z_a, z_b)`` for the upstream ``dh * probs[:,
None]``, in z's column layout; ``dprobs[r] = sum_j dh[r, j] * gated(z_a, z_b)[r, j]``; and
optionally ``h = gated(z_a, z_b) * probs[:, None]`` [M, F], FC2's weight-gradient input (no
separate recompute pass). The gate and its derivative come from one evaluation
(``_activations.gated_and_grad``).
``z_a, z_b`` are z's halves or (``interleaved``) its even and odd columns.

Tiling: the persistent group-tile walk of gemm/grouped.py; one [BLOCK_M, BLOCK_N] accumulator
of dh, its epilogue run on column slices. ``dprobs``: each column tile writes a float32
partial per row, bias_grad's second stage sums them (deterministic, no atomics).
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from fuseops.kernels._triton import INTERPRET, cdiv, dot, float32_dot_precision, next_power_of_2
from fuseops.kernels.dtypes import as_dtype
from fuseops.kernels.elementwise.activation_math import (
    AnyActivation,
    gated_and_grad,
    kernel_act,
    reference_gated,
    reference_gated_grad,
)
from fuseops.kernels.elementwise.bias_grad import sum_partials
from fuseops.kernels.gemm.grouped import (
    _group_tiles,
    _locate,
    _swizzle,
    a_tile_of,
    epilogue,
    gathered_rows,
    halves,
    load_b,
    persistent_programs,
    ragged_descriptor,
    tensor_descriptor,
    tma_ok,
)
from fuseops.kernels.gemm.grouped_gated import (
    GatedGemmConfig,
    b_args,
    gate_up,
    load_pair,
    pair_args,
    pair_tma_ok,
    per_group_matmul,
    pick_config,
    store_pair,
)
from fuseops.kernels.launch import launch


@functools.cache
def _configs() -> dict[str, GatedGemmConfig]:
    """Tiles by operand class, as gemm/grouped_gated.py's. ``tma`` was timed on an H100 (bf16
    SwiGLU with probs and h; ``benchmarks/gated_gemm.py``): a 128x256 tile with the epilogue in 8
    column slices ran 509 TFLOP/s at the Mixtral shape (E=8, M=16384, K=4096, F=14336) and
    346 at Qwen3-30B-A3B's (E=128, M=262144, K=2048, F=768), against 410 / 311 for 128x128 in
    4 slices; 16 slices, 2 slices, 4 stages and warp-specialized loads were slower. Its
    epilogue loads z and stores dz and h through pointers, not TMA (3.69-3.91 against 4.00 ms
    at Mixtral, equal at Qwen3), and writing h then costs nothing measurable. ``pointer`` is the
    largest tile that compiles for sm_90 without spills (ptxas), not timed. ``gathered`` (dy's
    rows read through a row map) was chosen on an H200 (``python -m benchmarks.gathered_gemm``,
    benchmarks/results/gathered_gemm-h200-2026-11-29.json): 0.74-1.02x the permute copy plus
    the TMA GEMM over the five MoE shapes, uniform and skewed. ``fp32`` and ``tf32``, one tile, were
    timed on an H100 (SiLU-gated, E=64, M=32768, K=2048, F=1408, uniform;
    ``benchmarks/float32_precision.py``): 5.2 ms in IEEE, 2.6 ms in TF32 (0.87x / 0.78x a
    per-expert torch.mm loop of the product alone; a 64x32 tile, 12.7 / 8.7 ms)."""
    if INTERPRET:
        tiny = GatedGemmConfig(32, 32, 32, 2, 4, 1)
        return {"tma": GatedGemmConfig(32, 32, 32, 2, 4, 1, epilogue_parts=2), "pointer": tiny, "gathered": tiny,
                "fp32": tiny, "tf32": tiny}
    return {
        "tma": GatedGemmConfig(128, 256, 64, 8, 8, 3, epilogue_parts=8, tma_epilogue_loads=False,
                               tma_epilogue_stores=False),
        "pointer": GatedGemmConfig(64, 64, 64, 8, 8, 3),
        "gathered": GatedGemmConfig(128, 128, 64, 8, 8, 4, epilogue_parts=2, flatten=False),
        "fp32": GatedGemmConfig(128, 64, 32, 8, 8, 3),
        "tf32": GatedGemmConfig(128, 64, 32, 8, 8, 3),
    }


@triton.jit
def _dgrad_epilogue(dh, z_a, z_b, dz_a, dz_b, h, probs, g, row0, size, off_m, off_n, F,
                    stride_zm, stride_dzm, stride_hm, limit, alpha,
                    ACT: tl.constexpr, CLAMPED: tl.constexpr, INTERLEAVED: tl.constexpr,
                    HAS_PROBS: tl.constexpr, WANT_H: tl.constexpr, TMA_Z: tl.constexpr,
                    TMA_STORE: tl.constexpr, PARTS: tl.constexpr,
                    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """Writes dz (and h) for one tile, in PARTS column slices; returns its float32 row sums
    of ``dh * gated(z)``."""
    if PARTS > 1:
        dh_l, dh_r = halves(dh, BLOCK_M, BLOCK_N)
        partial = _dgrad_epilogue(
            dh_l, z_a, z_b, dz_a, dz_b, h, probs, g, row0, size, off_m, off_n, F, stride_zm,
            stride_dzm, stride_hm, limit, alpha, ACT, CLAMPED, INTERLEAVED, HAS_PROBS, WANT_H,
            TMA_Z, TMA_STORE, PARTS // 2, BLOCK_M, BLOCK_N // 2)
        partial += _dgrad_epilogue(
            dh_r, z_a, z_b, dz_a, dz_b, h, probs, g, row0, size, off_m, off_n + BLOCK_N // 2, F,
            stride_zm, stride_dzm, stride_hm, limit, alpha, ACT, CLAMPED, INTERLEAVED,
            HAS_PROBS, WANT_H, TMA_Z, TMA_STORE, PARTS // 2, BLOCK_M, BLOCK_N // 2)
    else:
        za, zb = load_pair(z_a, z_b, row0, size, off_m, off_n, F, stride_zm, INTERLEAVED, TMA_Z,
                           BLOCK_M, BLOCK_N)
        offs_m = off_m + tl.arange(0, BLOCK_M)
        partial = tl.zeros((BLOCK_M,), dtype=tl.float32)
        if HAS_PROBS:
            p = tl.load(probs + row0 + offs_m, mask=offs_m < size, other=0.0).to(tl.float32)[:, None]
            out, da, db = gated_and_grad(za, zb, dh * p, ACT, CLAMPED, limit, alpha)
            # Columns past F hold dh = 0 (b read as zeros there), so they add nothing.
            partial = tl.sum(dh * out, 1)
            out = out * p
        else:
            out, da, db = gated_and_grad(za, zb, dh, ACT, CLAMPED, limit, alpha)
        if WANT_H:
            epilogue(out, h, g, row0, size, off_m, off_n, F, stride_hm, probs, 0, probs, 0, probs,
                     probs, 0, alpha, 0, False, False, False, False, TMA_STORE, BLOCK_M, BLOCK_N)
        store_pair(dz_a, dz_b, da, db, row0, size, off_m, off_n, F, stride_dzm, INTERLEAVED,
                   TMA_STORE, BLOCK_M, BLOCK_N)
    return partial


@triton.jit
def grouped_gemm_gated_bwd_kernel(
    dy, dy_rows, b, z_a, z_b, dz_a, dz_b, h, offsets, probs, partials,
    G, F, K, M,
    stride_dym, stride_bg, stride_bk, stride_bn, stride_zm, stride_dzm, stride_hm,
    limit, alpha,
    ACT: tl.constexpr, CLAMPED: tl.constexpr, INTERLEAVED: tl.constexpr,
    HAS_PROBS: tl.constexpr, WANT_H: tl.constexpr,
    TMA_LOAD: tl.constexpr, TMA_Z: tl.constexpr, TMA_STORE: tl.constexpr, B_TRANS: tl.constexpr,
    GATHER_A: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    EPILOGUE_PARTS: tl.constexpr, BLOCK_G: tl.constexpr, NUM_PROGRAMS: tl.constexpr,
    FLATTEN: tl.constexpr, WARP_SPECIALIZE: tl.constexpr, F32_DOT: tl.constexpr,
):
    # partials: [tiles_n, M]; the tile (g, pid_m, pid_n) owns its group's rows of row pid_n.
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
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        src_rows, mask_m = gathered_rows(dy_rows, row0, size, off_m, GATHER_A, BLOCK_M)
        for ki in range(k_tiles):
            a_tile = a_tile_of(dy, src_rows, mask_m, row0, size, off_m, ki * BLOCK_K, K, stride_dym, TMA_LOAD,
                               GATHER_A, BLOCK_M, BLOCK_K)
            b_tile = load_b(b, g, ki * BLOCK_K, off_n, K, F, stride_bg, stride_bk, stride_bn,
                            TMA_LOAD, B_TRANS, BLOCK_K, BLOCK_N)
            acc = dot(a_tile, b_tile, acc, F32_DOT)
        partial = _dgrad_epilogue(
            acc, z_a, z_b, dz_a, dz_b, h, probs, g, row0, size, off_m, off_n, F, stride_zm,
            stride_dzm, stride_hm, limit, alpha, ACT, CLAMPED, INTERLEAVED, HAS_PROBS, WANT_H,
            TMA_Z, TMA_STORE, EPILOGUE_PARTS, BLOCK_M, BLOCK_N)
        if HAS_PROBS:
            offs_m = off_m + tl.arange(0, BLOCK_M)
            tl.store(partials + pid_n * M + row0 + offs_m,
                     partial.to(partials.dtype.element_ty), mask=offs_m < size)


def grouped_gemm_dgrad_gated(
    dy: torch.Tensor,
    b: torch.Tensor,
    offsets: torch.Tensor,
    z: torch.Tensor,
    *,
    act: AnyActivation,
    interleaved: bool = False,
    clamped: bool = False,
    limit: float = 7.0,
    alpha: float = 1.0,
    probs: torch.Tensor | None = None,
    want_h: bool = False,
    out: torch.Tensor | None = None,
    dy_rows: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """FC2's dgrad through the gate: ``dz``, ``dprobs`` and ``h`` (module docstring).

    Args:
        dy: [M, H] upstream gradient of FC2's output, rows grouped as ``offsets``; with
            ``dy_rows`` (int64 [M]) any number of rows, grouped row i being ``dy[dy_rows[i]]``,
            gathered in the loads (the MoE layer's per-token gradient, never permuted).
        b: [G, H, F], any strides (FC2's [G, H, F] weight itself).
        offsets: int64 [G + 1] device tensor. z: [M, 2F] the saved pre-activation.
        act, interleaved, clamped, limit, alpha: the gate. probs: [M] or None.
        want_h: also return ``h = gated(z_a, z_b) * probs`` [M, F] (FC2's wgrad input).
        out: [M, 2F] for ``dz``, else allocated in ``z``'s dtype.
    Returns:
        ``(dz, dprobs, h)``: ``dprobs`` [M] in ``probs``' dtype (float32 sums,
        deterministic) or None; ``h`` None unless ``want_h``.
    """
    return launch_grouped_gemm_dgrad_gated(dy, b, offsets, z, act, interleaved, clamped, limit,
                                           alpha, probs, want_h, out, None, dy_rows)


def launch_grouped_gemm_dgrad_gated(dy, b, offsets, z, act, interleaved, clamped, limit, alpha,
                                    probs, want_h, out, cfg: GatedGemmConfig | None,
                                    dy_rows: torch.Tensor | None = None):
    """``grouped_gemm_dgrad_gated`` with an explicit tile config, else the table's."""
    K = dy.shape[1]
    M = z.shape[0]
    G, F = b.shape[0], b.shape[2]
    dy = dy if dy.stride(1) == 1 else dy.contiguous()
    z = z if z.stride(1) == 1 else z.contiguous()
    b = b if b.stride(1) == 1 or b.stride(2) == 1 else b.contiguous()
    dz = out if out is not None else torch.empty(M, 2 * F, dtype=z.dtype, device=z.device)
    h = torch.empty(M, F, dtype=z.dtype, device=z.device) if want_h else None
    b_trans = b.stride(2) != 1
    b_mem = b.transpose(1, 2) if b_trans else b
    # Gathered rows are loaded through pointers (TMA on sm_90 loads boxes, not rows).
    tma_load = dy_rows is None and tma_ok(dy, b_mem)
    tma_z = pair_tma_ok(z, interleaved)
    tma_store = tma_ok(h) and pair_tma_ok(dz, interleaved)
    cfg = cfg or pick_config(_configs(), dy.dtype, tma_load and tma_z and tma_store, gathered=dy_rows is not None)
    tma_z = tma_z and cfg.tma_epilogue_loads
    tma_store = tma_store and cfg.tma_epilogue_stores
    bm, bn, bk = cfg.block_m, cfg.block_n, cfg.block_k
    epi_n = bn // cfg.epilogue_parts
    tiles_n = cdiv(F, bn)
    partials = None
    if probs is not None:
        # One column tile holds the whole row sum: it goes straight to the output.
        partials = torch.empty(tiles_n, M, dtype=probs.dtype if tiles_n == 1 else torch.float32,
                               device=dy.device)
    programs = persistent_programs(dy, (cdiv(M, bm) + G) * tiles_n, cfg.programs_per_sm)
    launch(grouped_gemm_gated_bwd_kernel, (programs,),
        tensor_descriptor(dy, [bm, bk]) if tma_load else dy, dy_rows if dy_rows is not None else offsets,
        *b_args([b_mem if tma_load else b], b_trans, tma_load, bk, bn),
        *pair_args(z, interleaved, tma_z, bm, epi_n),
        *pair_args(dz, interleaved, tma_store, bm, epi_n),
        (ragged_descriptor(h, [bm, epi_n]) if tma_store else h) if h is not None else dz,
        offsets, probs if probs is not None else dz, partials if partials is not None else dz,
        G, F, K, M,
        dy.stride(0), b.stride(0), b.stride(1), b.stride(2), z.stride(0), dz.stride(0),
        h.stride(0) if h is not None else 0,
        float(limit), float(alpha),
        ACT=kernel_act(act), CLAMPED=clamped, INTERLEAVED=interleaved, HAS_PROBS=probs is not None,
        WANT_H=want_h, TMA_LOAD=tma_load, TMA_Z=tma_z, TMA_STORE=tma_store, B_TRANS=b_trans,
        GATHER_A=dy_rows is not None, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=cfg.group_m,
        EPILOGUE_PARTS=cfg.epilogue_parts, BLOCK_G=max(16, next_power_of_2(G)),
        NUM_PROGRAMS=programs, FLATTEN=cfg.flatten, WARP_SPECIALIZE=cfg.warp_specialize,
        F32_DOT=float32_dot_precision(dy.dtype), num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )
    dprobs = None
    if partials is not None:
        dprobs = partials[0] if tiles_n == 1 else sum_partials(partials, probs.dtype)
    return dz, dprobs, h


def reference_grouped_gemm_dgrad_gated(
    dy: torch.Tensor,
    b: torch.Tensor,
    offsets: torch.Tensor,
    z: torch.Tensor,
    *,
    act: AnyActivation,
    interleaved: bool = False,
    clamped: bool = False,
    limit: float = 7.0,
    alpha: float = 1.0,
    probs: torch.Tensor | None = None,
    want_h: bool = False,
    out: torch.Tensor | None = None,
    dy_rows: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """In float32 (float64 for float64 inputs), ``dy`` standing for ``dy[dy_rows]`` where
    given, with ``z_a, z_b`` z's halves as in the forward:
    ``dh[r] = dy[r] @ b[g]`` for each group's rows r; ``dprobs = (dh * reference_gated(z_a,
    z_b)).sum(1)`` in ``probs``' dtype; ``(da, db) = reference_gated_grad(z_a, z_b, dh *
    probs[:, None])`` placed back in z's layout as ``dz`` (``z``'s dtype, or into ``out``);
    ``h = reference_gated(z_a, z_b) * probs[:, None]`` in ``z``'s dtype when ``want_h``.
    """
    if dy_rows is not None:
        dy = dy.index_select(0, dy_rows)
    dh = per_group_matmul(dy, b, offsets)
    z_a, z_b = gate_up(z, interleaved)
    gate = as_dtype(reference_gated(z_a, z_b, act, clamped, limit, alpha), dh.dtype)
    dprobs = None
    if probs is not None:
        dprobs = as_dtype((dh * gate).sum(1), probs.dtype)
        scale = probs.to(dh.dtype)[:, None]
        dh, gate = dh * scale, gate * scale
    da, db = reference_gated_grad(z_a, z_b, dh, act, clamped, limit, alpha)
    dz = torch.stack((da, db), dim=-1).flatten(1) if interleaved else torch.cat((da, db), dim=1)
    dz = out.copy_(dz) if out is not None else as_dtype(dz, z.dtype)
    return dz, dprobs, as_dtype(gate, z.dtype) if want_h else None
