"""The weight gradient of gemm/grouped_scaled.py's quantized grouped GEMMs.

``grouped_gemm_scaled_wgrad``: ``dw[g] = dequant(a_g) @ dequant(b_g)^T`` with ``a`` [N, P] and
``b`` [K, P] the column-wise copies of dy and x in the padded grouped layout (quantization/formats.py):
group g's rows are positions ``128 * (offsets[g] // 128 + g)`` on, zeros past its end, so the
reduction over a group's rows needs no masks. Empty groups give zeros. Scales apply as in
gemm/dense_scaled.py; per-tensor scales are per group.

Tiling: a persistent grid of one program per SM walks the [BLOCK_N, BLOCK_K] tiles of every
``dw[g]``, a group's tiles consecutive, along K or N first (gemm/wgrad_walk.py), each reducing over
BLOCK_M-position slabs. Operands come through TMA descriptors when 16-byte aligned, else masked
pointer loads; nothing syncs.

On sm_90, BLOCK with TMA-ready operands runs the warp-specialized Gluon kernel of
hopper/blockwise_wgrad.py instead.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from fuseops.kernels._triton import INTERPRET, cdiv
from fuseops.kernels.dtypes import as_dtype
from fuseops.kernels.gemm.dense import tma_ok
from fuseops.kernels.gemm.dense_scaled import accumulate, dequantize_tile, load_raw, reference_operand
from fuseops.kernels.gemm.grouped import GemmConfig, persistent_programs
from fuseops.kernels.gemm.grouped_scaled import bytes_per_step
from fuseops.kernels.gemm.wgrad_walk import n_fastest, wgrad_tile
from fuseops.kernels.hopper.pipeline import dummy_or
from fuseops.kernels.launch import launch
from fuseops.kernels.quantization.formats import Scaling
from fuseops.kernels.quantization.grouped_layout import group_first_position, group_positions
from fuseops.kernels.quantization.operand import Operand


def _wgrad_configs() -> dict[tuple[Scaling, bool], GemmConfig]:
    """wgrad tiles by (format, accumulate into main_grad); block_m is the reduction slab over
    positions (it divides 128). GPU entries: the largest that compile for sm_90 without spills
    (cuobjdump), not yet timed (``python -m benchmarks.quantize --tune`` times candidates)."""
    if INTERPRET:
        # Blockwise runs two programs per "SM" here, so the CPU tests cover that grid too.
        small = {s: GemmConfig(128 if s == Scaling.BLOCK else 64, 64, 64, 1, 4, 1,
                               programs_per_sm=2 if s == Scaling.BLOCK else 1) for s in Scaling}
        return {(s, acc): cfg for s, cfg in small.items() for acc in (False, True)}
    return {
        (Scaling.TENSOR, False): GemmConfig(128, 128, 256, 1, 8, 3),
        (Scaling.TENSOR, True): GemmConfig(128, 128, 128, 1, 8, 4),
        (Scaling.BLOCK, False): GemmConfig(128, 128, 128, 1, 8, 4),
        (Scaling.BLOCK, True): GemmConfig(128, 128, 128, 1, 8, 4),
        (Scaling.MX, False): GemmConfig(64, 128, 128, 1, 8, 3),
        (Scaling.MX, True): GemmConfig(64, 128, 128, 1, 8, 3),
        (Scaling.NVFP4, False): GemmConfig(64, 128, 128, 1, 8, 3),
        (Scaling.NVFP4, True): GemmConfig(64, 128, 128, 1, 8, 3),
    }


def pick_wgrad_config(scaling: Scaling, accumulate: bool) -> GemmConfig:
    return _wgrad_configs()[scaling, accumulate]


@triton.jit
def grouped_gemm_scaled_wgrad_kernel(
    a, a_scale, a_outer, b, b_scale, b_outer, dw, offsets,
    G, N, K, PB, KS,
    stride_an, stride_bk, stride_asn, stride_bsk, stride_ao, stride_bo, stride_dwg, stride_dwn,
    SCALING: tl.constexpr, HAS_OUTER: tl.constexpr, ACCUMULATE: tl.constexpr, TMA: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, NUM_PROGRAMS: tl.constexpr,
    FLATTEN: tl.constexpr, WARP_SPECIALIZE: tl.constexpr, N_FASTEST: tl.constexpr,
):
    # Reduction over positions: BLOCK_M of them per step, BMB bytes (NVFP4 packs pairs).
    BMB: tl.constexpr = BLOCK_M // 2 if SCALING == 3 else BLOCK_M
    tiles_n, tiles_k = tl.cdiv(N, BLOCK_N), tl.cdiv(K, BLOCK_K)
    # Tiles of one group are consecutive, so a wave shares the group's slabs in L2.
    for tile in tl.range(tl.program_id(0), G * tiles_n * tiles_k, NUM_PROGRAMS, flatten=FLATTEN,
                         warp_specialize=WARP_SPECIALIZE):
        g, pid_n, pid_k = wgrad_tile(tile, tiles_n, tiles_k, N_FASTEST)
        size = (tl.load(offsets + g + 1) - tl.load(offsets + g)).to(tl.int32)
        # Steps of the padded layout, counted from group g's first position.
        step0 = (group_first_position(offsets, g) // BLOCK_M).to(tl.int32)
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        offs_k = pid_k * BLOCK_K + tl.arange(0, BLOCK_K)
        mask_n = offs_n < N
        mask_k = offs_k < K
        acc = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
        for r in range(tl.cdiv(size, BLOCK_M)):
            step = step0 + r
            if TMA:
                a_raw = a.load([pid_n * BLOCK_N, step * BMB])
                b_raw = b.load([pid_k * BLOCK_K, step * BMB])
            else:
                a_raw = load_raw(a, offs_n, mask_n, stride_an, step, PB, SCALING, BLOCK_M)
                b_raw = load_raw(b, offs_k, mask_k, stride_bk, step, PB, SCALING, BLOCK_M)
            a_tile = dequantize_tile(a_raw, a_scale, offs_n, mask_n, stride_asn, step, KS, SCALING,
                                     BLOCK_N, BLOCK_M)
            b_tile = dequantize_tile(b_raw, b_scale, offs_k, mask_k, stride_bsk, step, KS, SCALING,
                                     BLOCK_K, BLOCK_M)
            acc = accumulate(acc, a_tile, b_tile, a_scale, b_scale, offs_n, offs_k, mask_n, mask_k,
                             stride_asn, stride_bsk, step, SCALING, 1, 1)
        if HAS_OUTER:
            acc *= tl.load(a_outer + g * stride_ao) * tl.load(b_outer + g * stride_bo)
        dw_ptrs = dw + g.to(tl.int64) * stride_dwg + offs_n[:, None] * stride_dwn + offs_k[None, :]
        mask = mask_n[:, None] & mask_k[None, :]
        if ACCUMULATE:
            acc += tl.load(dw_ptrs, mask=mask, other=0.0)
        tl.store(dw_ptrs, acc.to(dw.dtype.element_ty), mask=mask)


def grouped_gemm_scaled_wgrad(
    a: Operand,
    b: Operand,
    offsets: torch.Tensor,
    *,
    scaling: Scaling,
    out_dtype: torch.dtype,
    main_grad: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """``dw[g] = dequant(a_g) @ dequant(b_g)^T`` over each group's rows (module docstring).

    Args:
        a: [N, P] operand (dy's column-wise copy, padded grouped layout), ``outer`` [G].
        b: [K, P] operand (x's column-wise copy, same layout), ``outer`` [G].
        offsets: int64 [G + 1] device tensor.
        out_dtype: dtype of dw. main_grad: float32 [G, N, K] to accumulate into (and
            return), or None. out: [G, N, K] to write into, or None.
    Returns:
        dw [G, N, K].
    """
    return launch_grouped_gemm_scaled_wgrad(a, b, offsets, scaling, out_dtype, main_grad, out,
                                            pick_wgrad_config(scaling, main_grad is not None))


def launch_grouped_gemm_scaled_wgrad(a: Operand, b: Operand, offsets: torch.Tensor, scaling: Scaling,
                                     out_dtype: torch.dtype, main_grad: torch.Tensor | None,
                                     out: torch.Tensor | None, cfg: GemmConfig,
                                     along_n: bool | None = None) -> torch.Tensor:
    """``grouped_gemm_scaled_wgrad`` with an explicit tile config (the benchmark's sweep) and,
    for tests, walk order (``along_n``; else wgrad_walk.n_fastest's)."""
    G, N, K = offsets.shape[0] - 1, a.data.shape[0], b.data.shape[0]
    if main_grad is not None:
        dw = main_grad
    else:
        dw = out if out is not None else torch.empty(G, N, K, dtype=out_dtype, device=a.data.device)
    if G == 0 or N == 0 or K == 0:
        return dw
    bm, bn, bk = cfg.block_m, cfg.block_n, cfg.block_k
    a_data = a.data if a.data.stride(1) == 1 else a.data.contiguous()
    b_data = b.data if b.data.stride(1) == 1 else b.data.contiguous()
    bmb = bytes_per_step(bm, scaling)
    tma = tma_ok(a_data, b_data)
    a_arg = TensorDescriptor.from_tensor(a_data, [bn, bmb]) if tma else a_data
    b_arg = TensorDescriptor.from_tensor(b_data, [bk, bmb]) if tma else b_data
    a_scale, b_scale = a.kernel_scale(), b.kernel_scale()
    programs = persistent_programs(a_data, G * cdiv(N, bn) * cdiv(K, bk), cfg.programs_per_sm)
    if along_n is None:
        along_n = n_fastest(N, K, bn, bk, programs)
    launch(grouped_gemm_scaled_wgrad_kernel, (programs,),
        a_arg, dummy_or(a_scale, dw), dummy_or(a.outer, dw), b_arg, dummy_or(b_scale, dw),
        dummy_or(b.outer, dw), dw, offsets,
        G, N, K, a_data.shape[1], a_scale.shape[1] if a_scale is not None else 0,
        a_data.stride(0), b_data.stride(0),
        a_scale.stride(0) if a_scale is not None else 0, b_scale.stride(0) if b_scale is not None else 0,
        a.outer_strides()[0], b.outer_strides()[0], dw.stride(0), dw.stride(1),
        SCALING=int(scaling), HAS_OUTER=a.outer is not None, ACCUMULATE=main_grad is not None,
        TMA=tma, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, NUM_PROGRAMS=programs, FLATTEN=cfg.flatten,
        WARP_SPECIALIZE=cfg.warp_specialize, N_FASTEST=along_n,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )
    return dw


def reference_grouped_gemm_scaled_wgrad(
    a: Operand,
    b: Operand,
    offsets: torch.Tensor,
    *,
    scaling: Scaling,
    out_dtype: torch.dtype,
    main_grad: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """In float32: ``dw[g] = A[:, p] @ B[:, p]^T * a.outer[g] * b.outer[g]`` over group g's
    positions p of the padded layout (zero for an empty group), A and B the elements x block
    scales; cast to ``out_dtype``, or added into ``main_grad`` and returned."""
    A = reference_operand(Operand(a.data, a.scale), scaling)
    B = reference_operand(Operand(b.data, b.scale), scaling)
    G = offsets.shape[0] - 1
    pos = group_positions(offsets, int(offsets[-1]))
    bounds = offsets.tolist()
    dw = torch.zeros(G, A.shape[0], B.shape[0], dtype=torch.float32, device=A.device)
    for g in range(G):
        p = pos[bounds[g]:bounds[g + 1]]
        dw[g] = A[:, p] @ B[:, p].T
        if a.outer is not None:
            dw[g] *= a.outer[g].float() * b.outer[g].float()
    if main_grad is not None:
        return main_grad.add_(dw)
    return out.copy_(dw) if out is not None else as_dtype(dw, out_dtype)
