"""Experiment (GPU only, not yet run): FP8 blockwise GEMM in Gluon with warp specialization.

Why: our Triton blockwise kernels run at 0.4-0.6x their per-tensor FP8 speed (issue 5's
blockwise MoE target is 1.3x our bf16 layer; we are at 0.72-0.85x). Each 128-long K step's
product needs its own scales, so the loop is ``part = dot(a_k, b_k)``, wait, ``acc += part *
scales``: Triton 3.6 compiles it to 255 registers with a CTA-wide ``bar.sync`` every step, so
both warpgroups wait and rescale in lockstep while the tensor cores idle. Waiting with one
wgmma in flight instead (lagged promotion) makes ptxas serialize the wgmmas (C7514), so the
overlap has to come from two warpgroups that do not wait for each other
(.notes/quantize.md, session 6).

This kernel: a TMA producer warp fills a ring of stages (A as two 64-row halves, B
shared); two consumer warpgroups (Gluon ``warp_specialize`` partitions, each with its own
named barrier) take the two row halves of a 128x128 output tile, wait for their own product
(``wait_group 0``), release the stage on their own (the empty barrier counts two arrivals)
and rescale while the other's MMAs run. Offline sm_90a compile: 168 registers at launch
(setmaxnreg 232 / 232 / 40 per partition), no spills, no C7514, 164 KB shared memory.

    PYTHONPATH=. python3 benchmarks/gluon_blockwise.py

checks it and ``fuseops.kernels.gemm_scaled`` (the library's FP8 blockwise kernel) against
float64 on the same operands and prints TFLOP/s of both. Limits of the prototype: dense, bf16
output, N and K multiples of 128, 16-byte-aligned rows.
"""

from __future__ import annotations

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

import fuseops
from benchmarks._gluon import tile_coords
from fuseops.kernels.gemm_scaled import Operand, gemm_scaled
from fuseops.kernels.quant_formats import Scaling

SHAPES = [(16384, 4096, 14336), (16384, 14336, 4096), (8192, 2048, 1536)]
BLOCK = 128


@gluon.jit
def _producer(a_desc, b_desc, a_top, a_bottom, b_bufs, ready, empty, M, N, K,
              NUM_PROGRAMS: gl.constexpr, STAGES: gl.constexpr, GROUP_M: gl.constexpr):
    HALF: gl.constexpr = a_desc.block_type.shape[0]
    BK: gl.constexpr = a_desc.block_type.shape[1]
    BN: gl.constexpr = b_desc.block_type.shape[0]
    tiles_m = gl.cdiv(M, 2 * HALF)
    tiles_n = gl.cdiv(N, BN)
    i = 0
    for tile in range(gl.program_id(0), tiles_m * tiles_n, NUM_PROGRAMS):
        pid_m, pid_n = tile_coords(tile, tiles_m, tiles_n, GROUP_M)
        for k in range(0, K, BK):
            s = i % STAGES
            # A fresh barrier counts as completed phase 1: the first pass finds every stage free.
            mbarrier.wait(empty.index(s), ((i // STAGES) & 1) ^ 1)
            bar = ready.index(s)
            mbarrier.expect(bar, 2 * a_desc.block_type.nbytes + b_desc.block_type.nbytes)
            tma.async_copy_global_to_shared(a_desc, [pid_m * 2 * HALF, k], bar, a_top.index(s))
            tma.async_copy_global_to_shared(a_desc, [pid_m * 2 * HALF + HALF, k], bar, a_bottom.index(s))
            tma.async_copy_global_to_shared(b_desc, [pid_n * BN, k], bar, b_bufs.index(s))
            i += 1


@gluon.jit
def _consumer(a_desc, b_desc, y_desc, a_bufs, b_bufs, y_smem, ready, empty, a_scale, b_scale, M, N, K,
              stride_as, stride_bs, HALF_INDEX: gl.constexpr, NUM_PROGRAMS: gl.constexpr,
              STAGES: gl.constexpr, GROUP_M: gl.constexpr):
    """One warpgroup: rows HALF_INDEX * HALF.. of each 2 * HALF-row tile, all BN columns."""
    HALF: gl.constexpr = a_desc.block_type.shape[0]
    BK: gl.constexpr = a_desc.block_type.shape[1]
    BN: gl.constexpr = b_desc.block_type.shape[0]
    acc_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                         instr_shape=[16, BN, 32])
    row_layout: gl.constexpr = gl.SliceLayout(1, acc_layout)
    tiles_m = gl.cdiv(M, 2 * HALF)
    tiles_n = gl.cdiv(N, BN)
    k_tiles = gl.cdiv(K, BK)
    zero = gl.zeros([HALF, BN], gl.float32, layout=acc_layout)
    i = 0
    for tile in range(gl.program_id(0), tiles_m * tiles_n, NUM_PROGRAMS):
        pid_m, pid_n = tile_coords(tile, tiles_m, tiles_n, GROUP_M)
        row0 = pid_m * 2 * HALF + HALF_INDEX * HALF
        rows = row0 + gl.arange(0, HALF, layout=row_layout)
        mask_m = rows < M
        acc = zero
        for ki in range(k_tiles):
            # The scales first: their latency overlaps the wait for the operands.
            sa = gl.load(a_scale + rows * stride_as + ki, mask=mask_m, other=0.0)
            sb = gl.load(b_scale + pid_n * stride_bs + ki)
            s = i % STAGES
            mbarrier.wait(ready.index(s), (i // STAGES) & 1)
            part = warpgroup_mma(a_bufs.index(s), b_bufs.index(s).permute((1, 0)), zero, use_acc=False,
                                 is_async=True)
            part = warpgroup_mma_wait(0, deps=(part,))
            # Each warpgroup releases the stage on its own (the barrier counts both): neither
            # waits for the other, so one's rescale runs under the other's MMAs.
            mbarrier.arrive(empty.index(s), count=1)
            acc += part * (sa * sb)[:, None]
            i += 1
        tma.store_wait(0)
        y_smem.store(acc.to(y_desc.dtype))
        fence_async_shared()
        tma.async_copy_shared_to_global(y_desc, [row0, pid_n * BN], y_smem)
    tma.store_wait(0)


# One entry per partition: Gluon 3.6 takes no literal constexpr in a partition's arguments.
@gluon.jit
def _consumer_bottom(a_desc, b_desc, y_desc, a_bufs, b_bufs, y_smem, ready, empty, a_scale, b_scale, M, N, K,
                     stride_as, stride_bs, NUM_PROGRAMS: gl.constexpr, STAGES: gl.constexpr,
                     GROUP_M: gl.constexpr):
    _consumer(a_desc, b_desc, y_desc, a_bufs, b_bufs, y_smem, ready, empty, a_scale, b_scale, M, N, K,
              stride_as, stride_bs, 1, NUM_PROGRAMS, STAGES, GROUP_M)


@gluon.jit
def _consumer_top(a_desc, b_desc, y_desc, a_bufs, b_bufs, y_smem, ready, empty, a_scale, b_scale, M, N, K,
                  stride_as, stride_bs, NUM_PROGRAMS: gl.constexpr, STAGES: gl.constexpr,
                  GROUP_M: gl.constexpr):
    _consumer(a_desc, b_desc, y_desc, a_bufs, b_bufs, y_smem, ready, empty, a_scale, b_scale, M, N, K,
              stride_as, stride_bs, 0, NUM_PROGRAMS, STAGES, GROUP_M)


@gluon.jit
def blockwise_gemm_ws_kernel(a_desc, b_desc, y_desc, a_scale, b_scale, M, N, K, stride_as, stride_bs,
                             NUM_PROGRAMS: gl.constexpr, STAGES: gl.constexpr, GROUP_M: gl.constexpr,
                             num_warps: gl.constexpr):
    HALF: gl.constexpr = a_desc.block_type.shape[0]
    BK: gl.constexpr = a_desc.block_type.shape[1]
    BN: gl.constexpr = b_desc.block_type.shape[0]
    gl.static_assert(num_warps == 4, "the default partition is one consumer warpgroup")
    a_top = gl.allocate_shared_memory(a_desc.dtype, [STAGES, HALF, BK], a_desc.layout)
    a_bottom = gl.allocate_shared_memory(a_desc.dtype, [STAGES, HALF, BK], a_desc.layout)
    b_bufs = gl.allocate_shared_memory(b_desc.dtype, [STAGES, BN, BK], b_desc.layout)
    y_top = gl.allocate_shared_memory(y_desc.dtype, [HALF, BN], y_desc.layout)
    y_bottom = gl.allocate_shared_memory(y_desc.dtype, [HALF, BN], y_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(empty.index(i), count=2)
    common = (ready, empty, a_scale, b_scale, M, N, K, stride_as, stride_bs, NUM_PROGRAMS, STAGES, GROUP_M)
    gl.warp_specialize([
        (_consumer_top, (a_desc, b_desc, y_desc, a_top, b_bufs, y_top) + common),
        (_consumer_bottom, (a_desc, b_desc, y_desc, a_bottom, b_bufs, y_bottom) + common),
        (_producer, (a_desc, b_desc, a_top, a_bottom, b_bufs, ready, empty, M, N, K, NUM_PROGRAMS, STAGES, GROUP_M)),
    ], [4, 1], [232, 40])


def gluon_blockwise_gemm(a: Operand, b: Operand, stages: int = 4, group_m: int = 8) -> torch.Tensor:
    """``dequant(a) @ dequant(b)^T`` in bf16: a [M, K] with 1x128 scales, b [N, K] with 128x128."""
    (M, K), N = a.data.shape, b.data.shape[0]
    if K % BLOCK or N % BLOCK:
        raise ValueError(f"N and K: expected multiples of {BLOCK}, got N={N}, K={K}")
    half = BLOCK // 2
    fp8 = gl.NVMMASharedLayout.get_default_for([half, BLOCK], gl.float8e4nv)
    fp8_b = gl.NVMMASharedLayout.get_default_for([BLOCK, BLOCK], gl.float8e4nv)
    out = gl.NVMMASharedLayout.get_default_for([half, BLOCK], gl.bfloat16)
    y = torch.empty(M, N, dtype=torch.bfloat16, device=a.data.device)
    a_desc = TensorDescriptor.from_tensor(a.data, [half, BLOCK], fp8)
    b_desc = TensorDescriptor.from_tensor(b.data, [BLOCK, BLOCK], fp8_b)
    y_desc = TensorDescriptor.from_tensor(y, [half, BLOCK], out)
    tiles = triton.cdiv(M, BLOCK) * (N // BLOCK)
    programs = min(torch.cuda.get_device_properties(a.data.device).multi_processor_count, tiles)
    blockwise_gemm_ws_kernel[(programs,)](
        a_desc, b_desc, y_desc, a.scale, b.scale, M, N, K, a.scale.stride(0), b.scale.stride(0),
        NUM_PROGRAMS=programs, STAGES=stages, GROUP_M=group_m, num_warps=4,
    )
    return y


def main() -> None:
    recipe = fuseops.recipes.FP8Blockwise()
    print(f"{'M x K x N':<22}{'gluon TF/s':>11}{'triton TF/s':>12}{'ratio':>7}{'gluon err':>11}{'triton err':>11}")
    for M, K, N in SHAPES:
        torch.manual_seed(0)
        x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
        w = (torch.randn(N, K, device="cuda") * K**-0.5).to(torch.bfloat16)
        a = fuseops.quantize(x, recipe).rowwise_operand()
        b = fuseops.quantize(w, recipe, role="weight").rowwise_operand()
        runs = {
            "gluon": lambda: gluon_blockwise_gemm(a, b),
            "triton": lambda: gemm_scaled(a, b, scaling=Scaling.BLOCK, out_dtype=torch.bfloat16),
        }
        # float64 of the dequantized operands: what both kernels compute before rounding.
        deq_a = (a.data.double().view(M, K // BLOCK, BLOCK) * a.scale.double()[:, :, None]).view(M, K)
        b_scale = b.scale.double().repeat_interleave(BLOCK, 0).repeat_interleave(BLOCK, 1)
        ref = deq_a @ (b.data.double() * b_scale).T
        errs = {name: ((fn().double() - ref).norm() / ref.norm()).item() for name, fn in runs.items()}
        ms = {name: triton.testing.do_bench(fn, warmup=20, rep=100, return_mode="median") for name, fn in runs.items()}
        tf = {name: 2 * M * K * N / t / 1e9 for name, t in ms.items()}
        print(f"{f'{M}x{K}x{N}':<22}{tf['gluon']:>11.0f}{tf['triton']:>12.0f}{ms['triton'] / ms['gluon']:>7.2f}"
              f"{errs['gluon']:>11.1e}{errs['triton']:>11.1e}", flush=True)


if __name__ == "__main__":
    main()
