"""Per-tensor scales on device: the first pass of the per-tensor formats (FP8 current scaling,
NVFP4's tensor scale), so that the cast kernel reads its scale without a host sync.

``amax``: ``x`` [B, R, C] holds B tensors, or with ``offsets`` [G + 1] one [M, C] tensor whose
row groups are the tensors; ``amax[t] = max |x of tensor t|`` over its finite elements (0 for
an empty one, or one without a finite element): a NaN or inf never sets a tensor's scale.
With ``rows`` the tensor is ``x[0, rows]``, its rows read where they lie (``quantize.py``);
``row_amax``: each row's amax of [R, C] ``x``, one program per few rows (no atomics), from which
the group amaxes of rows picked from ``x`` are the picks' maxima.
``tensor_scales``: the encode and decode scales of quantization/formats.py from the amaxes, in one
launch. Tiling: one amax program per [BLOCK_R, STEPS * BLOCK_C] strip (for grouped rows, per
strip of the padded layout, inside one group) folds its tiles elementwise, STAGES - 1 tiles
ahead in flight (cp.async into shared memory), and ends with one float32 ``atomic_max``;
``tensor_scales`` is one program over all tensors.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from fuseops.kernels._triton import INTERPRET, cdiv, next_power_of_2
from fuseops.kernels.launch import launch
from fuseops.kernels.quantization.finite import finite_abs, reference_finite_abs
from fuseops.kernels.quantization.formats import FP32_MAX
from fuseops.kernels.quantization.grouped_layout import load_tile, padded_rows, tile_rows

_FP32_MAX = tl.constexpr(FP32_MAX)


@dataclass(frozen=True)
class AmaxConfig:
    """The amax kernel's tiling; BLOCK_R divides 128 (the grouped layout's alignment)."""

    block_r: int
    block_c: int
    steps: int
    stages: int
    num_warps: int


def _config() -> AmaxConfig:
    """GPU: tiles of 32x128 bf16 (8 KB), 16 per program, 3 of them in flight: 63 registers and
    24 KB of shared memory per program on sm_90 (ptxas), so 8 programs and 192 KB in flight per
    SM, where an unpipelined loop (64x128, 8 steps, 126 registers) keeps at most 4 tiles of
    16 KB. On the H100 both read at 0.76 of a device copy's rate (3 or 4 stages alike,
    ``benchmarks/quantize.py``'s amax pass): the pipelining does not move it."""
    return AmaxConfig(128, 128, 8, 1, 4) if INTERPRET else AmaxConfig(32, 128, 16, 4, 4)


@triton.jit
def amax_kernel(x, src_rows, offsets, amax, R, C, G, stride_xb, stride_xr,
                GROUPED: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr,
                BLOCK_G: tl.constexpr, STEPS: tl.constexpr, STAGES: tl.constexpr, GATHER: tl.constexpr):
    # STEPS column tiles per program: one atomic per STEPS tiles keeps them off the memory path.
    pid_b = tl.program_id(2)
    g, row0, rows = tile_rows(offsets, tl.program_id(0), pid_b, R, G, GROUPED, BLOCK_R, BLOCK_G)
    acc = tl.zeros((BLOCK_R, BLOCK_C), dtype=tl.float32)
    for step in tl.range(STEPS, num_stages=STAGES):
        tile = load_tile(x, src_rows, pid_b, row0, rows, tl.program_id(1) * STEPS + step, C, stride_xb,
                         stride_xr, BLOCK_R, BLOCK_C, GATHER)
        acc = tl.maximum(acc, finite_abs(tile))
    # Non-negative float32 maxima are order-independent: the result is deterministic.
    tl.atomic_max(amax + g, tl.max(acc))


@triton.jit
def row_amax_kernel(x, out, R, C, stride_xr, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):
    # One program per BLOCK_R rows, their columns BLOCK_C at a time; no atomics.
    offs_r = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    mask_r = offs_r < R
    acc = tl.zeros((BLOCK_R, BLOCK_C), dtype=tl.float32)
    for c0 in range(0, C, BLOCK_C):
        cols = c0 + tl.arange(0, BLOCK_C)
        ptrs = x + offs_r[:, None].to(tl.int64) * stride_xr + cols[None, :]
        tile = tl.load(ptrs, mask=mask_r[:, None] & (cols < C)[None, :], other=0.0).to(tl.float32)
        acc = tl.maximum(acc, finite_abs(tile))
    tl.store(out + offs_r, tl.max(acc, 1), mask=mask_r)


@triton.jit
def tensor_scales_kernel(amax, encode, decode, G, QMAX: tl.constexpr, BLOCK_G: tl.constexpr):
    offs = tl.arange(0, BLOCK_G)
    mask = offs < G
    a = tl.minimum(tl.load(amax + offs, mask=mask, other=0.0), _FP32_MAX)
    enc = tl.minimum(tl.math.div_rn(tl.zeros_like(a) + QMAX, tl.where(a > 0, a, 1.0)), _FP32_MAX)
    enc = tl.where(a > 0, enc, 1.0)
    tl.store(encode + offs, enc, mask=mask)
    tl.store(decode + offs, tl.math.div_rn(tl.zeros_like(enc) + 1.0, enc), mask=mask)


def amax(x: torch.Tensor, offsets: torch.Tensor | None, num_groups: int, *,
         rows: torch.Tensor | None = None) -> torch.Tensor:
    """float32 [num_groups] ``max |x|`` of each tensor of ``x`` [B, R, C] (module docstring).

    Args:
        x: [B, R, C], last dim contiguous.
        offsets: int64 [G + 1] row offsets of a grouped ``x`` (B = 1), or None (G = B).
        num_groups: G.
        rows: int64 [R'] indices into ``x``'s rows (B = 1): the amaxes of ``x[0, rows]``, read
            where its rows lie (``quantize.quantize``'s ``rows``).
    """
    return launch_amax(x, offsets, num_groups, _config(), rows=rows)


def launch_amax(x: torch.Tensor, offsets: torch.Tensor | None, num_groups: int, cfg: AmaxConfig, *,
                rows: torch.Tensor | None = None) -> torch.Tensor:
    """``amax`` with an explicit tiling (the benchmark's sweep)."""
    B, R, C = x.shape
    if rows is not None:
        R = rows.shape[0]
    out = torch.zeros(num_groups, dtype=torch.float32, device=x.device)
    if B * R * C == 0:
        return out
    x = x if x.stride(2) == 1 else x.contiguous()
    rp = padded_rows(R, num_groups) if offsets is not None else R
    steps = min(cfg.steps, cdiv(C, cfg.block_c))
    launch(amax_kernel, (cdiv(rp, cfg.block_r), cdiv(C, cfg.block_c * steps), B),
        x, rows if rows is not None else out, offsets if offsets is not None else out, out, R, C, num_groups,
        x.stride(0), x.stride(1), GROUPED=offsets is not None, BLOCK_R=cfg.block_r, BLOCK_C=cfg.block_c,
        BLOCK_G=max(16, next_power_of_2(num_groups)), STEPS=steps, STAGES=cfg.stages, GATHER=rows is not None,
        num_warps=cfg.num_warps,
    )
    return out


def row_amax(x: torch.Tensor) -> torch.Tensor:
    """float32 [R]: each row's ``max |x|`` over its finite elements (0 for a row without one) of
    ``x`` [R, C], last dim contiguous. The group amaxes of rows picked from ``x`` come from
    these (``fuseops.quant.quantize``'s ``rows``): one read of ``x``, where an amax over the
    picked rows reads each row as often as it is picked."""
    R, C = x.shape
    out = torch.empty(R, dtype=torch.float32, device=x.device)
    if R == 0:
        return out
    if C == 0:
        return out.zero_()
    x = x if x.stride(1) == 1 else x.contiguous()
    block_r, block_c = (16, 128) if INTERPRET else (8, 512)
    launch(row_amax_kernel, (cdiv(R, block_r),), x, out, R, C, x.stride(0), BLOCK_R=block_r, BLOCK_C=block_c,
           num_warps=4)
    return out


def tensor_scales(amax: torch.Tensor, qmax: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(encode, decode) float32 [G] from ``amax`` [G]: ``encode = qmax / amax`` (1 where amax
    is 0, at most the float32 maximum), ``decode = 1 / encode`` (the stored tensor scale)."""
    encode, decode = torch.empty_like(amax), torch.empty_like(amax)
    G = amax.shape[0]
    if G:
        launch(tensor_scales_kernel, (1,), amax, encode, decode, G, QMAX=float(qmax),
               BLOCK_G=max(16, next_power_of_2(G)))
    return encode, decode


def reference_amax(x: torch.Tensor, offsets: torch.Tensor | None, num_groups: int, *,
                   rows: torch.Tensor | None = None) -> torch.Tensor:
    """``amax[b] = max |x[b]|``, or ``amax[g] = max |x[0, offsets[g]:offsets[g+1]]|`` (0 if empty),
    over finite elements only; of ``x[:, rows]`` with ``rows``."""
    if rows is not None:
        x = x.index_select(1, rows)
    a = reference_finite_abs(x)
    if offsets is None:
        return a.flatten(1).amax(1) if a.numel() else torch.zeros(num_groups, device=x.device)
    bounds = offsets.tolist()
    return torch.stack([a[0, bounds[g]:bounds[g + 1]].max() if bounds[g + 1] > bounds[g]
                        else a.new_zeros(()) for g in range(num_groups)])


def reference_row_amax(x: torch.Tensor) -> torch.Tensor:
    """``max |x[r]|`` over each row's finite elements, 0 for a row without one (``row_amax``)."""
    a = reference_finite_abs(x)
    return a.amax(1) if a.shape[1] else a.new_zeros(a.shape[0])


def reference_tensor_scales(amax: torch.Tensor, qmax: float) -> tuple[torch.Tensor, torch.Tensor]:
    """``encode = min(qmax / min(amax, f32max), f32max)`` where amax > 0, else 1 (a true
    division); ``decode = 1 / encode``."""
    a = amax.float().clamp(max=FP32_MAX)
    encode = torch.where(a > 0, (torch.full_like(a, qmax) / a).clamp(max=FP32_MAX), torch.ones_like(a))
    return encode, encode.reciprocal()
