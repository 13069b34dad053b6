"""Dense GEMM with a gated-activation epilogue: Linear + bias + SwiGLU (or any GLU) forward.

``y = gated(z_a, z_b)`` [M, F] where ``z = a @ b + bias`` [M, 2F], ``a`` [M, K] row-major,
``b`` [K, 2F] a strided view (``weight.t()`` of a Linear with 2F outputs), and ``z_a``,
``z_b`` its gate and up columns: ``z[:, :F]``, ``z[:, F:]``, or with ``interleaved``
``z[:, 0::2]``, ``z[:, 1::2]``. Optionally ``z`` is saved in its original column layout.

Tiling: as in gemm/dense.py (persistent grid, GROUP_M bands, TMA when aligned); each program owns
BLOCK_N output columns and keeps two [BLOCK_M, BLOCK_N] accumulators, for the gate and the
up columns, or (interleaved) one [BLOCK_M, 2 * BLOCK_N] accumulator split in the epilogue.
"""

from __future__ import annotations

import dataclasses
import functools

import torch
import triton
import triton.language as tl

from fuseops.kernels._triton import INTERPRET, cdiv, device_sms, dot, float32_dot_precision, float32_matmul_in_tf32
from fuseops.kernels.dtypes import as_dtype
from fuseops.kernels.elementwise.activation_math import (
    AnyActivation,
    activation_code,
    gated,
    kernel_act,
    reference_gated,
)
from fuseops.kernels.gemm.dense import (
    GemmConfig,
    PlannedDescriptor,
    load_a,
    load_b,
    pick_config,
    planned_descriptor,
    store_mn,
    swizzle,
    tma_ok,
)
from fuseops.kernels.launch import launch


@functools.cache
def _configs() -> dict[str, GemmConfig]:
    """Tile shapes by operand class (as in gemm/dense.py); ``block_n`` counts output columns, so a
    tile reads 2 * block_n columns of ``b``.

    ``tma`` was chosen on an H100 by ``python -m benchmarks.gemm --tune`` (bf16 SwiGLU with
    the pre-activation saved): warp specialization lifts the
    two-accumulator loop from 555 to 659-695 TFLOP/s at M, K, 2F = 16384, 4096, 14336 and
    16384, 14336, 4096, and also wins at 1024, 4096, 4096 (635 against at most 520).
    ``pointer`` and ``fp32`` are the largest tiles that compile for sm_90 without spills.
    """
    if INTERPRET:
        tiny = GemmConfig(32, 32, 32, 2, 4, 1)
        return {"tma": tiny, "pointer": tiny, "fp32": tiny}
    return {
        "tma": GemmConfig(128, 128, 64, 8, 8, 3, warp_specialize=True),
        "pointer": GemmConfig(128, 64, 64, 8, 8, 3),
        "fp32": GemmConfig(64, 32, 32, 8, 8, 3),
    }


@triton.jit
def gemm_gated_kernel(
    a, b_a, b_b, y, preact_a, preact_b, bias,
    M, F, K, num_programs,
    stride_am, stride_bk, stride_bn, stride_ym, stride_pm,
    limit, alpha,
    ACT: tl.constexpr, CLAMPED: tl.constexpr, INTERLEAVED: tl.constexpr,
    HAS_BIAS: tl.constexpr, SAVE_PREACT: tl.constexpr,
    TMA_LOAD: tl.constexpr, TMA_EPI: tl.constexpr, B_TRANS: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    FLATTEN: tl.constexpr, WARP_SPECIALIZE: tl.constexpr, F32_DOT: tl.constexpr,
):
    # Concatenated: b_a / b_b and preact_a / preact_b are the [.., F] gate and up halves
    # (views or descriptors over them). Interleaved: b_a and preact_a span all 2F columns.
    tiles_m = tl.cdiv(M, BLOCK_M)
    tiles_n = tl.cdiv(F, BLOCK_N)
    k_tiles = tl.cdiv(K, BLOCK_K)
    for tile in tl.range(tl.program_id(0), tiles_m * tiles_n, num_programs, flatten=FLATTEN,
                         warp_specialize=WARP_SPECIALIZE):
        pid_m, pid_n = swizzle(tile, tiles_m, tiles_n, GROUP_M)
        m0 = pid_m * BLOCK_M
        n0 = pid_n * BLOCK_N
        offs_m = m0 + tl.arange(0, BLOCK_M)
        offs_n = n0 + tl.arange(0, BLOCK_N)
        mask_n = offs_n < F
        mask = (offs_m < M)[:, None] & mask_n[None, :]
        if INTERLEAVED:
            acc = tl.zeros((BLOCK_M, 2 * BLOCK_N), dtype=tl.float32)
            for ki in range(k_tiles):
                a_tile = load_a(a, m0, ki * BLOCK_K, M, K, stride_am, TMA_LOAD, BLOCK_M, BLOCK_K)
                b_tile = load_b(b_a, ki * BLOCK_K, 2 * n0, K, 2 * F, stride_bk, stride_bn,
                                TMA_LOAD, B_TRANS, BLOCK_K, 2 * BLOCK_N)
                acc = dot(a_tile, b_tile, acc, F32_DOT)
            offs_2n = 2 * n0 + tl.arange(0, 2 * BLOCK_N)
            if HAS_BIAS:
                acc += tl.load(bias + offs_2n, mask=offs_2n < 2 * F, other=0.0).to(tl.float32)[None, :]
            if SAVE_PREACT:
                # In two [BLOCK_M, BLOCK_N] halves: one 2 * BLOCK_N wide store buffer does
                # not fit in shared memory beside the pipeline's.
                lo, hi = tl.split(tl.permute(tl.reshape(acc, (BLOCK_M, 2, BLOCK_N)), (0, 2, 1)))
                offs_lo = 2 * n0 + tl.arange(0, BLOCK_N)
                mask_lo = (offs_m < M)[:, None] & (offs_lo < 2 * F)[None, :]
                store_mn(preact_a, lo, m0, 2 * n0, offs_m, offs_lo, mask_lo, stride_pm, TMA_EPI)
                offs_hi = offs_lo + BLOCK_N
                mask_hi = (offs_m < M)[:, None] & (offs_hi < 2 * F)[None, :]
                store_mn(preact_a, hi, m0, 2 * n0 + BLOCK_N, offs_m, offs_hi, mask_hi, stride_pm,
                         TMA_EPI)
            z_a, z_b = tl.split(tl.reshape(acc, (BLOCK_M, BLOCK_N, 2)))
        else:
            z_a = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
            z_b = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
            for ki in range(k_tiles):
                a_tile = load_a(a, m0, ki * BLOCK_K, M, K, stride_am, TMA_LOAD, BLOCK_M, BLOCK_K)
                b_tile = load_b(b_a, ki * BLOCK_K, n0, K, F, stride_bk, stride_bn, TMA_LOAD,
                                B_TRANS, BLOCK_K, BLOCK_N)
                z_a = dot(a_tile, b_tile, z_a, F32_DOT)
                b_tile = load_b(b_b, ki * BLOCK_K, n0, K, F, stride_bk, stride_bn, TMA_LOAD,
                                B_TRANS, BLOCK_K, BLOCK_N)
                z_b = dot(a_tile, b_tile, z_b, F32_DOT)
            if HAS_BIAS:
                z_a += tl.load(bias + offs_n, mask=mask_n, other=0.0).to(tl.float32)[None, :]
                z_b += tl.load(bias + F + offs_n, mask=mask_n, other=0.0).to(tl.float32)[None, :]
            if SAVE_PREACT:
                store_mn(preact_a, z_a, m0, n0, offs_m, offs_n, mask, stride_pm, TMA_EPI)
                store_mn(preact_b, z_b, m0, n0, offs_m, offs_n, mask, stride_pm, TMA_EPI)
        out = gated(z_a, z_b, ACT, CLAMPED, limit, alpha)
        store_mn(y, out, m0, n0, offs_m, offs_n, mask, stride_ym, TMA_EPI)


def gemm_gated(
    a: torch.Tensor,
    b: torch.Tensor,
    *,
    bias: torch.Tensor | None = None,
    act: AnyActivation,
    interleaved: bool = False,
    clamped: bool = False,
    limit: float = 7.0,
    alpha: float = 1.0,
    save_preact: bool = False,
    out: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``gated(z_a, z_b)`` of ``z = a @ b + bias`` (module docstring).

    Args:
        a: [M, K], row-major.
        b: [K, 2F], any strides (``weight.t()`` of a Linear with 2F outputs).
        bias: [2F] or None.
        act, clamped, limit, alpha: the gate function (``gated`` in elementwise/activation_math.py).
        interleaved: gate and up columns alternate (else gate first, then up).
        save_preact: also return ``z`` [M, 2F] (in ``a``'s dtype, original column layout).
        out: [M, F] output to write into, else allocated in ``a``'s dtype.
    Returns:
        ``(y, preact)``; ``preact`` is None unless ``save_preact``.
    """
    return launch_gemm_gated(a, b, bias, act, interleaved, clamped, limit, alpha, save_preact,
                             out, None)


def launch_gemm_gated(a, b, bias, act, interleaved, clamped, limit, alpha, save_preact, out,
                      cfg: GemmConfig | None):
    """``gemm_gated`` with an explicit tile config (what the offline tuner passes), else the
    table's. What the call's class decides (``_plan``) is kept from the first call of the
    class: the per-call work is the outputs, the halves' views and the descriptors' bases."""
    M = a.shape[0]
    F = b.shape[1] // 2
    y = out if out is not None else torch.empty(M, F, dtype=a.dtype, device=a.device)
    preact = torch.empty(M, 2 * F, dtype=a.dtype, device=a.device) if save_preact else None
    if M == 0 or F == 0:
        return y, preact
    a = a if a.stride(1) == 1 else a.contiguous()
    b = b if 1 in b.stride() else b.contiguous()
    plan = _plan(a, b, y, preact, bias, act, interleaved, clamped, cfg)
    # The gate and up halves (``split``: both views in one call); interleaved, the whole tensors.
    if plan.tma_load:
        # Descriptors over b's halves as the kernel reads them: transposed when K is contiguous.
        a_arg = plan.a_desc.over(a)
        b_read = b.t() if plan.b_trans else b
        halves = (b_read, b_read) if interleaved else b_read.split(F, 0 if plan.b_trans else 1)
        b_a_arg, b_b_arg = plan.b_desc.over(halves[0]), plan.b_desc.over(halves[1])
    else:
        a_arg = a
        b_a_arg, b_b_arg = (b, b) if interleaved else b.split(F, 1)
    p_a_arg = p_b_arg = y  # the kernel's stand-ins when nothing is saved
    if preact is not None:
        p_a_arg, p_b_arg = (preact, preact) if interleaved else preact.split(F, 1)
    if plan.tma_epi:
        y_arg = plan.y_desc.over(y)
        if preact is not None:
            p_a_arg, p_b_arg = plan.preact_desc.over(p_a_arg), plan.preact_desc.over(p_b_arg)
    else:
        y_arg = y
    launch(gemm_gated_kernel, plan.grid,
        a_arg, b_a_arg, b_b_arg, y_arg, p_a_arg, p_b_arg, y if bias is None else bias,
        *plan.ints, float(limit), float(alpha),
        **plan.constexprs,
    )
    return y, preact


@dataclasses.dataclass(frozen=True)
class _GatedPlan:
    """What ``launch_gemm_gated`` decides from shapes, strides, dtypes and 16-byte alignment:
    the grid, the int arguments, the constexprs and, on the TMA paths, the descriptors'
    shapes, strides and blocks (one for both halves of ``b``, one for both of ``preact``)."""

    tma_load: bool
    tma_epi: bool
    b_trans: bool
    grid: tuple[int]
    ints: tuple[int, ...]
    constexprs: dict
    a_desc: PlannedDescriptor | None
    b_desc: PlannedDescriptor | None
    y_desc: PlannedDescriptor | None
    preact_desc: PlannedDescriptor | None


# Plans by call class; a new class adds one (bounded: cleared when it grows past the limit).
_plans: dict[tuple, _GatedPlan] = {}
_MAX_PLANS = 4096


def _plan(a, b, y, preact, bias, act, interleaved, clamped, cfg) -> _GatedPlan:
    """The plan of one call, from the cache when its class was seen before. The class holds
    what ``tma_ok``, the config table, the grid and the descriptors read besides data pointers
    (shapes, strides, dtypes), and whether ``a`` and ``b`` and the outputs are 16-byte aligned:
    the halves' alignment follows from their base's and the class (a misaligned base makes
    the first half misaligned, so TMA is off either way); for float32 operands the matmul
    precision torch asks for now. ``act`` keyed as its int."""
    key = (a.shape, a.stride(0), a.dtype, b.shape, b.stride(), b.dtype, y.shape, y.stride(), y.dtype,
           a.get_device(), bias is not None, activation_code(act), bool(interleaved), bool(clamped),
           preact is not None, cfg,
           not (a.data_ptr() | b.data_ptr()) & 15,
           not (y.data_ptr() | (0 if preact is None else preact.data_ptr())) & 15,
           a.dtype is torch.float32 and float32_matmul_in_tf32())
    plan = _plans.get(key)
    if plan is None:
        if len(_plans) >= _MAX_PLANS:
            _plans.clear()
        plan = _plans[key] = _new_plan(a, b, y, preact, bias, act, interleaved, clamped, cfg)
    return plan


def _new_plan(a, b, y, preact, bias, act, interleaved, clamped, cfg) -> _GatedPlan:
    M, K = a.shape
    F = b.shape[1] // 2
    if interleaved:
        b_a, b_b, p_a, p_b = b, b, preact, preact
    else:
        b_a, b_b = b[:, :F], b[:, F:]
        p_a, p_b = (None, None) if preact is None else (preact[:, :F], preact[:, F:])
    b_trans = b.stride(1) != 1
    tma_load = tma_ok(a, *((t.t() if b_trans else t) for t in (b_a, b_b)))
    tma_epi = tma_ok(y, p_a, p_b)
    cfg = cfg or pick_config(_configs(), a.dtype, tma_load and tma_epi)
    bm, bn, bk = cfg.block_m, cfg.block_n, cfg.block_k
    width = 2 * bn if interleaved else bn
    tiles = cdiv(M, bm) * cdiv(F, bn)
    programs = max(1, min(cfg.programs_per_sm * device_sms(a), tiles))
    constexprs = dict(
        ACT=kernel_act(act), CLAMPED=clamped, INTERLEAVED=interleaved, HAS_BIAS=bias is not None,
        SAVE_PREACT=preact is not None, TMA_LOAD=tma_load, TMA_EPI=tma_epi, B_TRANS=b_trans,
        BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=cfg.group_m,
        FLATTEN=not cfg.warp_specialize, WARP_SPECIALIZE=cfg.warp_specialize,
        F32_DOT=float32_dot_precision(a.dtype), num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )
    ints = (M, F, K, programs, a.stride(0), b.stride(0), b.stride(1), y.stride(0),
            0 if preact is None else preact.stride(0))
    a_desc = b_desc = y_desc = preact_desc = None
    if tma_load:
        a_desc = planned_descriptor(a, (bm, bk))
        b_desc = planned_descriptor(b_a.t(), (width, bk)) if b_trans else planned_descriptor(b_a, (bk, width))
    if tma_epi:
        y_desc = planned_descriptor(y, (bm, bn))
        preact_desc = None if p_a is None else planned_descriptor(p_a, (bm, bn))
    return _GatedPlan(tma_load, tma_epi, b_trans, (programs,), ints, constexprs, a_desc, b_desc, y_desc, preact_desc)


def reference_gemm_gated(
    a: torch.Tensor,
    b: torch.Tensor,
    *,
    bias: torch.Tensor | None = None,
    act: AnyActivation,
    interleaved: bool = False,
    clamped: bool = False,
    limit: float = 7.0,
    alpha: float = 1.0,
    save_preact: bool = False,
    out: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """In float32 (float64 for float64 inputs):

    ``z = a @ b (+ bias[None, :])`` [M, 2F];
    ``z_a, z_b = z[:, 0::2], z[:, 1::2]`` if ``interleaved`` else ``z[:, :F], z[:, F:]``;
    ``y = act(z_a') * (z_b' + offset)`` (``reference_gated``: clamps and offset 1 when
    ``clamped``), cast to ``a``'s dtype (or written into ``out``);
    ``preact = z`` in ``a``'s dtype when ``save_preact``.
    """
    compute = torch.promote_types(a.dtype, torch.float32)
    # One addmm, as F.linear on the CPU: the fused path costs no more there than the unfused one.
    if bias is not None:
        z = torch.addmm(bias.to(compute), a.to(compute), b.to(compute))
    else:
        z = a.to(compute) @ b.to(compute)
    return reference_gated_epilogue(z, a.dtype, act=act, interleaved=interleaved, clamped=clamped,
                                    limit=limit, alpha=alpha, save_preact=save_preact, out=out)


def reference_gated_epilogue(
    z: torch.Tensor,
    dtype: torch.dtype,
    *,
    act: AnyActivation,
    interleaved: bool = False,
    clamped: bool = False,
    limit: float = 7.0,
    alpha: float = 1.0,
    save_preact: bool = False,
    out: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``reference_gemm_gated`` after the product ``z`` [M, 2F] (bias included): the gated
    epilogue in ``z``'s precision (at least float32), ``y`` and ``preact`` in ``dtype``."""
    z = z.to(torch.promote_types(z.dtype, torch.float32))
    z_a, z_b = (z[:, 0::2], z[:, 1::2]) if interleaved else z.chunk(2, dim=1)
    h = reference_gated(z_a, z_b, act, clamped, limit, alpha)
    y = as_dtype(h, dtype) if out is None else out.copy_(h)
    return y, as_dtype(z, dtype) if save_preact else None
