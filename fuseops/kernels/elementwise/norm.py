"""LayerNorm and RMSNorm over the last dim, forward and backward, one kernel pair for both.

Shapes: ``x`` [rows, N] -> ``y`` [rows, N]; statistics ``mean``, ``rstd`` float32 [rows];
``weight``, ``bias`` [N] in the input dtype, scale ``weight`` (``1 + weight`` with
zero-centred gamma). Backward returns ``dx`` and the parameter gradients.
Tiling: a persistent grid walks blocks of BLOCK_M rows. A row that fits one BLOCK_N block
stays in registers; a longer one is read in BLOCK_N chunks, once per pass. Backward keeps
one float32 partial row of dweight / dbias per program; bias_grad's second stage sums them
(deterministic, no atomics).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from fuseops.kernels._triton import INTERPRET, cdiv, next_power_of_2, num_sms
from fuseops.kernels.dtypes import as_dtype
from fuseops.kernels.elementwise.bias_grad import sum_partials
from fuseops.kernels.launch import launch
from fuseops.kernels.quantization.formats import FP32_MAX

# A row whose float32 sum of squared deviations passes float32's maximum, 3.4e38 (from
# magnitudes of about 1.8e19 / sqrt(N); a LayerNorm row's sum, for its mean, later), is computed
# again divided by its largest magnitude: the plain formula (torch.nn's RMSNorm and LayerNorm too)
# gives an inf sum, rstd 0 and an output of zeros where the normalized row is right. Every other
# row keeps the plain formula's statistics and output bit for bit; the kernels check each row's
# sum, in a branch after the store where they can (finding every row's largest magnitude up
# front made the forward 9-76 % slower on an H200; the check's own cost: ``_FORWARD_MAXNREG``).
# The references accumulate in float64 instead (``_reference_variance``).
_FP32_MAX: tl.constexpr = tl.constexpr(FP32_MAX)


@dataclass(frozen=True)
class NormConfig:
    block_m: int
    block_n: int
    num_warps: int
    # The whole row fits one BLOCK_N block (held in registers, read once).
    one_block: bool
    # Persistent programs per multiprocessor (fewer where the rows are fewer).
    programs_per_sm: int
    # A register cap for ptxas (0: its own choice); ``_FORWARD_MAXNREG``.
    maxnreg: int = 0


@functools.cache
def _configs() -> tuple[int, int, int]:
    """``(max_block_n, tile_elements, programs_per_sm)``: rows up to ``max_block_n`` stay
    in registers, and a tile holds about ``tile_elements`` (several short rows per tile).
    Under the interpreter tiny blocks exercise the chunked path on test shapes. On GPU a
    forward thread keeps 8 values of a tile: ptxas's sm_90 register counts 50-90 (16 per
    thread took 167-245). These forward tiles of one-block rows (2048 elements, 4 programs a
    multiprocessor) measured (H100, bf16, GPU time in CUDA graphs) against 4096 elements with 8
    programs a multiprocessor: RMSNorm 1.08-1.10x slower at [16384, 1024 | 2048] and
    [4096, 4096] but 1.04-1.15x faster at [1024, 1024 | 2048] and [4096, 1024]; LayerNorm as
    fast or faster at all six shapes (1.00-1.29x). The backward's
    one-block tiles are ``_BACKWARD``'s."""
    if INTERPRET:
        return 64, 256, 1
    return 8192, 2048, 4


# The backward of rows that fit one block, on GPU: ``(tile_elements, values_per_thread,
# programs_per_sm)``. Swept on an H100 (RMSNorm, bf16, 1-16 rows x 4-16 warps x 2-8 programs a
# multiprocessor): the forward's tiles (8 values per thread, 4 programs a multiprocessor) ran at
# 234-2158 GB/s; 32 values per thread, two programs a multiprocessor, were 1.78x / 1.66x /
# 1.25x / 1.02x faster at [16384, 1024], [4096, 1024], [4096, 4096], [16384, 2048]. 64 values
# per thread were faster still at 1024 columns (up to 1.94x) but spill from 4096 columns (for
# sm_90a: LayerNorm's backward at 8192 columns 5.5 KB); at 32, 128-250 registers and no spills
# up to 8192 columns, RMS and LayerNorm.
_BACKWARD = (4096, 32, 2)


# The forward's register caps by warps a program, RMSNorm's and the chunked path's: the
# registers at which as many programs stay resident on a multiprocessor as before the check for
# rows whose squares overflow (``_overflowed``), which raised them: RMSNorm's one-block forward
# 36 -> 47 at 4096 columns (16 warps: three programs -> two), 32 -> 47 at 8192 (32 warps: two ->
# one), the chunked forward 32 -> 44-47 (32 warps), for sm_90a. Uncapped on an H200 (bf16) the
# 32-warp shapes took 1.46x and 1.26-1.28x the time they took without the check, capped at 32
# 1.06x and 0.85-1.06x. LayerNorm's one-block forward held 48 without it (the same programs
# resident with it) and ran slower capped (1.067x against 1.023x at 8192 columns): no cap.
_FORWARD_MAXNREG = {16: 40, 32: 32}


def forward_maxnreg(num_warps: int, one_block: bool, rms: bool) -> int:
    """The register cap of a forward program (0: none), ``_FORWARD_MAXNREG``'s rule; the norm +
    quantize forward's too (its rows' statistics are these kernels')."""
    return _FORWARD_MAXNREG.get(num_warps, 0) if rms or not one_block else 0


def _pick(rows: int, n: int, backward: bool = False, rms: bool = False) -> NormConfig:
    max_block_n, tile, programs_per_sm = _configs()
    block_n = min(next_power_of_2(n), max_block_n)
    one_block = n <= block_n
    if backward and one_block and not INTERPRET:
        tile, per_thread, programs_per_sm = _BACKWARD
        block_m = max(1, min(tile // block_n, next_power_of_2(max(rows, 1))))
        return NormConfig(block_m, block_n, max(4, block_m * block_n // (32 * per_thread)), True, programs_per_sm)
    block_m = max(1, min(tile // block_n, next_power_of_2(max(rows, 1))))
    # Warps grow with the tile so that a thread holds about 8 values of it.
    num_warps = 1 if INTERPRET else min(32, max(4, block_m * block_n // 256))
    maxnreg = 0 if backward else forward_maxnreg(num_warps, one_block, rms)
    return NormConfig(block_m, block_n, num_warps, one_block, programs_per_sm, maxnreg)


@functools.lru_cache(maxsize=1024)
def _launch_shape(rows: int, n: int, device_index: int, backward: bool = False,
                  rms: bool = False) -> tuple[NormConfig, int]:
    """The config and the program count for a [rows, n] launch (the backward's with
    ``backward``, RMSNorm's with ``rms``) on a device (-1: CPU), decided once per shape: a few
    microseconds of host time a launch otherwise."""
    cfg = _pick(rows, n, backward, rms)
    return cfg, max(1, min(cdiv(rows, cfg.block_m), cfg.programs_per_sm * num_sms(device_index)))


@triton.jit
def _load(ptr, offs_m, offs_n, mask_m, mask_n, stride):
    ptrs = ptr + offs_m[:, None].to(tl.int64) * stride + offs_n[None, :]
    # [BLOCK_M, BLOCK_N]
    return tl.load(ptrs, mask=mask_m[:, None] & mask_n[None, :], other=0.0).to(tl.float32)


@triton.jit
def _scale(w, offs_n, mask_n, ZERO_CENTERED: tl.constexpr):
    g = tl.load(w + offs_n, mask=mask_n, other=0.0).to(tl.float32)
    if ZERO_CENTERED:
        g += 1.0
    return g


@triton.jit
def _shift(b, offs_n, mask_n, HAS_BIAS: tl.constexpr):
    if HAS_BIAS:
        shift = tl.load(b + offs_n, mask=mask_n, other=0.0).to(tl.float32)
    else:
        shift = tl.zeros(offs_n.shape, dtype=tl.float32)
    return shift


@triton.jit
def _store(ptr, tile, offs_m, offs_n, mask_m, mask_n, stride):
    ptrs = ptr + offs_m[:, None].to(tl.int64) * stride + offs_n[None, :]
    tl.store(ptrs, tile.to(ptr.dtype.element_ty), mask=mask_m[:, None] & mask_n[None, :])


@triton.jit
def _row_mean(row_sums, N):
    """``row_sums / N`` as ``row_sums * (1 / N)``, the reciprocal correctly rounded once per
    program: exact for one value per row (and any power of two), within about an ulp
    elsewhere. Triton's ``/`` on float32 is ``div.full`` on the GPU (up to 2 ulp, and not
    exact even for N = 1): a row of one value came out centred to +-1 ulp instead of exactly
    0, which rstd (up to 1/sqrt(eps)) amplified, and LayerNorm(1) gave gradients of ~1e-5
    where torch's are 0 (the CUDA edge-case suite). A correctly rounded division per row
    (``tl.div_rn``) fixed that but made the one-block backward 15-27 % slower on the H100
    (register spills). The backward launches without FMA contraction, which
    would otherwise fold the product ``dy * w`` unrounded into ``wdy - mean(wdy)``."""
    inverse = tl.div_rn(tl.full((), 1.0, tl.float32), tl.full((), N, tl.float32))
    return row_sums * inverse


@triton.jit
def _overflowed(sum_sq):
    """Rows whose sum of squares is not finite: it overflowed, or the row holds an inf / a NaN."""
    return ~(sum_sq <= _FP32_MAX)


@triton.jit
def _row_scale(largest, overflowed):
    """``(scale, 1 / scale, scaled)`` per row: the largest magnitude where the row ``overflowed``
    and it is finite (a row with an inf or a NaN keeps its inf / NaN statistics, as torch's),
    else exactly 1."""
    scaled = overflowed & (largest <= _FP32_MAX)
    inverse = tl.div_rn(tl.full(largest.shape, 1.0, tl.float32), largest)
    return tl.where(scaled, largest, 1.0), tl.where(scaled, inverse, 1.0), scaled


@triton.jit
def _centered(xt, mask_n, N, IS_RMS: tl.constexpr, BLOCK_M: tl.constexpr):
    """``(xc, mean, sum of xc^2)`` per row of a tile; ``xc`` zero past N."""
    mean = tl.zeros((BLOCK_M,), dtype=tl.float32)
    if not IS_RMS:
        mean = _row_mean(tl.sum(xt, 1), N)
    xc = tl.where(mask_n[None, :], xt - mean[:, None], 0.0)
    return xc, mean, tl.sum(xc * xc, 1)


@triton.jit
def centered_one_block(x, offs_m, offs_n, mask_m, mask_n, N, stride_x, eps, IS_RMS: tl.constexpr,
                       BLOCK_M: tl.constexpr):
    """Rows that fit one [BLOCK_M, BLOCK_N] tile: ``(xc, mean, rstd, overflowed)`` in float32:
    ``xc`` the row centred (zeros past N), the output ``xc * rstd``, right wherever the row's
    squares did not overflow (``overflowed``: ``scaled_one_block`` then). RMSNorm is LayerNorm
    with the mean held at zero."""
    xc, mean, sum_sq = _centered(_load(x, offs_m, offs_n, mask_m, mask_n, stride_x), mask_n, N, IS_RMS, BLOCK_M)
    return xc, mean, 1.0 / tl.sqrt(_row_mean(sum_sq, N) + eps), _overflowed(sum_sq)


@triton.jit
def scaled_one_block(x, offs_m, offs_n, mask_m, mask_n, N, stride_x, eps, overflowed, IS_RMS: tl.constexpr,
                     BLOCK_M: tl.constexpr):
    """``centered_one_block``'s rows again from memory, each divided by its ``_row_scale``
    (exactly 1 where it did not overflow: the same values bit for bit): ``(xc, mean, rstd, r)``
    with the output ``xc * r``, ``xc`` and ``r`` of the scaled row, ``mean`` and ``rstd`` of the
    row itself. For blocks with an ``overflowed`` row alone: the common path holds no second
    tile (keeping ``xc`` beside this one cost 8-24 registers for sm_90a and 5-46 % of the
    forward's time on an H200)."""
    xt = _load(x, offs_m, offs_n, mask_m, mask_n, stride_x)
    scale, inverse, _ = _row_scale(tl.max(tl.abs(xt), 1), overflowed)
    xc, mean, sum_sq = _centered(xt * inverse[:, None], mask_n, N, IS_RMS, BLOCK_M)
    r = 1.0 / tl.sqrt(_row_mean(sum_sq, N) + eps * inverse * inverse)
    return xc, mean * scale, r * inverse, r


@triton.jit
def _chunked_centered_sums(x, offs_m, mask_m, N, stride_x, inverse, IS_RMS: tl.constexpr, SCALED: tl.constexpr,
                           BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """``(mean, sum((x - mean)^2))`` per row of rows wider than a tile, read BLOCK_N columns at a
    time, of the rows multiplied by ``inverse`` where SCALED. Squared deviations from the mean
    (not E[x^2] - mean^2, which cancels)."""
    mean = tl.zeros((BLOCK_M,), dtype=tl.float32)
    if not IS_RMS:
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for n0 in range(0, N, BLOCK_N):
            offs_n = n0 + tl.arange(0, BLOCK_N)
            xt = _load(x, offs_m, offs_n, mask_m, offs_n < N, stride_x)
            if SCALED:
                xt = xt * inverse[:, None]
            acc += xt
        mean = _row_mean(tl.sum(acc, 1), N)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for n0 in range(0, N, BLOCK_N):
        offs_n = n0 + tl.arange(0, BLOCK_N)
        mask_n = offs_n < N
        xt = _load(x, offs_m, offs_n, mask_m, mask_n, stride_x)
        if SCALED:
            xt = xt * inverse[:, None]
        xc = tl.where(mask_n[None, :], xt - mean[:, None], 0.0)
        acc += xc * xc
    return mean, tl.sum(acc, 1)


@triton.jit
def row_stats(x, offs_m, mask_m, N, stride_x, eps, IS_RMS: tl.constexpr, BLOCK_M: tl.constexpr,
              BLOCK_N: tl.constexpr):
    """(mean, rstd) in float32 of rows wider than a tile, read BLOCK_N columns at a time. A block
    holding a row whose squares overflowed reads its rows twice more: their largest magnitudes,
    then their statistics divided by their ``_row_scale`` (kept for the scaled rows alone)."""
    mean, sum_sq = _chunked_centered_sums(x, offs_m, mask_m, N, stride_x, 1.0, IS_RMS, False, BLOCK_M, BLOCK_N)
    rstd = 1.0 / tl.sqrt(_row_mean(sum_sq, N) + eps)
    overflowed = _overflowed(sum_sq)
    if tl.max(overflowed.to(tl.int32), 0) > 0:
        largest = tl.zeros((BLOCK_M,), dtype=tl.float32)
        for n0 in range(0, N, BLOCK_N):
            offs_n = n0 + tl.arange(0, BLOCK_N)
            largest = tl.maximum(largest, tl.max(tl.abs(_load(x, offs_m, offs_n, mask_m, offs_n < N, stride_x)), 1))
        scale, inverse, scaled = _row_scale(largest, overflowed)
        mean_s, sum_sq_s = _chunked_centered_sums(x, offs_m, mask_m, N, stride_x, inverse, IS_RMS, True, BLOCK_M,
                                                  BLOCK_N)
        r = 1.0 / tl.sqrt(_row_mean(sum_sq_s, N) + eps * inverse * inverse)
        mean = tl.where(scaled, mean_s * scale, mean)
        rstd = tl.where(scaled, r * inverse, rstd)
    return mean, rstd


@triton.jit
def norm_fwd_kernel(
    x, w, b, y, mean_ptr, rstd_ptr, M, N, stride_x, stride_y, eps, num_programs,
    IS_RMS: tl.constexpr, HAS_BIAS: tl.constexpr, ZERO_CENTERED: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, ONE_BLOCK: tl.constexpr,
):
    if ONE_BLOCK:
        # The parameters are loaded once, for every row this program normalizes.
        offs_n = tl.arange(0, BLOCK_N)
        mask_n = offs_n < N
        g = _scale(w, offs_n, mask_n, ZERO_CENTERED)
        shift = _shift(b, offs_n, mask_n, HAS_BIAS)
    for rb in range(tl.program_id(0), tl.cdiv(M, BLOCK_M), num_programs):
        offs_m = rb * BLOCK_M + tl.arange(0, BLOCK_M)
        mask_m = offs_m < M
        if ONE_BLOCK:
            xc, mean, rstd, overflowed = centered_one_block(x, offs_m, offs_n, mask_m, mask_n, N, stride_x, eps,
                                                            IS_RMS, BLOCK_M)
            _store(y, xc * rstd[:, None] * g[None, :] + shift[None, :], offs_m, offs_n, mask_m, mask_n, stride_y)
            # Checked after the store, which is in flight meanwhile, and written again (each thread
            # its own elements, in order): the common path waits on no extra reduction.
            if tl.max(overflowed.to(tl.int32), 0) > 0:
                xc, mean, rstd, r = scaled_one_block(x, offs_m, offs_n, mask_m, mask_n, N, stride_x, eps, overflowed,
                                                     IS_RMS, BLOCK_M)
                _store(y, xc * r[:, None] * g[None, :] + shift[None, :], offs_m, offs_n, mask_m, mask_n, stride_y)
        else:
            mean, rstd = row_stats(x, offs_m, mask_m, N, stride_x, eps, IS_RMS, BLOCK_M, BLOCK_N)
            for n0 in range(0, N, BLOCK_N):
                offs_n = n0 + tl.arange(0, BLOCK_N)
                mask_n = offs_n < N
                xc = _load(x, offs_m, offs_n, mask_m, mask_n, stride_x) - mean[:, None]
                g = _scale(w, offs_n, mask_n, ZERO_CENTERED)
                shift = _shift(b, offs_n, mask_n, HAS_BIAS)
                _store(y, xc * rstd[:, None] * g[None, :] + shift[None, :], offs_m, offs_n, mask_m, mask_n, stride_y)
        if not IS_RMS:
            tl.store(mean_ptr + offs_m, mean, mask=mask_m)
        tl.store(rstd_ptr + offs_m, rstd, mask=mask_m)


@triton.jit
def _bwd_chunk(dy, x, g, offs_m, offs_n, mask_m, mask_n, mean, rstd, stride_dy, stride_x):
    """``(dy, xhat, wdy)`` tiles; zero outside the masks."""
    dyt = _load(dy, offs_m, offs_n, mask_m, mask_n, stride_dy)
    xt = _load(x, offs_m, offs_n, mask_m, mask_n, stride_x)
    xhat = tl.where(mask_n[None, :], (xt - mean[:, None]) * rstd[:, None], 0.0)
    return dyt, xhat, dyt * g[None, :]


@triton.jit
def norm_bwd_kernel(
    dy, x, w, mean_ptr, rstd_ptr, dx, dw_partials, db_partials,
    M, N, stride_dy, stride_x, stride_dx, num_programs,
    IS_RMS: tl.constexpr, HAS_BIAS: tl.constexpr, ZERO_CENTERED: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, ONE_BLOCK: tl.constexpr,
):
    # dx = (wdy - xhat * mean(xhat * wdy) - mean(wdy)) * rstd, with wdy = dy * scale;
    # RMSNorm drops the last mean (and xhat = x * rstd).
    pid = tl.program_id(0)
    partial_row = pid.to(tl.int64) * N
    if ONE_BLOCK:
        offs_n = tl.arange(0, BLOCK_N)
        mask_n = offs_n < N
        g = _scale(w, offs_n, mask_n, ZERO_CENTERED)
        dw_acc = tl.zeros((BLOCK_N,), dtype=tl.float32)
        db_acc = tl.zeros((BLOCK_N,), dtype=tl.float32)
    for rb in range(pid, tl.cdiv(M, BLOCK_M), num_programs):
        offs_m = rb * BLOCK_M + tl.arange(0, BLOCK_M)
        mask_m = offs_m < M
        rstd = tl.load(rstd_ptr + offs_m, mask=mask_m, other=0.0)
        mean = tl.zeros((BLOCK_M,), dtype=tl.float32)
        if not IS_RMS:
            mean = tl.load(mean_ptr + offs_m, mask=mask_m, other=0.0)
        if ONE_BLOCK:
            dyt, xhat, wdy = _bwd_chunk(dy, x, g, offs_m, offs_n, mask_m, mask_n, mean, rstd, stride_dy, stride_x)
            c1 = _row_mean(tl.sum(xhat * wdy, 1), N)
            c2 = tl.zeros((BLOCK_M,), dtype=tl.float32)
            if not IS_RMS:
                c2 = _row_mean(tl.sum(wdy, 1), N)
            dxt = (wdy - xhat * c1[:, None] - c2[:, None]) * rstd[:, None]
            _store(dx, dxt, offs_m, offs_n, mask_m, mask_n, stride_dx)
            dw_acc += tl.sum(dyt * xhat, 0)
            if HAS_BIAS:
                db_acc += tl.sum(dyt, 0)
        else:
            c1_acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
            c2_acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
            for n0 in range(0, N, BLOCK_N):
                offs_n = n0 + tl.arange(0, BLOCK_N)
                mask_n = offs_n < N
                g = _scale(w, offs_n, mask_n, ZERO_CENTERED)
                dyt, xhat, wdy = _bwd_chunk(dy, x, g, offs_m, offs_n, mask_m, mask_n, mean, rstd, stride_dy, stride_x)
                c1_acc += xhat * wdy
                c2_acc += wdy
            c1 = _row_mean(tl.sum(c1_acc, 1), N)
            c2 = tl.zeros((BLOCK_M,), dtype=tl.float32)
            if not IS_RMS:
                c2 = _row_mean(tl.sum(c2_acc, 1), N)
            for n0 in range(0, N, BLOCK_N):
                offs_n = n0 + tl.arange(0, BLOCK_N)
                mask_n = offs_n < N
                g = _scale(w, offs_n, mask_n, ZERO_CENTERED)
                dyt, xhat, wdy = _bwd_chunk(dy, x, g, offs_m, offs_n, mask_m, mask_n, mean, rstd, stride_dy, stride_x)
                dxt = (wdy - xhat * c1[:, None] - c2[:, None]) * rstd[:, None]
                _store(dx, dxt, offs_m, offs_n, mask_m, mask_n, stride_dx)
                # The partial row is too long for registers: add into this program's own
                # row in memory. The barrier makes this program's earlier store to these
                # columns (by whichever thread made it) visible to this load.
                tl.debug_barrier()
                dw_ptrs = dw_partials + partial_row + offs_n
                tl.store(dw_ptrs, tl.load(dw_ptrs, mask=mask_n, other=0.0) + tl.sum(dyt * xhat, 0), mask=mask_n)
                if HAS_BIAS:
                    db_ptrs = db_partials + partial_row + offs_n
                    tl.store(db_ptrs, tl.load(db_ptrs, mask=mask_n, other=0.0) + tl.sum(dyt, 0), mask=mask_n)
    if ONE_BLOCK:
        tl.store(dw_partials + partial_row + offs_n, dw_acc, mask=mask_n)
        if HAS_BIAS:
            tl.store(db_partials + partial_row + offs_n, db_acc, mask=mask_n)


def _norm_fwd(x2d, weight, bias, eps, zero_centered_gamma, out, is_rms):
    M, N = x2d.shape
    cfg, programs = _launch_shape(M, N, x2d.get_device(), rms=is_rms)
    y = out if out is not None else torch.empty_like(x2d)
    rstd = torch.empty(M, dtype=torch.float32, device=x2d.device)
    # RMSNorm stores no mean: rstd stands in for the unused pointer.
    mean = rstd if is_rms else torch.empty_like(rstd)
    launch(norm_fwd_kernel, (programs,),
        x2d, weight, bias if bias is not None else weight, y, mean, rstd,
        M, N, x2d.stride(0), y.stride(0), eps, programs,
        IS_RMS=is_rms, HAS_BIAS=bias is not None, ZERO_CENTERED=zero_centered_gamma,
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, ONE_BLOCK=cfg.one_block, num_warps=cfg.num_warps,
        **({"maxnreg": cfg.maxnreg} if cfg.maxnreg else {}),
    )
    return y, mean, rstd


def _norm_bwd(dy2d, x2d, weight, mean, rstd, zero_centered_gamma, has_bias, is_rms):
    M, N = x2d.shape
    cfg, programs = _launch_shape(M, N, x2d.get_device(), backward=True)
    dx = torch.empty_like(x2d)
    # One block: every program stores its whole partial row (zeros when it had no rows), so
    # no memset launch; the chunked path adds into its row in memory, which starts at 0.
    alloc = torch.empty if cfg.one_block else torch.zeros
    dw_partials = alloc(programs, N, dtype=torch.float32, device=x2d.device)
    db_partials = alloc(programs, N, dtype=torch.float32, device=x2d.device) if has_bias else dw_partials
    launch(norm_bwd_kernel, (programs,),
        dy2d, x2d, weight, mean if mean is not None else rstd, rstd, dx, dw_partials, db_partials,
        M, N, dy2d.stride(0), x2d.stride(0), dx.stride(0), programs,
        IS_RMS=is_rms, HAS_BIAS=has_bias, ZERO_CENTERED=zero_centered_gamma,
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, ONE_BLOCK=cfg.one_block, num_warps=cfg.num_warps,
        # No FMA contraction: with one value per row, mean(wdy) is wdy, and a contracted
        # ``... - mean(wdy)`` subtracted the unrounded product dy * w from its rounded self
        # (dx ~1e-5 instead of 0 in the PTX for sm_90a).
        enable_fp_fusion=False,
    )
    dw = sum_partials(dw_partials, weight.dtype)
    return dx, dw, (sum_partials(db_partials, weight.dtype) if has_bias else None)


def layernorm_fwd(
    x2d: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    eps: float,
    zero_centered_gamma: bool = False,
    *,
    out: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """LayerNorm of each row (see ``reference_layernorm_fwd``).

    Args:
        x2d: [rows, N], contiguous; rows may be 0. weight, bias: [N] (bias may be None).
        out: [rows, N] for ``y``, written and returned; else allocated.
    Returns:
        ``(y, mean, rstd)``: ``y`` like ``x2d``; float32 [rows] statistics.
    """
    return _norm_fwd(x2d, weight, bias, eps, zero_centered_gamma, out, is_rms=False)


def layernorm_bwd(
    dy2d: torch.Tensor,
    x2d: torch.Tensor,
    weight: torch.Tensor,
    mean: torch.Tensor,
    rstd: torch.Tensor,
    zero_centered_gamma: bool = False,
    *,
    has_bias: bool = True,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Gradients of ``layernorm_fwd``.

    Args:
        dy2d, x2d: [rows, N], contiguous. weight: [N]. mean, rstd: the forward's float32 [rows].
        has_bias: whether to return ``dbias``.
    Returns:
        ``(dx, dweight, dbias)``: ``dx`` like ``x2d``; [N] in ``weight``'s dtype (float32
        sums, deterministic); ``dbias`` None without a bias.
    """
    return _norm_bwd(dy2d, x2d, weight, mean, rstd, zero_centered_gamma, has_bias, is_rms=False)


def rmsnorm_fwd(
    x2d: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    zero_centered_gamma: bool = False,
    *,
    out: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """RMSNorm of each row (see ``reference_rmsnorm_fwd``).

    Args:
        x2d: [rows, N], contiguous; rows may be 0. weight: [N].
        out: [rows, N] for ``y``, written and returned; else allocated.
    Returns:
        ``(y, rstd)``: ``y`` like ``x2d``; ``rstd`` float32 [rows].
    """
    y, _, rstd = _norm_fwd(x2d, weight, None, eps, zero_centered_gamma, out, is_rms=True)
    return y, rstd


def rmsnorm_bwd(
    dy2d: torch.Tensor,
    x2d: torch.Tensor,
    weight: torch.Tensor,
    rstd: torch.Tensor,
    zero_centered_gamma: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Gradients of ``rmsnorm_fwd``: ``(dx, dweight)``, like ``layernorm_bwd``."""
    dx, dw, _ = _norm_bwd(dy2d, x2d, weight, None, rstd, zero_centered_gamma, False, is_rms=True)
    return dx, dw


def _reference_variance(xc: torch.Tensor) -> torch.Tensor:
    """Per row of ``xc`` (centred, or ``x`` itself for RMSNorm): ``sum(xc^2) / N`` in float64,
    which no float32 row's squares overflow (3.4e38^2 ~ 1.2e77): a row of large finite values
    gets its variance where the kernels compute it again divided by its largest magnitude. One
    fused reduction (``vector_norm``): 0.15 ms against float32's square and mean 0.06 ms at
    [256, 1024] on one CPU thread, where the float32 sums, the rows' largest magnitudes and a
    second computation of the scaled rows took the forward 2.6-4x longer."""
    return torch.linalg.vector_norm(xc, dim=1, dtype=torch.float64).square() / xc.shape[1]


def _gamma(weight: torch.Tensor, zero_centered_gamma: bool, dtype: torch.dtype) -> torch.Tensor:
    return weight.to(dtype) + 1.0 if zero_centered_gamma else weight.to(dtype)


def reference_layernorm_fwd(
    x2d: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, eps: float,
    zero_centered_gamma: bool = False, *, out: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per row: ``mean = sum(x) / N``, ``var = sum((x - mean)^2) / N`` (biased),
    ``rstd = 1 / sqrt(var + eps)``, ``y = (x - mean) * rstd * g + bias`` with ``g = weight``
    or ``1 + weight`` (zero-centred gamma). In float32 (float64 for float64 input, as are
    ``mean`` and ``rstd``), the sums of ``mean`` and ``var`` accumulated in float64 (a row
    whose float32 squares overflow keeps its variance; ``_reference_variance``); ``y`` cast
    to ``x2d``'s dtype (or written into ``out``)."""
    c = torch.promote_types(x2d.dtype, torch.float32)
    xf = x2d.to(c)
    mean = xf.mean(1, dtype=torch.float64).to(c)
    xc = xf - mean[:, None]
    rstd = torch.rsqrt(_reference_variance(xc) + eps).to(c)
    y = xc * rstd[:, None] * _gamma(weight, zero_centered_gamma, c)
    if bias is not None:
        y = y + bias.to(c)
    return (out.copy_(y) if out is not None else as_dtype(y, x2d.dtype)), mean, rstd


def reference_layernorm_bwd(
    dy2d: torch.Tensor, x2d: torch.Tensor, weight: torch.Tensor, mean: torch.Tensor,
    rstd: torch.Tensor, zero_centered_gamma: bool = False, *, has_bias: bool = True,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """With ``xhat = (x - mean) * rstd`` and ``wdy = dy * g``, per row:
    ``dx = (wdy - xhat * mean(xhat * wdy) - mean(wdy)) * rstd``; over rows:
    ``dweight = sum(dy * xhat)``, ``dbias = sum(dy)``. In float32 (float64 for float64),
    ``dx`` cast to ``x2d``'s dtype, ``dweight`` / ``dbias`` to ``weight``'s."""
    c = torch.promote_types(x2d.dtype, torch.float32)
    dy = dy2d.to(c)
    xhat = (x2d.to(c) - mean.to(c)[:, None]) * rstd.to(c)[:, None]
    wdy = dy * _gamma(weight, zero_centered_gamma, c)
    dx = (wdy - xhat * (xhat * wdy).mean(1, keepdim=True) - wdy.mean(1, keepdim=True)) * rstd.to(c)[:, None]
    dbias = as_dtype(dy.sum(0), weight.dtype) if has_bias else None
    return as_dtype(dx, x2d.dtype), as_dtype((dy * xhat).sum(0), weight.dtype), dbias


def reference_rmsnorm_fwd(
    x2d: torch.Tensor, weight: torch.Tensor, eps: float, zero_centered_gamma: bool = False,
    *, out: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per row: ``rstd = 1 / sqrt(sum(x^2) / N + eps)``, ``y = x * rstd * g`` with
    ``g = weight`` or ``1 + weight``. In float32 (float64 for float64 input, as is
    ``rstd``), ``sum(x^2)`` accumulated in float64 (``_reference_variance``); ``y`` cast to
    ``x2d``'s dtype (or written into ``out``)."""
    c = torch.promote_types(x2d.dtype, torch.float32)
    xf = x2d.to(c)
    rstd = torch.rsqrt(_reference_variance(xf) + eps).to(c)
    y = xf * rstd[:, None] * _gamma(weight, zero_centered_gamma, c)
    return (out.copy_(y) if out is not None else as_dtype(y, x2d.dtype)), rstd


def reference_rmsnorm_bwd(
    dy2d: torch.Tensor, x2d: torch.Tensor, weight: torch.Tensor, rstd: torch.Tensor,
    zero_centered_gamma: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """With ``xhat = x * rstd`` and ``wdy = dy * g``: ``dx = (wdy - xhat * mean(xhat *
    wdy)) * rstd`` per row, ``dweight = sum(dy * xhat)`` over rows; precision as
    ``reference_layernorm_bwd``."""
    c = torch.promote_types(x2d.dtype, torch.float32)
    dy = dy2d.to(c)
    xhat = x2d.to(c) * rstd.to(c)[:, None]
    wdy = dy * _gamma(weight, zero_centered_gamma, c)
    dx = (wdy - xhat * (xhat * wdy).mean(1, keepdim=True)) * rstd.to(c)[:, None]
    return as_dtype(dx, x2d.dtype), as_dtype((dy * xhat).sum(0), weight.dtype)
