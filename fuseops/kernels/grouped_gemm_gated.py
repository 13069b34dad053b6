"""Grouped GEMMs with gated-activation epilogues: the two GEMMs of a MoE expert MLP that touch
the gate (FC1 forward, FC2 dgrad), over rows grouped by device offsets.

Forward: ``z = a[rows of g] @ b[g] + bias[g]`` [M, 2F] (``b`` [G, K, 2F], FC1's weight
transposed), ``h = gated(z_a, z_b) * probs[:, None]`` [M, F], optionally ``z`` saved.
Dgrad: ``dh = dy[rows of g] @ b[g]`` [M, F] (``b`` [G, H, F], FC2's weight), then from the
saved ``z``: ``dz`` [M, 2F] = ``gated_grad(z_a, z_b, dh * probs)`` in z's layout,
``dprobs[r] = sum_j dh[r, j] * gated(z_a, z_b)[r, j]``, and optionally ``h`` again (FC2's
weight gradient input). ``z_a, z_b`` are ``z[:, :F], z[:, F:]``, or with ``interleaved``
``z[:, 0::2], z[:, 1::2]``; ``gated`` is _activations.gated (clamped or not).

Tiling: grouped_gemm.py's persistent walk over group tiles (its helpers, imported). A forward
program owns BLOCK_N gated columns: two [BLOCK_M, BLOCK_N] accumulators for the gate and up
columns, or (interleaved) one [BLOCK_M, 2 * BLOCK_N] accumulator split in the epilogue.
``dprobs``: each column tile writes a float32 partial per row, bias_grad sums them (no atomics).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from fuseops.kernels._activations import (
    Activation,
    gated,
    gated_grad,
    reference_gated,
    reference_gated_grad,
)
from fuseops.kernels._triton import INTERPRET, dot
from fuseops.kernels.bias_grad import sum_partials
from fuseops.kernels.grouped_gemm import (
    GemmConfig,
    _group_tiles,
    _locate,
    _swizzle,
    epilogue,
    persistent_programs,
    ragged_descriptor,
    ragged_load,
    ragged_store,
    tma_ok,
)


def _configs() -> dict[str, GemmConfig]:
    """Tiles by operand class, forward and dgrad; ``block_n`` counts gated columns (a forward
    tile reads 2 * block_n columns of ``b``). Under the interpreter the 16-bit TMA class splits
    its epilogue like on GPU, so both epilogue forms are tested.

    On GPU, not timed yet: the largest tiles that compile for sm_90 without spills or SMEM
    overflow (triton.compile + ptxas -v, .notes/grouped_gemm_gated.md). ``fwd`` matches the
    MACs per K-step of grouped_gemm's measured 128x256 ``wide`` tile; ``dgrad`` is its
    ``fused`` tile (an epilogue that reads z). ``benchmarks/moe_layer.py`` is the measurement
    to retune them with.
    """
    if INTERPRET:
        tiny = GemmConfig(32, 32, 32, 2, 4, 1)
        split = GemmConfig(32, 32, 32, 2, 4, 1, split_epilogue=True)
        return {"fwd": split, "dgrad": split, "pointer": tiny, "fp32": tiny}
    return {
        "fwd": GemmConfig(128, 128, 64, 8, 8, 3, split_epilogue=True),
        "dgrad": GemmConfig(128, 128, 64, 8, 8, 3, split_epilogue=True),
        "pointer": GemmConfig(128, 64, 64, 8, 8, 3),
        "fp32": GemmConfig(64, 32, 32, 8, 4, 2),
    }


def _pick_config(kind: str, dtype: torch.dtype, tma: bool) -> GemmConfig:
    if dtype == torch.float32:
        return _configs()["fp32"]
    return _configs()[kind if tma else "pointer"]


@triton.jit
def _load_a(a, row0, size, off_m, k0, K, stride_am, TMA_LOAD: tl.constexpr,
            BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr):
    """[BLOCK_M, BLOCK_K] of ``a`` at group-local row ``off_m``; rows past the group are zeros
    (pointer path) or the next group's rows (TMA), never stored either way."""
    if TMA_LOAD:
        tile = a.load([(row0 + off_m).to(tl.int32), k0])
    else:
        offs_m = off_m + tl.arange(0, BLOCK_M)
        offs_k = k0 + tl.arange(0, BLOCK_K)
        ptrs = a + (row0 + offs_m)[:, None] * stride_am + offs_k[None, :]
        tile = tl.load(ptrs, mask=(offs_m < size)[:, None] & (offs_k < K)[None, :], other=0.0)
    return tile


@triton.jit
def _load_b(b, g, k0, n0, K, N, stride_bg, stride_bk, stride_bn, TMA_LOAD: tl.constexpr,
            B_TRANS: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_N: tl.constexpr):
    """[BLOCK_K, BLOCK_N] of ``b[g]``; with TMA a descriptor over the weight as it lies in
    memory ([G, N, K] when B_TRANS, else [G, K, N])."""
    if TMA_LOAD:
        if B_TRANS:
            tile = tl.trans(tl.reshape(b.load([g, n0, k0]), [BLOCK_N, BLOCK_K]))
        else:
            tile = tl.reshape(b.load([g, k0, n0]), [BLOCK_K, BLOCK_N])
    else:
        offs_k = k0 + tl.arange(0, BLOCK_K)
        offs_n = n0 + tl.arange(0, BLOCK_N)
        ptrs = b + g.to(tl.int64) * stride_bg + offs_k[:, None] * stride_bk + offs_n[None, :] * stride_bn
        tile = tl.load(ptrs, mask=(offs_k < K)[:, None] & (offs_n < N)[None, :], other=0.0)
    return tile


@triton.jit
def _halves(acc, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """Left and right [BLOCK_M, BLOCK_N / 2] halves: half the epilogue's registers at once."""
    return tl.split(tl.permute(tl.reshape(acc, [BLOCK_M, 2, BLOCK_N // 2]), (0, 2, 1)))


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
def _store_pair(z_a, z_b, ta, tb, row0, size, off_m, off_n, F, stride_zm,
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
def _load_pair(z_a, z_b, row0, size, off_m, off_n, F, stride_zm,
               INTERLEAVED: tl.constexpr, TMA: tl.constexpr,
               BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """Gate and up float32 tiles of z (layouts as ``_store_pair``); zeros outside the group."""
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
                  TMA_STORE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    offs_n = off_n + tl.arange(0, BLOCK_N)
    if HAS_BIAS:
        cols_a, cols_b = _pair_cols(offs_n, F, INTERLEAVED)
        mask_n = offs_n < F
        acc_a += tl.load(bias + g * stride_bias_g + cols_a, mask=mask_n, other=0.0).to(tl.float32)[None, :]
        acc_b += tl.load(bias + g * stride_bias_g + cols_b, mask=mask_n, other=0.0).to(tl.float32)[None, :]
    if SAVE_PREACT:
        _store_pair(z_a, z_b, acc_a, acc_b, row0, size, off_m, off_n, F, stride_zm, INTERLEAVED,
                    TMA_STORE, BLOCK_M, BLOCK_N)
    out = gated(acc_a, acc_b, ACT, CLAMPED, limit, alpha)
    # grouped_gemm's epilogue with only its row scale and store.
    epilogue(out, h, g, row0, size, off_m, off_n, F, stride_hm, probs, 0, probs, 0, probs, probs,
             0, alpha, 0, False, False, HAS_PROBS, False, TMA_STORE, BLOCK_M, BLOCK_N)


@triton.jit
def grouped_gemm_gated_fwd_kernel(
    a, b_a, b_b, h, z_a, z_b, offsets, bias, probs,
    G, F, K,
    stride_am, stride_bg, stride_bk, stride_bn, stride_hm, stride_zm, stride_bias_g,
    limit, alpha,
    ACT: tl.constexpr, CLAMPED: tl.constexpr, INTERLEAVED: tl.constexpr,
    HAS_BIAS: tl.constexpr, HAS_PROBS: tl.constexpr, SAVE_PREACT: tl.constexpr,
    TMA_LOAD: tl.constexpr, TMA_STORE: tl.constexpr, B_TRANS: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    SPLIT_EPILOGUE: tl.constexpr, BLOCK_G: tl.constexpr, NUM_PROGRAMS: tl.constexpr,
    FLATTEN: tl.constexpr,
):
    # b_a / b_b: the gate and up halves of b (views or descriptors); interleaved, b_a is all
    # of b and a tile reads its 2 * BLOCK_N columns from 2 * off_n.
    tiles_n = tl.cdiv(F, BLOCK_N)
    tiles, first = _group_tiles(offsets, G, tiles_n, BLOCK_M, BLOCK_G)
    k_tiles = tl.cdiv(K, BLOCK_K)
    for tile in tl.range(tl.program_id(0), tl.sum(tiles), NUM_PROGRAMS, flatten=FLATTEN):
        g, local = _locate(tile, tiles, first, BLOCK_G)
        row0 = tl.load(offsets + g)
        size = (tl.load(offsets + g + 1) - row0).to(tl.int32)
        pid_m, pid_n = _swizzle(local, tl.cdiv(size, BLOCK_M), tiles_n, GROUP_M)
        off_m = pid_m * BLOCK_M
        off_n = pid_n * BLOCK_N
        if INTERLEAVED:
            acc = tl.zeros((BLOCK_M, 2 * BLOCK_N), dtype=tl.float32)
            for ki in range(k_tiles):
                a_tile = _load_a(a, row0, size, off_m, ki * BLOCK_K, K, stride_am, TMA_LOAD,
                                 BLOCK_M, BLOCK_K)
                b_tile = _load_b(b_a, g, ki * BLOCK_K, 2 * off_n, K, 2 * F, stride_bg, stride_bk,
                                 stride_bn, TMA_LOAD, B_TRANS, BLOCK_K, 2 * BLOCK_N)
                acc = dot(a_tile, b_tile, acc)
            acc_a, acc_b = tl.split(tl.reshape(acc, [BLOCK_M, BLOCK_N, 2]))
        else:
            acc_a = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
            acc_b = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
            for ki in range(k_tiles):
                a_tile = _load_a(a, row0, size, off_m, ki * BLOCK_K, K, stride_am, TMA_LOAD,
                                 BLOCK_M, BLOCK_K)
                b_tile = _load_b(b_a, g, ki * BLOCK_K, off_n, K, F, stride_bg, stride_bk,
                                 stride_bn, TMA_LOAD, B_TRANS, BLOCK_K, BLOCK_N)
                acc_a = dot(a_tile, b_tile, acc_a)
                b_tile = _load_b(b_b, g, ki * BLOCK_K, off_n, K, F, stride_bg, stride_bk,
                                 stride_bn, TMA_LOAD, B_TRANS, BLOCK_K, BLOCK_N)
                acc_b = dot(a_tile, b_tile, acc_b)
        if SPLIT_EPILOGUE:
            a_l, a_r = _halves(acc_a, BLOCK_M, BLOCK_N)
            b_l, b_r = _halves(acc_b, BLOCK_M, BLOCK_N)
            _fwd_epilogue(a_l, b_l, h, z_a, z_b, bias, probs, g, row0, size, off_m, off_n, F,
                          stride_hm, stride_zm, stride_bias_g, limit, alpha, ACT, CLAMPED,
                          INTERLEAVED, HAS_BIAS, HAS_PROBS, SAVE_PREACT, TMA_STORE,
                          BLOCK_M, BLOCK_N // 2)
            _fwd_epilogue(a_r, b_r, h, z_a, z_b, bias, probs, g, row0, size, off_m,
                          off_n + BLOCK_N // 2, F, stride_hm, stride_zm, stride_bias_g, limit,
                          alpha, ACT, CLAMPED, INTERLEAVED, HAS_BIAS, HAS_PROBS, SAVE_PREACT,
                          TMA_STORE, BLOCK_M, BLOCK_N // 2)
        else:
            _fwd_epilogue(acc_a, acc_b, h, z_a, z_b, bias, probs, g, row0, size, off_m, off_n, F,
                          stride_hm, stride_zm, stride_bias_g, limit, alpha, ACT, CLAMPED,
                          INTERLEAVED, HAS_BIAS, HAS_PROBS, SAVE_PREACT, TMA_STORE,
                          BLOCK_M, BLOCK_N)


@triton.jit
def _dgrad_epilogue(dh, z_a, z_b, dz_a, dz_b, h, probs, g, row0, size, off_m, off_n, F,
                    stride_zm, stride_dzm, stride_hm, limit, alpha,
                    ACT: tl.constexpr, CLAMPED: tl.constexpr, INTERLEAVED: tl.constexpr,
                    HAS_PROBS: tl.constexpr, WANT_H: tl.constexpr, TMA_Z: tl.constexpr,
                    TMA_STORE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """Writes dz (and h) for one tile; returns its float32 row sums of ``dh * gated(z)``."""
    za, zb = _load_pair(z_a, z_b, row0, size, off_m, off_n, F, stride_zm, INTERLEAVED, TMA_Z,
                        BLOCK_M, BLOCK_N)
    offs_m = off_m + tl.arange(0, BLOCK_M)
    partial = tl.zeros((BLOCK_M,), dtype=tl.float32)
    if HAS_PROBS or WANT_H:
        out = gated(za, zb, ACT, CLAMPED, limit, alpha)
    if HAS_PROBS:
        # Columns past F hold dh = 0 (b read as zeros there), so they add nothing.
        partial = tl.sum(dh * out, 1)
        dh = dh * tl.load(probs + row0 + offs_m, mask=offs_m < size, other=0.0).to(tl.float32)[:, None]
    da, db = gated_grad(za, zb, dh, ACT, CLAMPED, limit, alpha)
    _store_pair(dz_a, dz_b, da, db, row0, size, off_m, off_n, F, stride_dzm, INTERLEAVED,
                TMA_STORE, BLOCK_M, BLOCK_N)
    if WANT_H:
        epilogue(out, h, g, row0, size, off_m, off_n, F, stride_hm, probs, 0, probs, 0, probs,
                 probs, 0, alpha, 0, False, False, HAS_PROBS, False, TMA_STORE, BLOCK_M, BLOCK_N)
    return partial


@triton.jit
def grouped_gemm_gated_bwd_kernel(
    dy, b, z_a, z_b, dz_a, dz_b, h, offsets, probs, partials,
    G, F, K, M,
    stride_dym, stride_bg, stride_bk, stride_bn, stride_zm, stride_dzm, stride_hm,
    limit, alpha,
    ACT: tl.constexpr, CLAMPED: tl.constexpr, INTERLEAVED: tl.constexpr,
    HAS_PROBS: tl.constexpr, WANT_H: tl.constexpr,
    TMA_LOAD: tl.constexpr, TMA_Z: tl.constexpr, TMA_STORE: tl.constexpr, B_TRANS: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    SPLIT_EPILOGUE: tl.constexpr, BLOCK_G: tl.constexpr, NUM_PROGRAMS: tl.constexpr,
    FLATTEN: tl.constexpr,
):
    # partials: [tiles_n, M]; the tile (g, pid_m, pid_n) owns its group's rows of row pid_n.
    tiles_n = tl.cdiv(F, BLOCK_N)
    tiles, first = _group_tiles(offsets, G, tiles_n, BLOCK_M, BLOCK_G)
    k_tiles = tl.cdiv(K, BLOCK_K)
    for tile in tl.range(tl.program_id(0), tl.sum(tiles), NUM_PROGRAMS, flatten=FLATTEN):
        g, local = _locate(tile, tiles, first, BLOCK_G)
        row0 = tl.load(offsets + g)
        size = (tl.load(offsets + g + 1) - row0).to(tl.int32)
        pid_m, pid_n = _swizzle(local, tl.cdiv(size, BLOCK_M), tiles_n, GROUP_M)
        off_m = pid_m * BLOCK_M
        off_n = pid_n * BLOCK_N
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for ki in range(k_tiles):
            a_tile = _load_a(dy, row0, size, off_m, ki * BLOCK_K, K, stride_dym, TMA_LOAD,
                             BLOCK_M, BLOCK_K)
            b_tile = _load_b(b, g, ki * BLOCK_K, off_n, K, F, stride_bg, stride_bk, stride_bn,
                             TMA_LOAD, B_TRANS, BLOCK_K, BLOCK_N)
            acc = dot(a_tile, b_tile, acc)
        if SPLIT_EPILOGUE:
            acc_l, acc_r = _halves(acc, BLOCK_M, BLOCK_N)
            partial = _dgrad_epilogue(
                acc_l, z_a, z_b, dz_a, dz_b, h, probs, g, row0, size, off_m, off_n, F, stride_zm,
                stride_dzm, stride_hm, limit, alpha, ACT, CLAMPED, INTERLEAVED, HAS_PROBS,
                WANT_H, TMA_Z, TMA_STORE, BLOCK_M, BLOCK_N // 2)
            partial += _dgrad_epilogue(
                acc_r, z_a, z_b, dz_a, dz_b, h, probs, g, row0, size, off_m,
                off_n + BLOCK_N // 2, F, stride_zm, stride_dzm, stride_hm, limit, alpha, ACT,
                CLAMPED, INTERLEAVED, HAS_PROBS, WANT_H, TMA_Z, TMA_STORE, BLOCK_M, BLOCK_N // 2)
        else:
            partial = _dgrad_epilogue(
                acc, z_a, z_b, dz_a, dz_b, h, probs, g, row0, size, off_m, off_n, F, stride_zm,
                stride_dzm, stride_hm, limit, alpha, ACT, CLAMPED, INTERLEAVED, HAS_PROBS,
                WANT_H, TMA_Z, TMA_STORE, BLOCK_M, BLOCK_N)
        if HAS_PROBS:
            offs_m = off_m + tl.arange(0, BLOCK_M)
            tl.store(partials + pid_n * M + row0 + offs_m,
                     partial.to(partials.dtype.element_ty), mask=offs_m < size)


def _pair_views(t: torch.Tensor | None, interleaved: bool) -> tuple[torch.Tensor | None, ...]:
    """Gate and up halves along the last dim (``t`` twice when interleaved: kernels stride)."""
    if t is None or interleaved:
        return t, t
    F = t.shape[-1] // 2
    return t[..., :F], t[..., F:]


def _pair_args(t, interleaved, tma, block_m, block_n):
    """Kernel arguments for a z-shaped tensor: ragged descriptors (``_store_pair``) or views."""
    views = _pair_views(t, interleaved)
    if t is None or not tma:
        return t, t
    if interleaved:
        desc = ragged_descriptor(t, [block_m, 2 * block_n])
        return desc, desc
    return tuple(ragged_descriptor(v, [block_m, block_n]) for v in views)


def _b_args(b_pair, b_trans, tma, block_k, width):
    if not tma:
        return b_pair
    return [TensorDescriptor.from_tensor(t, [1, width, block_k] if b_trans else [1, block_k, width])
            for t in b_pair]


def grouped_gemm_gated(
    a: torch.Tensor,
    b: torch.Tensor,
    offsets: torch.Tensor,
    *,
    bias: torch.Tensor | None = None,
    act: Activation,
    interleaved: bool = False,
    clamped: bool = False,
    limit: float = 7.0,
    alpha: float = 1.0,
    probs: torch.Tensor | None = None,
    save_preact: bool = False,
    out: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """FC1 of a gated expert MLP: ``h`` from ``z = a @ b[g] + bias[g]`` (module docstring).

    Args:
        a: [M, K], rows grouped contiguously; M == offsets[G] (never checked: no sync).
        b: [G, K, 2F], any strides (FC1's [G, 2F, K] weight transposed).
        offsets: int64 [G + 1] device tensor from ``group_offsets``.
        bias: [G, 2F] or None. probs: [M] row scale (router probabilities) or None.
        act, interleaved, clamped, limit, alpha: the gate (``_activations.gated``).
        save_preact: also return ``z`` [M, 2F] (``a``'s dtype, original column layout).
        out: [M, F] for ``h``, else allocated in ``a``'s dtype.
    Returns:
        ``(h, z)``; ``z`` is None unless ``save_preact``.
    """
    return launch_grouped_gemm_gated(a, b, offsets, bias, act, interleaved, clamped, limit, alpha,
                                     probs, save_preact, out, None)


def launch_grouped_gemm_gated(a, b, offsets, bias, act, interleaved, clamped, limit, alpha, probs,
                              save_preact, out, cfg: GemmConfig | None):
    """``grouped_gemm_gated`` with an explicit tile config (for a tuner), else the table's."""
    M, K = a.shape
    G, F = b.shape[0], b.shape[2] // 2
    a = a if a.stride(1) == 1 else a.contiguous()
    b = b if b.stride(1) == 1 or b.stride(2) == 1 else b.contiguous()
    h = out if out is not None else torch.empty(M, F, dtype=a.dtype, device=a.device)
    z = torch.empty(M, 2 * F, dtype=a.dtype, device=a.device) if save_preact else None
    b_trans = b.stride(2) != 1
    b_pair = _pair_views(b, interleaved)
    b_mem = [t.transpose(1, 2) if b_trans else t for t in b_pair]
    tma_load = tma_ok(a, *b_mem)
    tma_store = tma_ok(h, *_pair_views(z, interleaved))
    cfg = cfg or _pick_config("fwd", a.dtype, tma_load and tma_store)
    bm, bn, bk = cfg.block_m, cfg.block_n, cfg.block_k
    epi_n = bn // 2 if cfg.split_epilogue else bn
    a_arg = TensorDescriptor.from_tensor(a, [bm, bk]) if tma_load else a
    programs = persistent_programs(a, (triton.cdiv(M, bm) + G) * triton.cdiv(F, bn))
    grouped_gemm_gated_fwd_kernel[(programs,)](
        a_arg, *_b_args(b_mem if tma_load else b_pair, b_trans, tma_load, bk, 2 * bn if interleaved else bn),
        ragged_descriptor(h, [bm, epi_n]) if tma_store else h,
        *_pair_args(z if z is not None else h, interleaved, tma_store and z is not None, bm, epi_n),
        offsets, bias if bias is not None else h, probs if probs is not None else h,
        G, F, K,
        a.stride(0), b.stride(0), b.stride(1), b.stride(2), h.stride(0),
        z.stride(0) if z is not None else 0, bias.stride(0) if bias is not None else 0,
        float(limit), float(alpha),
        ACT=int(act), CLAMPED=clamped, INTERLEAVED=interleaved, HAS_BIAS=bias is not None,
        HAS_PROBS=probs is not None, SAVE_PREACT=save_preact, TMA_LOAD=tma_load,
        TMA_STORE=tma_store, B_TRANS=b_trans, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk,
        GROUP_M=cfg.group_m, SPLIT_EPILOGUE=cfg.split_epilogue,
        BLOCK_G=max(16, triton.next_power_of_2(G)), NUM_PROGRAMS=programs, FLATTEN=cfg.flatten,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )
    return h, z


def grouped_gemm_dgrad_gated(
    dy: torch.Tensor,
    b: torch.Tensor,
    offsets: torch.Tensor,
    z: torch.Tensor,
    *,
    act: Activation,
    interleaved: bool = False,
    clamped: bool = False,
    limit: float = 7.0,
    alpha: float = 1.0,
    probs: torch.Tensor | None = None,
    want_h: bool = False,
    out: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """FC2's dgrad through the gate: ``dz``, ``dprobs`` and ``h`` (module docstring).

    Args:
        dy: [M, H] upstream gradient of FC2's output, rows grouped as ``offsets``.
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
                                           alpha, probs, want_h, out, None)


def launch_grouped_gemm_dgrad_gated(dy, b, offsets, z, act, interleaved, clamped, limit, alpha,
                                    probs, want_h, out, cfg: GemmConfig | None):
    """``grouped_gemm_dgrad_gated`` with an explicit tile config, else the table's."""
    M, K = dy.shape
    G, F = b.shape[0], b.shape[2]
    dy = dy if dy.stride(1) == 1 else dy.contiguous()
    z = z if z.stride(1) == 1 else z.contiguous()
    b = b if b.stride(1) == 1 or b.stride(2) == 1 else b.contiguous()
    dz = out if out is not None else torch.empty(M, 2 * F, dtype=z.dtype, device=z.device)
    h = torch.empty(M, F, dtype=z.dtype, device=z.device) if want_h else None
    b_trans = b.stride(2) != 1
    b_mem = b.transpose(1, 2) if b_trans else b
    tma_load = tma_ok(dy, b_mem)
    tma_z = tma_ok(*_pair_views(z, interleaved))
    tma_store = tma_ok(h, *_pair_views(dz, interleaved))
    cfg = cfg or _pick_config("dgrad", dy.dtype, tma_load and tma_z and tma_store)
    bm, bn, bk = cfg.block_m, cfg.block_n, cfg.block_k
    epi_n = bn // 2 if cfg.split_epilogue else bn
    tiles_n = triton.cdiv(F, bn)
    partials = None
    if probs is not None:
        # One column tile holds the whole row sum: it goes straight to the output.
        partials = torch.empty(tiles_n, M, dtype=probs.dtype if tiles_n == 1 else torch.float32,
                               device=dy.device)
    programs = persistent_programs(dy, (triton.cdiv(M, bm) + G) * tiles_n)
    grouped_gemm_gated_bwd_kernel[(programs,)](
        TensorDescriptor.from_tensor(dy, [bm, bk]) if tma_load else dy,
        *_b_args([b_mem if tma_load else b], b_trans, tma_load, bk, bn),
        *_pair_args(z, interleaved, tma_z, bm, epi_n),
        *_pair_args(dz, interleaved, tma_store, bm, epi_n),
        (ragged_descriptor(h, [bm, epi_n]) if tma_store else h) if h is not None else dz,
        offsets, probs if probs is not None else dz, partials if partials is not None else dz,
        G, F, K, M,
        dy.stride(0), b.stride(0), b.stride(1), b.stride(2), z.stride(0), dz.stride(0),
        h.stride(0) if h is not None else 0,
        float(limit), float(alpha),
        ACT=int(act), CLAMPED=clamped, INTERLEAVED=interleaved, HAS_PROBS=probs is not None,
        WANT_H=want_h, TMA_LOAD=tma_load, TMA_Z=tma_z, TMA_STORE=tma_store, B_TRANS=b_trans,
        BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=cfg.group_m,
        SPLIT_EPILOGUE=cfg.split_epilogue, BLOCK_G=max(16, triton.next_power_of_2(G)),
        NUM_PROGRAMS=programs, FLATTEN=cfg.flatten,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )
    dprobs = None
    if partials is not None:
        dprobs = partials[0] if tiles_n == 1 else sum_partials(partials, probs.dtype)
    return dz, dprobs, h


def _gate_up(z: torch.Tensor, interleaved: bool) -> tuple[torch.Tensor, torch.Tensor]:
    return (z[:, 0::2], z[:, 1::2]) if interleaved else z.chunk(2, dim=1)


def _per_group_matmul(a: torch.Tensor, b: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    """``a[rows of g] @ b[g]`` for every group, in float32 (float64 for float64 inputs)."""
    compute = torch.promote_types(a.dtype, torch.float32)
    y = torch.zeros(a.shape[0], b.shape[2], dtype=compute, device=a.device)
    bounds = offsets.tolist()
    for g in range(b.shape[0]):
        r = slice(bounds[g], bounds[g + 1])
        y[r] = a[r].to(compute) @ b[g].to(compute)
    return y


def reference_grouped_gemm_gated(
    a: torch.Tensor,
    b: torch.Tensor,
    offsets: torch.Tensor,
    *,
    bias: torch.Tensor | None = None,
    act: Activation,
    interleaved: bool = False,
    clamped: bool = False,
    limit: float = 7.0,
    alpha: float = 1.0,
    probs: torch.Tensor | None = None,
    save_preact: bool = False,
    out: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """For each group g and its rows r = offsets[g]:offsets[g+1], in float32 (float64 for
    float64 inputs): ``z[r] = a[r] @ b[g] (+ bias[g])``; ``z_a, z_b = z[:, :F], z[:, F:]``
    (interleaved: ``z[:, 0::2], z[:, 1::2]``); ``h = reference_gated(z_a, z_b) * probs[:,
    None]`` (no ``probs`` means 1), cast to ``a``'s dtype or written into ``out``; ``z``
    returned in ``a``'s dtype when ``save_preact``.
    """
    z = _per_group_matmul(a, b, offsets)
    if bias is not None:
        z += torch.repeat_interleave(bias.to(z.dtype), offsets.diff(), dim=0, output_size=a.shape[0])
    h = reference_gated(*_gate_up(z, interleaved), act, clamped, limit, alpha)
    if probs is not None:
        h = h * probs.to(h.dtype)[:, None]
    h = out.copy_(h) if out is not None else h.to(a.dtype)
    return h, z.to(a.dtype) if save_preact else None


def reference_grouped_gemm_dgrad_gated(
    dy: torch.Tensor,
    b: torch.Tensor,
    offsets: torch.Tensor,
    z: torch.Tensor,
    *,
    act: Activation,
    interleaved: bool = False,
    clamped: bool = False,
    limit: float = 7.0,
    alpha: float = 1.0,
    probs: torch.Tensor | None = None,
    want_h: bool = False,
    out: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """In float32 (float64 for float64 inputs), with ``z_a, z_b`` z's halves as in the forward:
    ``dh[r] = dy[r] @ b[g]`` for each group's rows r; ``dprobs = (dh * reference_gated(z_a,
    z_b)).sum(1)`` in ``probs``' dtype; ``(da, db) = reference_gated_grad(z_a, z_b, dh *
    probs[:, None])`` placed back in z's layout as ``dz`` (``z``'s dtype, or into ``out``);
    ``h = reference_gated(z_a, z_b) * probs[:, None]`` in ``z``'s dtype when ``want_h``.
    """
    dh = _per_group_matmul(dy, b, offsets)
    z_a, z_b = _gate_up(z, interleaved)
    gate = reference_gated(z_a, z_b, act, clamped, limit, alpha).to(dh.dtype)
    dprobs = None
    if probs is not None:
        dprobs = (dh * gate).sum(1).to(probs.dtype)
        scale = probs.to(dh.dtype)[:, None]
        dh, gate = dh * scale, gate * scale
    da, db = reference_gated_grad(z_a, z_b, dh, act, clamped, limit, alpha)
    dz = torch.stack((da, db), dim=-1).flatten(1) if interleaved else torch.cat((da, db), dim=1)
    dz = out.copy_(dz) if out is not None else dz.to(z.dtype)
    return dz, dprobs, gate.to(z.dtype) if want_h else None
