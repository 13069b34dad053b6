"""Grouped GEMM for mixture-of-experts, forward and dgrad, over rows grouped by device offsets.

``y[rows of g] = epilogue(a[rows of g] @ b[g])`` with ``a`` [M, K], whose rows of group g are
``offsets[g]:offsets[g+1]`` (or, with ``a_rows``, ``a[a_rows[i]]`` for grouped row i, gathered
in the loads through pointers), ``b`` [G, K, N] a strided view (the forward passes
``weight.transpose(1, 2)`` of a [G, N, K] weight, dgrad the weight itself), ``y`` [M, N].
The epilogue adds ``bias[g]``, then multiplies by ``act'(act_grad_input)`` (dgrad through the
preceding activation) or applies ``act`` (optionally saving its input), then scales each
row by ``row_scale``.

Tiling: a persistent grid of one program per SM walks the [BLOCK_M, BLOCK_N] tiles of all
groups, counted in-kernel from the offsets; a group's M-tiles start at its first row, so its
last tile overhangs into the next group and is masked on store. Operands come through TMA
descriptors when strides allow (16-byte aligned), else through masked pointer loads.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools

import torch
import triton
import triton.language as tl
from triton._utils import validate_block_shape
from triton.tools.tensor_descriptor import TensorDescriptor

from fuseops.kernels import autodiff_state
from fuseops.kernels._triton import INTERPRET, cdiv, device_sms, dot, float32_dot_precision, next_power_of_2
from fuseops.kernels.dtypes import as_dtype
from fuseops.kernels.elementwise.activation_math import (
    Activation,
    AnyActivation,
    activation,
    chain_grad,
    kernel_act,
    reference_activation,
    reference_chain_grad,
)

# Re-exported: the grouped GEMM's callers build offsets through this module.
from fuseops.kernels.gemm.group_offsets import group_offsets, reference_group_offsets  # noqa: F401
from fuseops.kernels.launch import launch


@dataclasses.dataclass(frozen=True)
class GemmConfig:
    """One tile shape; for wgrad ``block_m`` tiles the reduction over rows."""

    block_m: int
    block_n: int
    block_k: int
    group_m: int
    num_warps: int
    num_stages: int
    flatten: bool = True
    split_epilogue: bool = False
    # Hopper: TMA loads in their own warps (needs flatten off).
    warp_specialize: bool = False
    # Programs of the persistent grid per SM. Above 1 only where the compiled kernel's registers
    # and shared memory let that many reside at once: then one program's work that does not
    # overlap its own MMAs (FP8 blockwise's per-step rescale) runs beside another's MMAs.
    programs_per_sm: int = 1


@functools.cache
def _configs() -> dict[str, GemmConfig]:
    """Tile shapes by shape class. 16-bit operands behind TMA: ``wide`` (N >= 512),
    ``narrow``, and ``fused`` when the epilogue reads or writes a second [M, N] tensor (the
    128x256 tile leaves it no registers or SMEM); ``pointer`` for unaligned 16-bit operands;
    ``fp32`` for float32 operands in either precision (IEEE on the FMA units, TF32 on the
    tensor cores under torch's TF32 setting).

    ``wide`` was chosen on an H100 by ``python -m benchmarks.grouped_gemm --tune`` (bf16, the
    four MoE shapes x uniform/skewed routing, forward and dgrad): geometric mean 1.11x / 1.18x
    torch._grouped_mm over 7 candidates. ``narrow`` is the sweep's best 128x128 tile (0.96x,
    on wide shapes; no MoE shape has N < 512). ``fused`` and ``pointer`` are the largest tiles
    that compile for sm_90 without spills or SMEM overflow (checked with ptxas, not timed).
    ``gathered`` (rows of ``a`` read through a row map; the expert layer's lean recompute of
    z) was chosen on an H200 (``python -m benchmarks.gathered_gemm``,
    benchmarks/results/gathered_gemm-h200-2026-11-29.json): 0.93-1.00x the permute copy plus
    the TMA GEMM over the five MoE shapes, uniform and skewed. ``fp32`` was timed on an H100
    (``python -m benchmarks.float32_precision``: E=64, M=32768, K=2048, N=1408, uniform; six
    tiles in each precision): 0.94 ms in TF32 (1.51x a per-expert torch.mm loop, 4.5x a 64x64
    tile), 9.0 ms in IEEE (0.53x the loop, 1.9x the 64x64 tile; 128x256 ran 8.2 ms but leaves
    a fused epilogue's second tile no registers).
    """
    if INTERPRET:
        small = GemmConfig(32, 32, 32, 2, 4, 1)
        return {"wide": small, "narrow": small, "fused": small, "pointer": small, "gathered": small, "fp32": small}
    return {
        "wide": GemmConfig(128, 256, 64, 8, 8, 4, split_epilogue=True),
        "narrow": GemmConfig(128, 128, 64, 8, 4, 4),
        "fused": GemmConfig(128, 128, 64, 8, 8, 4, split_epilogue=True),
        "pointer": GemmConfig(128, 128, 64, 8, 8, 3),
        "gathered": GemmConfig(128, 256, 64, 8, 8, 3, flatten=False),
        "fp32": GemmConfig(128, 128, 32, 8, 8, 3),
    }


def pick_config(n: int, dtype: torch.dtype, tma: bool, fused_io: bool, gathered: bool = False) -> GemmConfig:
    """The table entry for output width ``n``; ``fused_io``: the epilogue touches a second
    [M, N] tensor; ``gathered``: ``a``'s rows are read through a row map. One entry serves
    every M and K of the MoE shapes measured."""
    if dtype == torch.float32:
        return _configs()["fp32"]
    if gathered:
        return _configs()["gathered"]
    if not tma:
        return _configs()["pointer"]
    if fused_io:
        return _configs()["fused"]
    return _configs()["wide" if n >= 512 else "narrow"]


# Ragged TMA (after triton.tools.ragged_tma): two leading dims whose strides wrap around the
# 64-bit address space turn coordinates (_BIG, start + size, _BIG - size + row) into row
# ``start + row`` with the hardware bounds check ``row < size``: reads past a group's end give
# zeros, writes past it are dropped.
RAGGED_ROWS = 0x40000000
_BIG = tl.constexpr(RAGGED_ROWS)


def ragged_geometry(t: torch.Tensor) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The 4-D (shape, strides) of a ragged descriptor over the rows of a 2-D ``t``. Tuples, as
    ``TensorDescriptor.from_tensor``'s: the launcher keeps a descriptor's encoded map only for a
    hashable geometry (``launch_descriptors``; a list made every launch re-encode it)."""
    rows_stride = t.stride(0)
    return (0x7FFF0000, 0x7FFF0000, RAGGED_ROWS, t.shape[1]), (2**34 - rows_stride, rows_stride, rows_stride, 1)


@functools.cache
def checked_block(block: tuple[int, ...]) -> None:
    """Triton's block-shape check, once per block shape (the configs' few)."""
    validate_block_shape(list(block))


def descriptor_of(t: torch.Tensor, shape, strides, block: list[int]) -> TensorDescriptor:
    """``TensorDescriptor(t, shape, strides, block)`` without its per-call checks (~4 us each on
    the CPU, up to six a launch): for tensors ``tma_ok`` accepted, which is what those checks
    read of ``t`` (16-byte base and strides, last dim contiguous, no empty dim); the block is
    checked once per shape."""
    checked_block(tuple(block))
    desc = _new(TensorDescriptor)
    desc.base, desc.shape, desc.strides, desc.block_shape, desc.padding = t, shape, strides, block, "zero"
    return desc


def tensor_descriptor(t: torch.Tensor, block: list[int]) -> TensorDescriptor:
    """``TensorDescriptor.from_tensor(t, block)`` for a tensor ``tma_ok`` accepted (``descriptor_of``)."""
    return descriptor_of(t, t.shape, t.stride(), block)


def ragged_descriptor(t: torch.Tensor, block: list[int]) -> TensorDescriptor:
    """A descriptor over the rows of a 2-D ``t`` (one ``tma_ok`` accepted) for ``ragged_load`` /
    ``ragged_store``."""
    return descriptor_of(t, *ragged_geometry(t), [1, 1, *block])


_new = object.__new__


def tma_ok(*tensors: torch.Tensor | None) -> bool:
    """Whether every tensor can sit behind a TMA descriptor: 16-bit (float32 runs on the FMA
    units, where TMA's layouts cost more than they save), last dim contiguous, 16-B aligned."""
    # Called several times per launch: one stride() per tensor, and with 2-byte elements a
    # stride's 16 bytes are 8 elements (``s & 7``, also for negative strides).
    for t in tensors:
        if t is None:
            continue
        if t.element_size() != 2 or t.data_ptr() & 15 or not t.numel():
            return False
        *outer, last = t.stride()
        if last != 1:
            return False
        for s in outer:
            if s & 7:
                return False
    return True


def persistent_programs(t: torch.Tensor, max_tiles: int, per_sm: int = 1) -> int:
    """Programs of a persistent grid: ``per_sm`` per SM, fewer only when the shapes bound the tiles."""
    return max(1, min(per_sm * device_sms(t), max_tiles))


@triton.jit
def ragged_load(desc, start, size, row, col, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):
    """[BLOCK_R, BLOCK_C] tile at group-local ``row``, zeros past the group's ``size`` rows."""
    tile = desc.load([_BIG, (start + size).to(tl.int32), (row - size + _BIG).to(tl.int32), col])
    return tl.reshape(tile, [BLOCK_R, BLOCK_C])


@triton.jit
def ragged_store(desc, start, size, row, col, tile, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):
    """Store a tile at group-local ``row``; rows past the group's ``size`` are dropped."""
    tile = tl.reshape(tile, [1, 1, BLOCK_R, BLOCK_C])
    desc.store([_BIG, (start + size).to(tl.int32), (row - size + _BIG).to(tl.int32), col], tile)


@triton.jit
def gathered_rows(a_rows, row0, size, off_m, GATHER_A: tl.constexpr, BLOCK_M: tl.constexpr):
    """The tile's source rows of ``a`` (``a_rows[row0 + off_m:]``, int64) and the in-group mask;
    without GATHER_A the mask only (the rows are unread)."""
    offs_m = off_m + tl.arange(0, BLOCK_M)
    mask_m = offs_m < size
    if GATHER_A:
        src = tl.load(a_rows + row0 + offs_m, mask=mask_m, other=0).to(tl.int64)
    else:
        src = offs_m.to(tl.int64)
    return src, mask_m


@triton.jit
def load_gathered_a(a, src_rows, mask_m, k0, K, stride_am, BLOCK_K: tl.constexpr):
    """[BLOCK_M, BLOCK_K] of ``a``'s rows ``src_rows`` (zeros where ``mask_m`` is off)."""
    offs_k = k0 + tl.arange(0, BLOCK_K)
    ptrs = a + src_rows[:, None] * stride_am + offs_k[None, :]
    return tl.load(ptrs, mask=mask_m[:, None] & (offs_k < K)[None, :], other=0.0)


@triton.jit
def load_a(a, row0, size, off_m, k0, K, stride_am, TMA_LOAD: tl.constexpr,
           BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr):
    """[BLOCK_M, BLOCK_K] of ``a`` at group-local row ``off_m``; rows past the group read as
    zeros (pointers) or the next group's rows (TMA): their results are never stored."""
    if TMA_LOAD:
        tile = a.load([(row0 + off_m).to(tl.int32), k0])
    else:
        offs_m = off_m + tl.arange(0, BLOCK_M)
        offs_k = k0 + tl.arange(0, BLOCK_K)
        ptrs = a + (row0 + offs_m)[:, None] * stride_am + offs_k[None, :]
        tile = tl.load(ptrs, mask=(offs_m < size)[:, None] & (offs_k < K)[None, :], other=0.0)
    return tile


@triton.jit
def a_tile_of(a, src_rows, mask_m, row0, size, off_m, k0, K, stride_am, TMA_LOAD: tl.constexpr,
              GATHER_A: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr):
    """``load_a``, or with GATHER_A the rows ``src_rows`` (``gathered_rows``: loaded once a tile)."""
    if GATHER_A:
        tile = load_gathered_a(a, src_rows, mask_m, k0, K, stride_am, BLOCK_K)
    else:
        tile = load_a(a, row0, size, off_m, k0, K, stride_am, TMA_LOAD, BLOCK_M, BLOCK_K)
    return tile


@triton.jit
def load_b(b, g, k0, n0, K, N, stride_bg, stride_bk, stride_bn, TMA_LOAD: tl.constexpr,
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
def halves(acc, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """Left and right [BLOCK_M, BLOCK_N / 2] halves: half the epilogue's registers at once."""
    return tl.split(tl.permute(tl.reshape(acc, [BLOCK_M, 2, BLOCK_N // 2]), (0, 2, 1)))


@triton.jit
def _group_tiles(offsets, G, tiles_n, BLOCK_M: tl.constexpr, BLOCK_G: tl.constexpr):
    """Tiles of each group and the index of each group's first tile, as [BLOCK_G] vectors."""
    offs_g = tl.arange(0, BLOCK_G)
    mask_g = offs_g < G
    start = tl.load(offsets + offs_g, mask=mask_g, other=0)
    end = tl.load(offsets + offs_g + 1, mask=mask_g, other=0)
    tiles = tl.cdiv((end - start).to(tl.int32), BLOCK_M) * tiles_n
    return tiles, tl.cumsum(tiles, 0) - tiles


@triton.jit
def _locate(tile, tiles, first, BLOCK_G: tl.constexpr):
    """The group holding ``tile`` and the tile's index inside it (empty groups hold none)."""
    inside = (first <= tile) & (tile < first + tiles)
    g = tl.sum(tl.where(inside, tl.arange(0, BLOCK_G), 0))
    return g, tile - tl.sum(tl.where(inside, first, 0))


@triton.jit
def _swizzle(local, tiles_m, tiles_n, GROUP_M: tl.constexpr):
    """Bands of GROUP_M to 2 * GROUP_M - 1 M-tiles walked column by column, so a wave reuses
    A and B tiles from L2. Leftover M-tiles widen the bands rather than form a thin last
    band, which would stream all of B for a sliver of rows (measured: skewed routing at E=8).
    """
    bands = tl.maximum(tiles_m // GROUP_M, 1)
    height = tiles_m // bands
    # The first ``tiles_m % bands`` bands are one tile taller.
    tall_tiles = (tiles_m % bands) * (height + 1) * tiles_n
    tall = local < tall_tiles
    rel = tl.where(tall, local, local - tall_tiles)
    base = tl.where(tall, 0, (tiles_m % bands) * (height + 1))
    height = tl.where(tall, height + 1, height)
    in_band = rel % (height * tiles_n)
    pid_m = base + (rel // (height * tiles_n)) * height + in_band % height
    return pid_m, in_band // height


@triton.jit
def group_tile(tile, tiles, first, offsets, tiles_n, BLOCK_M: tl.constexpr, BLOCK_G: tl.constexpr,
               GROUP_M: tl.constexpr):
    """Where tile ``tile`` of the walk lies: its group g, the group's first row and row count,
    and the tile's (pid_m, pid_n) inside the group."""
    g, local = _locate(tile, tiles, first, BLOCK_G)
    row0 = tl.load(offsets + g)
    size = (tl.load(offsets + g + 1) - row0).to(tl.int32)
    pid_m, pid_n = _swizzle(local, tl.cdiv(size, BLOCK_M), tiles_n, GROUP_M)
    return g, row0, size, pid_m, pid_n


@triton.jit
def epilogue(acc, y, g, row0, size, off_m, off_n, N, stride_ym, bias, stride_bias_g, act_in,
             stride_act_m, row_scale, preact, stride_pm, alpha, ACT: tl.constexpr,
             ACT_GRAD: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_ROW_SCALE: tl.constexpr,
             SAVE_PREACT: tl.constexpr, TMA_STORE: tl.constexpr,
             BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """Finish the float32 tile ``acc`` = (a @ b[g])[off_m:, off_n:] of group g and store it.

    ``off_m`` is group-local (rows ``row0 + off_m`` on), ``size`` the group's rows; the stages
    run in the order of the module docstring.
    """
    offs_m = off_m + tl.arange(0, BLOCK_M)
    offs_n = off_n + tl.arange(0, BLOCK_N)
    rows = row0 + offs_m
    mask_m = offs_m < size
    mask_n = offs_n < N
    mask = mask_m[:, None] & mask_n[None, :]
    if HAS_BIAS:
        acc += tl.load(bias + g * stride_bias_g + offs_n, mask=mask_n, other=0.0).to(tl.float32)[None, :]
    if ACT_GRAD:
        z = tl.load(act_in + rows[:, None] * stride_act_m + offs_n[None, :], mask=mask, other=0.0)
        acc = chain_grad(acc, z.to(tl.float32), ACT, alpha)
    else:
        if SAVE_PREACT:
            p_ptrs = preact + rows[:, None] * stride_pm + offs_n[None, :]
            tl.store(p_ptrs, acc.to(preact.dtype.element_ty), mask=mask)
        acc = activation(acc, ACT, alpha)
    if HAS_ROW_SCALE:
        acc = acc * tl.load(row_scale + rows, mask=mask_m, other=0.0).to(tl.float32)[:, None]
    if TMA_STORE:
        ragged_store(y, row0, size, off_m, off_n, acc.to(y.dtype), BLOCK_M, BLOCK_N)
    else:
        tl.store(y + rows[:, None] * stride_ym + offs_n[None, :], acc.to(y.dtype.element_ty), mask=mask)


@triton.jit
def grouped_gemm_kernel(
    a, a_rows, b, y, offsets, bias, act_in, row_scale, preact,
    G, N, K,
    stride_am, stride_bg, stride_bk, stride_bn, stride_ym, stride_bias_g, stride_act_m, stride_pm,
    alpha,
    ACT: tl.constexpr, ACT_GRAD: tl.constexpr, HAS_BIAS: tl.constexpr,
    HAS_ROW_SCALE: tl.constexpr, SAVE_PREACT: tl.constexpr,
    TMA_LOAD: tl.constexpr, TMA_STORE: tl.constexpr, B_TRANS: tl.constexpr, GATHER_A: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    SPLIT_EPILOGUE: tl.constexpr, BLOCK_G: tl.constexpr, NUM_PROGRAMS: tl.constexpr,
    FLATTEN: tl.constexpr, WARP_SPECIALIZE: tl.constexpr, F32_DOT: tl.constexpr,
):
    # With TMA_LOAD, ``a`` is a descriptor over [M, K] and ``b`` one over the weight as it
    # lies in memory: [G, N, K] when B_TRANS (K contiguous), else [G, K, N].
    tiles_n = tl.cdiv(N, BLOCK_N)
    tiles, first = _group_tiles(offsets, G, tiles_n, BLOCK_M, BLOCK_G)
    k_tiles = tl.cdiv(K, BLOCK_K)
    for tile in tl.range(tl.program_id(0), tl.sum(tiles), NUM_PROGRAMS, flatten=FLATTEN,
                         warp_specialize=WARP_SPECIALIZE):
        g, row0, size, pid_m, pid_n = group_tile(tile, tiles, first, offsets, tiles_n, BLOCK_M, BLOCK_G,
                                                 GROUP_M)
        off_m = pid_m * BLOCK_M
        off_n = pid_n * BLOCK_N
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        src_rows, mask_m = gathered_rows(a_rows, row0, size, off_m, GATHER_A, BLOCK_M)
        for ki in range(k_tiles):
            a_tile = a_tile_of(a, src_rows, mask_m, row0, size, off_m, ki * BLOCK_K, K, stride_am, TMA_LOAD,
                               GATHER_A, BLOCK_M, BLOCK_K)
            b_tile = load_b(b, g, ki * BLOCK_K, off_n, K, N, stride_bg, stride_bk, stride_bn, TMA_LOAD, B_TRANS,
                            BLOCK_K, BLOCK_N)
            acc = dot(a_tile, b_tile, acc, F32_DOT)
        if SPLIT_EPILOGUE:
            # Two [BLOCK_M, BLOCK_N / 2] halves: half the registers and staging SMEM at once.
            acc_l, acc_r = halves(acc, BLOCK_M, BLOCK_N)
            epilogue(acc_l, y, g, row0, size, off_m, off_n, N, stride_ym, bias, stride_bias_g,
                     act_in, stride_act_m, row_scale, preact, stride_pm, alpha, ACT, ACT_GRAD,
                     HAS_BIAS, HAS_ROW_SCALE, SAVE_PREACT, TMA_STORE, BLOCK_M, BLOCK_N // 2)
            epilogue(acc_r, y, g, row0, size, off_m, off_n + BLOCK_N // 2, N, stride_ym, bias,
                     stride_bias_g, act_in, stride_act_m, row_scale, preact, stride_pm, alpha,
                     ACT, ACT_GRAD, HAS_BIAS, HAS_ROW_SCALE, SAVE_PREACT, TMA_STORE,
                     BLOCK_M, BLOCK_N // 2)
        else:
            epilogue(acc, y, g, row0, size, off_m, off_n, N, stride_ym, bias, stride_bias_g,
                     act_in, stride_act_m, row_scale, preact, stride_pm, alpha, ACT, ACT_GRAD,
                     HAS_BIAS, HAS_ROW_SCALE, SAVE_PREACT, TMA_STORE, BLOCK_M, BLOCK_N)


def grouped_gemm(
    a: torch.Tensor,
    b: torch.Tensor,
    offsets: torch.Tensor,
    *,
    bias: torch.Tensor | None = None,
    row_scale: torch.Tensor | None = None,
    act: AnyActivation = Activation.IDENTITY,
    alpha: float = 1.0,
    save_preact: bool = False,
    act_grad_input: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
    a_rows: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Rows of group g of ``a`` times ``b[g]``, with the fused epilogue (module docstring).

    Args:
        a: [M, K], rows grouped contiguously; M == offsets[G] (never checked: no sync). With
            ``a_rows``, any number of rows: the grouped rows are ``a[a_rows]``.
        b: [G, K, N], any strides (K- or N-contiguous views of a weight).
        offsets: int64 [G + 1] device tensor from ``group_offsets``.
        bias: [G, N] or None. row_scale: [M] or None (e.g. router probabilities).
        act, alpha: the activation applied to ``a @ b + bias`` (its derivative with
            ``act_grad_input`` [M, N], the saved input of the activation before this GEMM).
        save_preact: also return ``a @ b + bias`` before the activation.
        out: [M, N] output to write into, else allocated in ``a``'s dtype.
        a_rows: int64 [M] or None: grouped row i is ``a[a_rows[i]]``, read through pointers
            (indices in range: the MoE layer's row map, never checked here).
    Returns:
        ``(y, preact)``; ``preact`` is None unless ``save_preact``.
    """
    b_mem = b.transpose(1, 2) if b.stride(2) != 1 else b
    fused_io = act_grad_input is not None or save_preact
    cfg = pick_config(b.shape[2], a.dtype, a_rows is None and tma_ok(a, b_mem), fused_io, a_rows is not None)
    return launch_grouped_gemm(a, b, offsets, bias, row_scale, act, alpha, save_preact,
                               act_grad_input, out, cfg, a_rows)


def launch_grouped_gemm(a, b, offsets, bias, row_scale, act, alpha, save_preact, act_grad_input,
                        out, cfg: GemmConfig, a_rows: torch.Tensor | None = None):
    """``grouped_gemm`` with an explicit tile config (what the offline tuner calls)."""
    K = a.shape[1]
    M = a.shape[0] if a_rows is None else a_rows.shape[0]
    G, _, N = b.shape
    if a.stride(1) != 1:
        a = a.contiguous()
    if b.stride(1) != 1 and b.stride(2) != 1:
        b = b.contiguous()
    y = out if out is not None else torch.empty(M, N, dtype=a.dtype, device=a.device)
    preact = torch.empty(M, N, dtype=a.dtype, device=a.device) if save_preact else None
    # The weight as it lies in memory: [G, N, K] (K contiguous, the forward) or [G, K, N].
    b_trans = b.stride(2) != 1
    b_mem = b.transpose(1, 2) if b_trans else b
    split = cfg.split_epilogue
    bm, bn, bk = cfg.block_m, cfg.block_n, cfg.block_k
    # Gathered rows are loaded through pointers (TMA on sm_90 loads boxes, not rows).
    tma_load = a_rows is None and tma_ok(a, b_mem)
    tma_store = tma_ok(y)
    a_arg, b_arg, y_arg = a, b, y
    if tma_load:
        a_arg = tensor_descriptor(a, [bm, bk])
        b_arg = tensor_descriptor(b_mem, [1, bn, bk] if b_trans else [1, bk, bn])
    if tma_store:
        y_arg = ragged_descriptor(y, [bm, bn // 2 if split else bn])
    dummy = y
    max_tiles = (cdiv(M, bm) + G) * cdiv(N, bn)
    programs = persistent_programs(a, max_tiles, cfg.programs_per_sm)
    launch(grouped_gemm_kernel, (programs,),
        a_arg, a_rows if a_rows is not None else offsets, b_arg, y_arg, offsets,
        bias if bias is not None else dummy,
        act_grad_input if act_grad_input is not None else dummy,
        row_scale if row_scale is not None else dummy,
        preact if preact is not None else dummy,
        G, N, K,
        a.stride(0), b.stride(0), b.stride(1), b.stride(2), y.stride(0),
        bias.stride(0) if bias is not None else 0,
        act_grad_input.stride(0) if act_grad_input is not None else 0,
        preact.stride(0) if preact is not None else 0,
        float(alpha),
        ACT=kernel_act(act), ACT_GRAD=act_grad_input is not None, HAS_BIAS=bias is not None,
        HAS_ROW_SCALE=row_scale is not None, SAVE_PREACT=save_preact,
        TMA_LOAD=tma_load, TMA_STORE=tma_store, B_TRANS=b_trans, GATHER_A=a_rows is not None,
        BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=cfg.group_m, SPLIT_EPILOGUE=split,
        BLOCK_G=max(16, next_power_of_2(G)), NUM_PROGRAMS=programs, FLATTEN=cfg.flatten,
        WARP_SPECIALIZE=cfg.warp_specialize, F32_DOT=float32_dot_precision(a.dtype),
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )
    return y, preact


def per_group_matmul(a: torch.Tensor, b: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    """``a[rows of g] @ b[g]`` for every group, in float32 (float64 for float64 inputs); rows
    past the last group are zero."""
    return products_per_group(a, b, offsets)[0]


def products_per_group(a: torch.Tensor, b: torch.Tensor, offsets: torch.Tensor) -> tuple[torch.Tensor, int]:
    """``(per_group_matmul(a, b, offsets), offsets[-1])``, the end read once on the host."""
    compute = torch.promote_types(a.dtype, torch.float32)
    a, b = as_dtype(a, compute), as_dtype(b, compute)
    groups = offsets.shape[0] - 1
    if autograd_sees(a, b):
        # Torch differentiates these products itself (forward-mode or a second derivative:
        # ``ops/executor/plain_autograd.py``): no ``out=``, which autograd refuses.
        bounds = offsets.tolist()
        parts = [a[lo:hi] @ b[g] for g, (lo, hi) in enumerate(itertools.pairwise(bounds))]
        parts.append(a.new_zeros(a.shape[0] - bounds[-1], b.shape[2]))
        return torch.cat(parts), bounds[-1]
    if torch_grouped_mm_serves(a, b):
        # CPU tensors only: reading the end back is no device sync.
        y, end = torch._grouped_mm(a, b[:groups], offs=offsets[1:].to(torch.int32)), int(offsets[-1])
        if end < a.shape[0]:
            y[end:].zero_()
        return y, end
    y = torch.zeros(a.shape[0], b.shape[2], dtype=compute, device=a.device)
    bounds = offsets.tolist()
    # Written in place (mm's out= a contiguous row slice): no temporary, no index-put per group.
    for g, (lo, hi) in enumerate(itertools.pairwise(bounds)):
        torch.mm(a[lo:hi], b[g], out=y[lo:hi])
    return y, bounds[-1]


def autograd_sees(*operands: torch.Tensor) -> bool:
    """Whether autograd or vmap will see work on ``operands`` (and refuse ``out=``): under
    torch.func transforms (vmap too, which has no batching rule for ``mm.out``) or
    ``torch.autograd.forward_ad``, an operand batched by torch's older vmap (a batched
    cotangent), or grad mode on with one that needs a gradient (never inside the ops' own
    autograd Function outside those, whose bodies run without grad)."""
    return autodiff_state.differentiated_by_torch() or autodiff_state.batched_cotangents(*operands) or (
        torch.is_grad_enabled() and any(t.requires_grad for t in operands))


def torch_grouped_mm_serves(*operands: torch.Tensor) -> bool:
    """Whether ``torch._grouped_mm`` takes the references' per-group products of these float32
    CPU operands: the same float32 products, looped in C++ rather than Python. It wants, of
    each operand's last two dims, one of unit stride and the other's stride (and a batch
    stride) a multiple of 16 bytes; other layouts take the loop."""
    a = operands[0]
    return (a.device.type == "cpu" and a.dtype == torch.float32 and all(map(_grouped_mm_layout, operands))
            and _cpu_grouped_mm_works())


def _grouped_mm_layout(t: torch.Tensor) -> bool:
    *batch, rows_stride, cols_stride = t.stride()
    *_, m, n = t.shape
    # The other stride at least 1 too: an empty operand may carry a zero stride (a zero-row
    # gradient [0, 1] with strides (1, 0) is "contiguous"), which torch refuses ("Invalid
    # strides/sizes").
    fits = (cols_stride == 1 and rows_stride % 4 == 0 and rows_stride >= max(n, 1)) or (
        rows_stride == 1 and cols_stride % 4 == 0 and cols_stride >= max(m, 1))
    return fits and all(s % 4 == 0 for s in batch)


@functools.cache
def _cpu_grouped_mm_works() -> bool:
    # torch._grouped_mm is private and reached CPU float32 only in recent releases: tried once,
    # on first use, with an empty group and a transposed operand as the references pass them.
    if not hasattr(torch, "_grouped_mm"):
        return False
    try:
        a, b = torch.ones(3, 4), torch.ones(2, 4, 4)
        y = torch._grouped_mm(a, b, offs=torch.tensor([0, 3], dtype=torch.int32))
        dw = torch._grouped_mm(a.T, torch.ones(3, 4), offs=torch.tensor([1, 3], dtype=torch.int32))
    except (RuntimeError, NotImplementedError, TypeError):
        return False
    return bool((y == 4).all()) and bool((dw[0] == 1).all() and (dw[1] == 2).all())


def reference_grouped_gemm(
    a: torch.Tensor,
    b: torch.Tensor,
    offsets: torch.Tensor,
    *,
    bias: torch.Tensor | None = None,
    row_scale: torch.Tensor | None = None,
    act: AnyActivation = Activation.IDENTITY,
    alpha: float = 1.0,
    save_preact: bool = False,
    act_grad_input: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
    a_rows: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """For each group g and its rows r = offsets[g]:offsets[g+1], in float32, ``a`` standing
    for ``a[a_rows]`` where given:

    ``z = a[r] @ b[g] (+ bias[g])``;
    ``h = z * act'(act_grad_input[r])`` if ``act_grad_input`` is given, else ``h = act(z)``;
    ``y[r] = h * row_scale[r, None]`` (if given), cast to ``a``'s dtype; ``preact[r] = z``.
    """
    if a_rows is not None:
        a = a.index_select(0, a_rows)
    M, N = a.shape[0], b.shape[2]
    preact = torch.empty(M, N, dtype=a.dtype, device=a.device) if save_preact else None
    # The products per group, then the (row-wise) epilogue once over every grouped row: the
    # same arithmetic as group by group, a few torch calls instead of a few per group. Rows
    # past the last group are left as they were.
    z, end = products_per_group(a, b, offsets)
    rows = slice(0, end)
    z = z[rows]
    if bias is not None:
        z = z + torch.repeat_interleave(bias.to(z.dtype), offsets.diff(), dim=0, output_size=z.shape[0])
    if act_grad_input is not None:
        h = reference_chain_grad(z, act_grad_input[rows], act, alpha)
    else:
        h = reference_activation(z, act, alpha)
        if preact is not None:
            preact[rows] = z
    if row_scale is not None:
        h = h * row_scale[rows].to(z.dtype)[:, None]
    if out is None and end == M:
        # Every row is a group's: h (a fresh tensor, the products' own) is y, in a's dtype.
        return as_dtype(h, a.dtype), preact
    y = out if out is not None else torch.empty(M, N, dtype=a.dtype, device=a.device)
    y[rows] = h
    return y, preact
