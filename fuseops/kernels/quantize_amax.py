"""Per-tensor scales on device: the first pass of the per-tensor formats (FP8 current scaling,
NVFP4's tensor scale), so that the cast kernel reads its scale without a host sync.

``amax``: ``x`` [B, R, C] holds B tensors, or with ``offsets`` [G + 1] one [M, C] tensor whose
row groups are the tensors; ``amax[t] = max |x of tensor t|`` (0 for an empty one).
``tensor_scales``: the encode and decode scales of quant_formats.py from the amaxes, in one
launch. Tiling: one amax program per [BLOCK_R, STEPS * BLOCK_C] strip (for grouped rows, per
strip of the padded layout, inside one group) folds its tiles elementwise and ends with one
float32 ``atomic_max``; ``tensor_scales`` is one program over all tensors.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from fuseops.kernels._triton import INTERPRET
from fuseops.kernels.quant_formats import FP32_MAX, load_tile, padded_rows, tile_rows

_FP32_MAX = tl.constexpr(FP32_MAX)


def _config() -> tuple[int, int, int]:
    """(BLOCK_R, BLOCK_C, num_warps); BLOCK_R divides 128 (the grouped layout's alignment).
    GPU: the cast kernel's TENSOR tile."""
    return (128, 128, 4) if INTERPRET else (64, 128, 4)


@triton.jit
def amax_kernel(x, offsets, amax, R, C, G, stride_xb, stride_xr,
                GROUPED: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr,
                BLOCK_G: tl.constexpr, STEPS: tl.constexpr):
    # STEPS column tiles per program: one atomic per STEPS tiles keeps them off the memory path.
    pid_b = tl.program_id(2)
    g, row0, rows = tile_rows(offsets, tl.program_id(0), pid_b, R, G, GROUPED, BLOCK_R, BLOCK_G)
    acc = tl.zeros((BLOCK_R, BLOCK_C), dtype=tl.float32)
    for step in range(STEPS):
        tile = load_tile(x, pid_b, row0, rows, tl.program_id(1) * STEPS + step, C, stride_xb,
                         stride_xr, BLOCK_R, BLOCK_C)
        acc = tl.maximum(acc, tl.abs(tile))
    # Non-negative float32 maxima are order-independent: the result is deterministic.
    tl.atomic_max(amax + g, tl.max(acc))


@triton.jit
def tensor_scales_kernel(amax, encode, decode, G, QMAX: tl.constexpr, BLOCK_G: tl.constexpr):
    offs = tl.arange(0, BLOCK_G)
    mask = offs < G
    a = tl.minimum(tl.load(amax + offs, mask=mask, other=0.0), _FP32_MAX)
    enc = tl.minimum(tl.math.div_rn(tl.zeros_like(a) + QMAX, tl.where(a > 0, a, 1.0)), _FP32_MAX)
    enc = tl.where(a > 0, enc, 1.0)
    tl.store(encode + offs, enc, mask=mask)
    tl.store(decode + offs, tl.math.div_rn(tl.zeros_like(enc) + 1.0, enc), mask=mask)


def amax(x: torch.Tensor, offsets: torch.Tensor | None, num_groups: int) -> torch.Tensor:
    """float32 [num_groups] ``max |x|`` of each tensor of ``x`` [B, R, C] (module docstring).

    Args:
        x: [B, R, C], last dim contiguous.
        offsets: int64 [G + 1] row offsets of a grouped ``x`` (B = 1), or None (G = B).
        num_groups: G.
    """
    B, R, C = x.shape
    out = torch.zeros(num_groups, dtype=torch.float32, device=x.device)
    if x.numel() == 0:
        return out
    x = x if x.stride(2) == 1 else x.contiguous()
    br, bc, warps = _config()
    rp = padded_rows(R, num_groups) if offsets is not None else R
    steps = min(8, triton.cdiv(C, bc))
    amax_kernel[(triton.cdiv(rp, br), triton.cdiv(C, bc * steps), B)](
        x, offsets if offsets is not None else out, out, R, C, num_groups, x.stride(0), x.stride(1),
        GROUPED=offsets is not None, BLOCK_R=br, BLOCK_C=bc,
        BLOCK_G=max(16, triton.next_power_of_2(num_groups)), STEPS=steps, num_warps=warps,
    )
    return out


def tensor_scales(amax: torch.Tensor, qmax: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(encode, decode) float32 [G] from ``amax`` [G]: ``encode = qmax / amax`` (1 where amax
    is 0, at most the float32 maximum), ``decode = 1 / encode`` (the stored tensor scale)."""
    encode, decode = torch.empty_like(amax), torch.empty_like(amax)
    G = amax.shape[0]
    if G:
        tensor_scales_kernel[(1,)](amax, encode, decode, G, QMAX=float(qmax),
                                   BLOCK_G=max(16, triton.next_power_of_2(G)))
    return encode, decode


def reference_amax(x: torch.Tensor, offsets: torch.Tensor | None, num_groups: int) -> torch.Tensor:
    """``amax[b] = max |x[b]|``, or ``amax[g] = max |x[0, offsets[g]:offsets[g+1]]|`` (0 if empty)."""
    a = x.float().abs()
    if offsets is None:
        return a.flatten(1).amax(1) if a.numel() else torch.zeros(num_groups, device=x.device)
    bounds = offsets.tolist()
    return torch.stack([a[0, bounds[g]:bounds[g + 1]].max() if bounds[g + 1] > bounds[g]
                        else a.new_zeros(()) for g in range(num_groups)])


def reference_tensor_scales(amax: torch.Tensor, qmax: float) -> tuple[torch.Tensor, torch.Tensor]:
    """``encode = min(qmax / min(amax, f32max), f32max)`` where amax > 0, else 1 (a true
    division); ``decode = 1 / encode``."""
    a = amax.float().clamp(max=FP32_MAX)
    encode = torch.where(a > 0, (torch.full_like(a, qmax) / a).clamp(max=FP32_MAX), torch.ones_like(a))
    return encode, encode.reciprocal()
