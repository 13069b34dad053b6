"""Dense GEMM with a fused epilogue: the Linear forward and its dgrad.

``y = epilogue(a @ b)`` with ``a`` [M, K] row-major and ``b`` [K, N] a strided view:
``weight.t()`` of an [N, K] weight in forward (K contiguous), the weight itself in dgrad
(N contiguous). The epilogue adds ``bias``, then multiplies by ``act'(act_grad_input)``
(dgrad through the preceding activation) or applies ``act`` (optionally saving its input),
then adds ``residual``. The gated twin (Linear + GLU) is in gemm/dense_gated.py.

Tiling: a persistent grid of one program per SM walks the [BLOCK_M, BLOCK_N] output tiles
in bands of GROUP_M M-tiles (so B tiles are reused from L2); operands come through TMA
descriptors when strides allow (16-byte aligned), else through masked pointer loads; the
epilogue runs on two [BLOCK_M, BLOCK_N / 2] halves to halve its registers and store buffer.
"""

from __future__ import annotations

import dataclasses
import functools

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from fuseops.kernels._triton import INTERPRET, cdiv, device_sms, dot, float32_dot_precision, float32_matmul_in_tf32
from fuseops.kernels.dtypes import as_dtype
from fuseops.kernels.elementwise.activation_math import (
    Activation,
    AnyActivation,
    activation,
    activation_code,
    chain_grad,
    kernel_act,
    reference_activation,
    reference_chain_grad,
)
from fuseops.kernels.launch import launch


@dataclasses.dataclass(frozen=True)
class GemmConfig:
    """One tile shape; ``split_epilogue`` runs the epilogue on two column halves;
    ``warp_specialize`` gives TMA loads their own warps (Hopper: without loop flattening)."""

    block_m: int
    block_n: int
    block_k: int
    group_m: int
    num_warps: int
    num_stages: int
    split_epilogue: bool = True
    warp_specialize: bool = False
    # Programs of the persistent grid per SM (grouped_gemm.GemmConfig says when above 1).
    programs_per_sm: int = 1


@functools.cache
def _configs() -> dict[str, GemmConfig]:
    """Tile shapes by operand class: ``tma`` for 16-bit operands and outputs that are all
    16-byte aligned, ``pointer`` when one is not, ``fp32`` for float32 operands (IEEE dot;
    TF32 under torch's TF32 setting on the same tiles, not tuned for it).

    ``tma`` was chosen on an H100 by ``python -m benchmarks.gemm --tune`` (bf16, every
    epilogue): 128x256x64, 8 warps, 3 stages, split epilogue
    gave 655-726 TFLOP/s at M, K, N = 16384, 4096, 14336 and 640-713 at 16384, 14336, 4096;
    4 stages does not fit beside an epilogue load, 128x128 tiles lost 10-20%, warp
    specialization 3-9%. It also won at 1024, 4096, 4096 (578-689 against at most 629 for
    128x128 and 64x256), so one entry serves small M too. ``pointer`` and ``fp32`` are the
    largest tiles that compile for sm_90 without register spills.
    """
    if INTERPRET:
        tiny = GemmConfig(32, 32, 32, 2, 4, 1)
        return {"tma": tiny, "pointer": tiny, "fp32": tiny}
    return {
        "tma": GemmConfig(128, 256, 64, 8, 8, 3),
        "pointer": GemmConfig(128, 128, 64, 8, 8, 3, split_epilogue=False),
        "fp32": GemmConfig(64, 64, 32, 8, 8, 3),
    }


def pick_config(table: dict[str, GemmConfig], dtype: torch.dtype, tma: bool) -> GemmConfig:
    if dtype == torch.float32:
        return table["fp32"]
    return table["tma" if tma else "pointer"]


def tma_ok(*tensors: torch.Tensor | None) -> bool:
    """Whether every tensor can sit behind a TMA descriptor (last dim contiguous, 16-B aligned)."""
    for t in tensors:
        if t is None:
            continue
        if t.numel() == 0 or t.stride(-1) != 1 or t.data_ptr() % 16:
            return False
        if any(s * t.element_size() % 16 for s in t.stride()[:-1]):
            return False
    return True


def fresh_tma_ok(shape: tuple[int, ...], dtype: torch.dtype) -> bool:
    """``tma_ok`` of a fresh contiguous tensor of ``shape`` and ``dtype``, decided without making
    one (the caching allocator's blocks are 512-byte aligned): what a launcher will allocate or
    copy into, asked at every call the dispatch table routes."""
    if not shape or not all(shape):
        return False
    stride = dtype.itemsize
    for n in reversed(shape[1:]):
        stride *= n
        if stride % 16:
            return False
    return True


@triton.jit
def swizzle(tile, tiles_m, tiles_n, GROUP_M: tl.constexpr):
    """Bands of GROUP_M M-tiles walked column by column, so B tiles are reused from L2."""
    per_band = GROUP_M * tiles_n
    first_m = (tile // per_band) * GROUP_M
    band_m = tl.minimum(tiles_m - first_m, GROUP_M)
    pid_m = first_m + (tile % per_band) % band_m
    pid_n = (tile % per_band) // band_m
    return pid_m, pid_n


@triton.jit
def load_a(a, m0, k0, M, K, stride_am, TMA: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr):
    """[BLOCK_M, BLOCK_K] tile of the row-major ``a`` at (m0, k0), zeros past its edges."""
    if TMA:
        tile = a.load([m0, k0])
    else:
        offs_m = m0 + tl.arange(0, BLOCK_M)
        offs_k = k0 + tl.arange(0, BLOCK_K)
        mask = (offs_m < M)[:, None] & (offs_k < K)[None, :]
        # [BLOCK_M, BLOCK_K]
        tile = tl.load(a + offs_m[:, None] * stride_am + offs_k[None, :], mask=mask, other=0.0)
    return tile


@triton.jit
def load_b(b, k0, n0, K, N, stride_bk, stride_bn, TMA: tl.constexpr, B_TRANS: tl.constexpr,
           BLOCK_K: tl.constexpr, BLOCK_N: tl.constexpr):
    """[BLOCK_K, BLOCK_N] tile of ``b`` [K, N] at (k0, n0), zeros past its edges; with TMA and
    B_TRANS, ``b`` is a descriptor over the K-contiguous [N, K] memory."""
    if TMA:
        if B_TRANS:
            tile = b.load([n0, k0]).T
        else:
            tile = b.load([k0, n0])
    else:
        offs_k = k0 + tl.arange(0, BLOCK_K)
        offs_n = n0 + tl.arange(0, BLOCK_N)
        mask = (offs_k < K)[:, None] & (offs_n < N)[None, :]
        # [BLOCK_K, BLOCK_N]
        tile = tl.load(b + offs_k[:, None] * stride_bk + offs_n[None, :] * stride_bn, mask=mask, other=0.0)
    return tile


@triton.jit
def load_mn(t, m0, n0, offs_m, offs_n, mask, stride_m, TMA: tl.constexpr):
    """Float32 tile of an [M, N] tensor (descriptor or row-major pointer), zeros outside."""
    if TMA:
        tile = t.load([m0, n0])
    else:
        tile = tl.load(t + offs_m[:, None] * stride_m + offs_n[None, :], mask=mask, other=0.0)
    return tile.to(tl.float32)


@triton.jit
def store_mn(t, tile, m0, n0, offs_m, offs_n, mask, stride_m, TMA: tl.constexpr):
    """Cast a float32 tile to ``t``'s dtype and store it; writes outside [M, N] are dropped."""
    if TMA:
        t.store([m0, n0], tile.to(t.dtype))
    else:
        tl.store(t + offs_m[:, None] * stride_m + offs_n[None, :], tile.to(t.dtype.element_ty), mask=mask)


@triton.jit
def _epilogue(acc, m0, n0, M, N, y, preact, bias, act_in, residual,
              stride_ym, stride_pm, stride_gm, stride_rm, alpha,
              ACT: tl.constexpr, ACT_GRAD: tl.constexpr, HAS_BIAS: tl.constexpr,
              HAS_RESIDUAL: tl.constexpr, SAVE_PREACT: tl.constexpr, TMA: tl.constexpr,
              BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """Bias, activation (or its derivative), residual and the stores of one output tile."""
    offs_m = m0 + tl.arange(0, BLOCK_M)
    offs_n = n0 + tl.arange(0, BLOCK_N)
    mask_n = offs_n < N
    mask = (offs_m < M)[:, None] & mask_n[None, :]
    if HAS_BIAS:
        acc += tl.load(bias + offs_n, mask=mask_n, other=0.0).to(tl.float32)[None, :]
    if SAVE_PREACT:
        store_mn(preact, acc, m0, n0, offs_m, offs_n, mask, stride_pm, TMA)
    if ACT_GRAD:
        z = load_mn(act_in, m0, n0, offs_m, offs_n, mask, stride_gm, TMA)
        acc = chain_grad(acc, z, ACT, alpha)
    else:
        acc = activation(acc, ACT, alpha)
    if HAS_RESIDUAL:
        acc += load_mn(residual, m0, n0, offs_m, offs_n, mask, stride_rm, TMA)
    store_mn(y, acc, m0, n0, offs_m, offs_n, mask, stride_ym, TMA)


@triton.jit
def gemm_kernel(
    a, b, y, preact, bias, act_in, residual,
    M, N, K, num_programs,
    stride_am, stride_bk, stride_bn, stride_ym, stride_pm, stride_gm, stride_rm,
    alpha,
    ACT: tl.constexpr, ACT_GRAD: tl.constexpr, HAS_BIAS: tl.constexpr,
    HAS_RESIDUAL: tl.constexpr, SAVE_PREACT: tl.constexpr,
    TMA_LOAD: tl.constexpr, TMA_EPI: tl.constexpr, B_TRANS: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    SPLIT_EPILOGUE: tl.constexpr, FLATTEN: tl.constexpr, WARP_SPECIALIZE: tl.constexpr, F32_DOT: tl.constexpr,
):
    # With TMA_EPI, y, preact, act_in and residual are descriptors of [BLOCK_M, BLOCK_N / 2]
    # blocks (SPLIT_EPILOGUE) or [BLOCK_M, BLOCK_N].
    tiles_m = tl.cdiv(M, BLOCK_M)
    tiles_n = tl.cdiv(N, BLOCK_N)
    k_tiles = tl.cdiv(K, BLOCK_K)
    for tile in tl.range(tl.program_id(0), tiles_m * tiles_n, num_programs, flatten=FLATTEN,
                         warp_specialize=WARP_SPECIALIZE):
        pid_m, pid_n = swizzle(tile, tiles_m, tiles_n, GROUP_M)
        m0 = pid_m * BLOCK_M
        n0 = pid_n * BLOCK_N
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for ki in range(k_tiles):
            a_tile = load_a(a, m0, ki * BLOCK_K, M, K, stride_am, TMA_LOAD, BLOCK_M, BLOCK_K)
            b_tile = load_b(b, ki * BLOCK_K, n0, K, N, stride_bk, stride_bn, TMA_LOAD, B_TRANS,
                            BLOCK_K, BLOCK_N)
            acc = dot(a_tile, b_tile, acc, F32_DOT)
        if SPLIT_EPILOGUE:
            halves = tl.permute(tl.reshape(acc, (BLOCK_M, 2, BLOCK_N // 2)), (0, 2, 1))
            acc_lo, acc_hi = tl.split(halves)
            _epilogue(acc_lo, m0, n0, M, N, y, preact, bias, act_in, residual, stride_ym,
                      stride_pm, stride_gm, stride_rm, alpha, ACT, ACT_GRAD, HAS_BIAS,
                      HAS_RESIDUAL, SAVE_PREACT, TMA_EPI, BLOCK_M, BLOCK_N // 2)
            _epilogue(acc_hi, m0, n0 + BLOCK_N // 2, M, N, y, preact, bias, act_in, residual,
                      stride_ym, stride_pm, stride_gm, stride_rm, alpha, ACT, ACT_GRAD,
                      HAS_BIAS, HAS_RESIDUAL, SAVE_PREACT, TMA_EPI, BLOCK_M, BLOCK_N // 2)
        else:
            _epilogue(acc, m0, n0, M, N, y, preact, bias, act_in, residual, stride_ym,
                      stride_pm, stride_gm, stride_rm, alpha, ACT, ACT_GRAD, HAS_BIAS,
                      HAS_RESIDUAL, SAVE_PREACT, TMA_EPI, BLOCK_M, BLOCK_N)


def gemm(
    a: torch.Tensor,
    b: torch.Tensor,
    *,
    bias: torch.Tensor | None = None,
    act: AnyActivation = Activation.IDENTITY,
    alpha: float = 1.0,
    save_preact: bool = False,
    act_grad_input: torch.Tensor | None = None,
    residual: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``a @ b`` with the fused epilogue of the module docstring.

    Args:
        a: [M, K], row-major.
        b: [K, N], any strides (``weight.t()`` in forward, ``weight`` in dgrad).
        bias: [N] or None.
        act, alpha: the activation applied to ``a @ b + bias``; with ``act_grad_input``
            [M, N] (the saved input of the activation before this GEMM) its derivative
            at ``act_grad_input`` multiplies instead.
        save_preact: also return ``a @ b + bias`` (in ``a``'s dtype).
        residual: [M, N] added last, or None.
        out: [M, N] output to write into, else allocated in ``a``'s dtype.
    Returns:
        ``(y, preact)``; ``preact`` is None unless ``save_preact``.
    """
    return launch_gemm(a, b, bias, act, alpha, save_preact, act_grad_input, residual, out, None)


def launch_gemm(a, b, bias, act, alpha, save_preact, act_grad_input, residual, out,
                cfg: GemmConfig | None):
    """``gemm`` with an explicit tile config (what the offline tuner passes), else the table's."""
    M = a.shape[0]
    N = b.shape[1]
    y = out if out is not None else torch.empty(M, N, dtype=a.dtype, device=a.device)
    preact = torch.empty(M, N, dtype=a.dtype, device=a.device) if save_preact else None
    if M == 0 or N == 0:
        return y, preact
    a = a if a.stride(1) == 1 else a.contiguous()
    b = b if 1 in b.stride() else b.contiguous()
    act_grad_input = None if act_grad_input is None else act_grad_input.contiguous()
    residual = None if residual is None else residual.contiguous()
    plan = _plan(a, b, y, preact, bias, act, act_grad_input, residual, cfg)
    y_arg = y
    preact_arg = y if preact is None else preact
    agi_arg = y if act_grad_input is None else act_grad_input
    residual_arg = y if residual is None else residual
    if plan.tma_load:
        # b's descriptor covers b.t() when K is contiguous: the same memory, with the
        # plan's shape and strides (no view made).
        a_arg, b_arg = plan.a_desc.over(a), plan.b_desc.over(b)
    else:
        a_arg, b_arg = a, b
    if plan.tma_epi:
        epi = plan.epi_desc
        y_arg = epi.over(y)
        if preact is not None:
            preact_arg = plan.preact_desc.over(preact)
        if act_grad_input is not None:
            agi_arg = plan.agi_desc.over(act_grad_input)
        if residual is not None:
            residual_arg = plan.residual_desc.over(residual)
    launch(gemm_kernel, plan.grid,
        a_arg, b_arg, y_arg, preact_arg, y if bias is None else bias, agi_arg, residual_arg,
        *plan.ints, float(alpha), **plan.constexprs,
    )
    return y, preact


class PlannedDescriptor:
    """A TensorDescriptor's shape, strides and block, fixed by a plan: ``over(t)`` makes the
    descriptor with base ``t`` (``TensorDescriptor.from_tensor`` without its checks, which
    the plan's ``tma_ok`` did, and without reading ``t``'s shape and strides, which the
    plan's key holds)."""

    __slots__ = ("shape", "strides", "block")

    def __init__(self, shape: tuple[int, ...], strides: tuple[int, ...], block: tuple[int, ...]):
        self.shape, self.strides, self.block = shape, strides, block

    def over(self, t: torch.Tensor) -> TensorDescriptor:
        desc = _new(TensorDescriptor)
        desc.base = t
        desc.shape = self.shape
        desc.strides = self.strides
        desc.block_shape = self.block
        desc.padding = "zero"
        return desc


_new = object.__new__


@dataclasses.dataclass(frozen=True)
class _GemmPlan:
    """What ``launch_gemm`` decides from shapes, strides, dtypes and 16-byte alignment: the
    grid, the int arguments (sizes, program count, strides), the constexprs and, on the TMA
    paths, the descriptors' shapes, strides and blocks."""

    tma_load: bool
    tma_epi: bool
    grid: tuple[int]
    ints: tuple[int, ...]
    constexprs: dict
    a_desc: PlannedDescriptor | None
    b_desc: PlannedDescriptor | None
    epi_desc: PlannedDescriptor | None
    preact_desc: PlannedDescriptor | None
    agi_desc: PlannedDescriptor | None
    residual_desc: PlannedDescriptor | None


# Plans by call class; a new shape adds one (bounded: cleared when it grows past the limit).
_plans: dict[tuple, _GemmPlan] = {}
_MAX_PLANS = 4096


def _plan(a, b, y, preact, bias, act, act_grad_input, residual, cfg) -> _GemmPlan:
    """The plan of one call, from the cache when its class was seen before. The class holds
    everything ``tma_ok``, the config table, the grid and the descriptors read besides data
    pointers (shapes and strides of every operand), and whether those pointers are 16-byte
    aligned (two bits: the operands, the epilogue's), and for float32 operands the matmul
    precision torch asks for now (``float32_dot_precision``). ``act`` is keyed as an int (an
    IntEnum member hashes through Python code)."""
    load_aligned = not (a.data_ptr() | b.data_ptr()) & 15
    epi_ptrs = y.data_ptr()
    for t in (preact, act_grad_input, residual):
        if t is not None:
            epi_ptrs |= t.data_ptr()
    key = (a.shape, a.stride(0), a.dtype, b.shape, b.stride(), b.dtype, y.shape, y.stride(), y.dtype,
           a.get_device(), bias is not None, activation_code(act), preact is not None,
           None if act_grad_input is None else (act_grad_input.dtype, act_grad_input.shape, act_grad_input.stride()),
           None if residual is None else (residual.dtype, residual.shape, residual.stride()),
           cfg, load_aligned, not epi_ptrs & 15, a.dtype is torch.float32 and float32_matmul_in_tf32())
    plan = _plans.get(key)
    if plan is None:
        if len(_plans) >= _MAX_PLANS:
            _plans.clear()
        plan = _plans[key] = _new_plan(a, b, y, preact, bias, act, act_grad_input, residual, cfg)
    return plan


def _new_plan(a, b, y, preact, bias, act, act_grad_input, residual, cfg) -> _GemmPlan:
    M, K = a.shape
    N = b.shape[1]
    b_trans = b.stride(1) != 1
    tma_load = tma_ok(a, b.t() if b_trans else b)
    tma_epi = tma_ok(y, preact, act_grad_input, residual)
    cfg = cfg or pick_config(_configs(), a.dtype, tma_load and tma_epi)
    bm, bn, bk = cfg.block_m, cfg.block_n, cfg.block_k
    tiles = cdiv(M, bm) * cdiv(N, bn)
    programs = max(1, min(cfg.programs_per_sm * device_sms(a), tiles))
    constexprs = dict(
        ACT=kernel_act(act), ACT_GRAD=act_grad_input is not None, HAS_BIAS=bias is not None,
        HAS_RESIDUAL=residual is not None, SAVE_PREACT=preact is not None,
        TMA_LOAD=tma_load, TMA_EPI=tma_epi, B_TRANS=b_trans,
        BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=cfg.group_m,
        SPLIT_EPILOGUE=cfg.split_epilogue, FLATTEN=not cfg.warp_specialize,
        WARP_SPECIALIZE=cfg.warp_specialize, F32_DOT=float32_dot_precision(a.dtype),
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )
    ints = (M, N, K, programs, a.stride(0), b.stride(0), b.stride(1), y.stride(0),
            0 if preact is None else preact.stride(0),
            0 if act_grad_input is None else act_grad_input.stride(0),
            0 if residual is None else residual.stride(0))
    a_desc = b_desc = None
    if tma_load:
        a_desc = planned_descriptor(a, (bm, bk))
        b_desc = planned_descriptor(b.t(), (bn, bk)) if b_trans else planned_descriptor(b, (bk, bn))
    epi = (None,) * 4
    if tma_epi:
        block = (bm, bn // 2 if cfg.split_epilogue else bn)
        epi = tuple(None if t is None else planned_descriptor(t, block) for t in (y, preact, act_grad_input, residual))
    return _GemmPlan(tma_load, tma_epi, (programs,), ints, constexprs, a_desc, b_desc, *epi)


def planned_descriptor(t: torch.Tensor, block: tuple[int, int]) -> PlannedDescriptor:
    return PlannedDescriptor(tuple(t.shape), t.stride(), block)


def reference_gemm(
    a: torch.Tensor,
    b: torch.Tensor,
    *,
    bias: torch.Tensor | None = None,
    act: AnyActivation = Activation.IDENTITY,
    alpha: float = 1.0,
    save_preact: bool = False,
    act_grad_input: torch.Tensor | None = None,
    residual: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """In float32 (float64 for float64 inputs):

    ``z = a @ b (+ bias[None, :])``;
    ``h = z * act'(act_grad_input)`` if ``act_grad_input`` is given, else ``h = act(z)``;
    ``y = h (+ residual)``, cast to ``a``'s dtype (or written into ``out``);
    ``preact = z`` in ``a``'s dtype when ``save_preact``.
    """
    compute = torch.promote_types(a.dtype, torch.float32)
    # One addmm, as F.linear on the CPU: the fused path costs no more there than the unfused one.
    if bias is not None:
        z = torch.addmm(bias.to(compute), a.to(compute), b.to(compute))
    else:
        z = a.to(compute) @ b.to(compute)
    return reference_gemm_epilogue(z, a.dtype, act=act, alpha=alpha, save_preact=save_preact,
                                   act_grad_input=act_grad_input, residual=residual, out=out)


def reference_gemm_epilogue(
    z: torch.Tensor,
    dtype: torch.dtype,
    *,
    act: AnyActivation = Activation.IDENTITY,
    alpha: float = 1.0,
    save_preact: bool = False,
    act_grad_input: torch.Tensor | None = None,
    residual: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``reference_gemm`` after the product ``z`` (bias included): the epilogue in
    ``z``'s precision (at least float32), ``y`` and ``preact`` in ``dtype``."""
    compute = torch.promote_types(z.dtype, torch.float32)
    z = z.to(compute)
    if act_grad_input is not None:
        h = reference_chain_grad(z, act_grad_input.to(compute), act, alpha)
    else:
        h = reference_activation(z, act, alpha)
    if residual is not None:
        h = h + residual.to(compute)
    y = as_dtype(h, dtype) if out is None else out.copy_(h)
    return y, as_dtype(z, dtype) if save_preact else None
