"""Experiment (GPU only, not yet run): Linear + bias + GELU(tanh) in Gluon, ping-pong.

Why: issue 2's last row, GELU(tanh) 14336 -> 4096, sits at cuBLAS parity (0.98-1.06x over six
runs): our Triton kernel's main loop matches cuBLAS, but its epilogue (bias, GELU, store) does
not overlap the MMAs. Other tilings, stream-K, split-K and two programs per SM did not win
(.notes/gemm.md). Overlap needs the epilogue in other warps than the main loop.

This kernel: a TMA producer warp walks the program's tiles in order through one ring of
stages; two consumer warpgroups (Gluon ``warp_specialize`` partitions) take alternate tiles,
so one runs its main loop (async wgmma, one group in flight, stages released as they finish)
while the other applies bias and GELU and stores its previous tile through TMA. 128x128x64
tiles per consumer, 4 stages. Offline sm_90a compile: 168 registers at launch (setmaxnreg 232
/ 232 / 40), no spills, 197 KB shared memory.

    PYTHONPATH=. python3 benchmarks/gluon_linear_gelu.py

checks it against float64 (the first 1024 rows) and times it against the library's fused
Linear + GELU (``fuseops.Sequential(Linear, GELU)``) and ``F.gelu(F.linear(...))``, bf16.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
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
from benchmarks._timing import interleaved_medians
from fuseops import ops

SHAPES = [(16384, 14336, 4096), (16384, 4096, 14336)]


@gluon.jit
def _gelu_tanh(x):
    inner = 0.7978845608028654 * (x + 0.044715 * x * x * x)
    return 0.5 * x * (2.0 / (1.0 + gl.exp(-2.0 * inner)))


@gluon.jit
def _producer(a_desc, b_desc, a_bufs, b_bufs, ready, empty, M, N, K,
              NUM_PROGRAMS: gl.constexpr, STAGES: gl.constexpr, GROUP_M: gl.constexpr):
    """Operands of this program's tiles in order, through one ring: tile j's steps follow
    tile j - 1's, so the consumer of tile j starts as the other finishes tile j - 1."""
    BM: gl.constexpr = a_desc.block_type.shape[0]
    BK: gl.constexpr = a_desc.block_type.shape[1]
    BN: gl.constexpr = b_desc.block_type.shape[0]
    tiles_m = gl.cdiv(M, BM)
    tiles_n = gl.cdiv(N, BN)
    i = 0
    for tile in range(gl.program_id(0), tiles_m * tiles_n, NUM_PROGRAMS):
        pid_m, pid_n = tile_coords(tile, tiles_m, tiles_n, GROUP_M)
        for k in range(0, K, BK):
            s = i % STAGES
            mbarrier.wait(empty.index(s), ((i // STAGES) & 1) ^ 1)
            bar = ready.index(s)
            mbarrier.expect(bar, a_desc.block_type.nbytes + b_desc.block_type.nbytes)
            tma.async_copy_global_to_shared(a_desc, [pid_m * BM, k], bar, a_bufs.index(s))
            tma.async_copy_global_to_shared(b_desc, [pid_n * BN, k], bar, b_bufs.index(s))
            i += 1


@gluon.jit
def _consumer(a_desc, b_desc, y_desc, a_bufs, b_bufs, y_smem, ready, empty, turn, bias, M, N, K, parity,
              NUM_PROGRAMS: gl.constexpr, STAGES: gl.constexpr, GROUP_M: gl.constexpr):
    """One warpgroup: the program's tiles ``parity``, ``parity + 2``, ..., main loop then
    epilogue. The main loops take turns (``turn``): one consumer's runs only after the other's
    ended, so the ring is consumed in order (a parity wait may run at most one phase ahead) and
    each epilogue runs under the other consumer's main loop."""
    BM: gl.constexpr = a_desc.block_type.shape[0]
    BK: gl.constexpr = a_desc.block_type.shape[1]
    BN: gl.constexpr = b_desc.block_type.shape[0]
    acc_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                         instr_shape=[16, BN, 16])
    col_layout: gl.constexpr = gl.SliceLayout(0, acc_layout)
    tiles_m = gl.cdiv(M, BM)
    tiles_n = gl.cdiv(N, BN)
    k_tiles = gl.cdiv(K, BK)
    zero = gl.zeros([BM, BN], gl.float32, layout=acc_layout)
    t = parity
    for tile in range(gl.program_id(0) + parity * NUM_PROGRAMS, tiles_m * tiles_n, 2 * NUM_PROGRAMS):
        pid_m, pid_n = tile_coords(tile, tiles_m, tiles_n, GROUP_M)
        if t > 0:
            # Tile t - 1 (the other consumer's, its ((t - 1) // 2)-th) has left its main loop.
            mbarrier.wait(turn.index(1 - parity), ((t - 1) // 2) & 1)
        i = t * k_tiles
        acc = zero
        for ki in range(k_tiles):
            s = (i + ki) % STAGES
            mbarrier.wait(ready.index(s), ((i + ki) // STAGES) & 1)
            acc = warpgroup_mma(a_bufs.index(s), b_bufs.index(s).permute((1, 0)), acc, use_acc=ki > 0,
                                is_async=True)
            acc = warpgroup_mma_wait(1, deps=(acc,))
            # The step before is done: its stage goes back to the producer.
            if ki > 0:
                mbarrier.arrive(empty.index((i + ki - 1) % STAGES), count=1)
        acc = warpgroup_mma_wait(0, deps=(acc,))
        mbarrier.arrive(empty.index((i + k_tiles - 1) % STAGES), count=1)
        mbarrier.arrive(turn.index(parity), count=1)
        cols = pid_n * BN + gl.arange(0, BN, layout=col_layout)
        acc += gl.load(bias + cols, mask=cols < N, other=0.0).to(gl.float32)[None, :]
        out = _gelu_tanh(acc).to(y_desc.dtype)
        tma.store_wait(0)
        y_smem.store(out)
        fence_async_shared()
        tma.async_copy_shared_to_global(y_desc, [pid_m * BM, pid_n * BN], y_smem)
        t += 2
    tma.store_wait(0)


@gluon.jit
def linear_gelu_pingpong_kernel(a_desc, b_desc, y_desc, bias, M, N, K, NUM_PROGRAMS: gl.constexpr,
                                STAGES: gl.constexpr, GROUP_M: gl.constexpr, num_warps: gl.constexpr):
    BM: gl.constexpr = a_desc.block_type.shape[0]
    BK: gl.constexpr = a_desc.block_type.shape[1]
    BN: gl.constexpr = b_desc.block_type.shape[0]
    gl.static_assert(num_warps == 4, "the default partition is one consumer warpgroup")
    a_bufs = gl.allocate_shared_memory(a_desc.dtype, [STAGES, BM, BK], a_desc.layout)
    b_bufs = gl.allocate_shared_memory(b_desc.dtype, [STAGES, BN, BK], b_desc.layout)
    y_even = gl.allocate_shared_memory(y_desc.dtype, [BM, BN], y_desc.layout)
    y_odd = gl.allocate_shared_memory(y_desc.dtype, [BM, BN], y_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    turn = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(empty.index(i), count=1)
    for i in gl.static_range(2):
        mbarrier.init(turn.index(i), count=1)
    # Every argument tuple spelled out: a tuple built in steps turns constexprs into values.
    gl.warp_specialize([
        (_consumer, (a_desc, b_desc, y_desc, a_bufs, b_bufs, y_even, ready, empty, turn, bias, M, N, K,
                     gl.to_tensor(0), NUM_PROGRAMS, STAGES, GROUP_M)),
        (_consumer, (a_desc, b_desc, y_desc, a_bufs, b_bufs, y_odd, ready, empty, turn, bias, M, N, K,
                     gl.to_tensor(1), NUM_PROGRAMS, STAGES, GROUP_M)),
        (_producer, (a_desc, b_desc, a_bufs, b_bufs, ready, empty, M, N, K, NUM_PROGRAMS, STAGES, GROUP_M)),
    ], [4, 1], [232, 40])


def linear_gelu(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, stages: int = 4, group_m: int = 8) -> torch.Tensor:
    """``gelu_tanh(x @ w.T + b)``: x [M, K], w [N, K], b [N], bf16, contiguous."""
    (M, K), N = x.shape, w.shape[0]
    bm, bn, bk = 128, 128, 64
    operand = gl.NVMMASharedLayout.get_default_for([bm, bk], gl.bfloat16)
    out = gl.NVMMASharedLayout.get_default_for([bm, bn], gl.bfloat16)
    y = torch.empty(M, N, dtype=x.dtype, device=x.device)
    a_desc = TensorDescriptor.from_tensor(x, [bm, bk], operand)
    b_desc = TensorDescriptor.from_tensor(w, [bn, bk], operand)
    y_desc = TensorDescriptor.from_tensor(y, [bm, bn], out)
    tiles = triton.cdiv(M, bm) * triton.cdiv(N, bn)
    programs = min(torch.cuda.get_device_properties(x.device).multi_processor_count, tiles)
    linear_gelu_pingpong_kernel[(programs,)](a_desc, b_desc, y_desc, b, M, N, K, NUM_PROGRAMS=programs,
                                             STAGES=stages, GROUP_M=group_m, num_warps=4)
    return y


def main() -> None:
    print(f"{'T x in x out':<22}{'gluon':>8}{'fuseops':>9}{'torch':>8}  TFLOP/s; gluon/torch, fuseops/torch, rel err")
    for M, K, N in SHAPES:
        torch.manual_seed(0)
        model = fuseops.Sequential(ops.Linear(K, N, device="cuda", dtype=torch.bfloat16),
                                   ops.GELU(approximate="tanh"))
        w, b = model[0].weight.detach(), model[0].bias.detach()
        x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
        ref = F.gelu(F.linear(x[:1024].double(), w.double(), b.double()), approximate="tanh")
        err = ((linear_gelu(x, w, b)[:1024].double() - ref).norm() / ref.norm()).item()
        with torch.no_grad():
            ms = interleaved_medians({
                "gluon": lambda: linear_gelu(x, w, b),
                "fuseops": lambda: model(x),
                "torch": lambda: F.gelu(F.linear(x, w, b), approximate="tanh"),
            }, warmup=25, rep=100)
        tf = {name: 2 * M * K * N / t / 1e9 for name, t in ms.items()}
        print(f"{f'{M}x{K}x{N}':<22}{tf['gluon']:>8.0f}{tf['fuseops']:>9.0f}{tf['torch']:>8.0f}  "
              f"{ms['torch'] / ms['gluon']:.3f}, {ms['torch'] / ms['fuseops']:.3f}, {err:.1e}", flush=True)


if __name__ == "__main__":
    main()
