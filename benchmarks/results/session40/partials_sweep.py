"""Session 40 probe (issue 20): the second stage of every deterministic row reduction (``bias_grad.sum_partials``:
float32 partials [P, N] summed over P) and what it costs the norm backward.

Call 1's LayerNorm sweep left the library ~10 us behind its own tile at every shape: the difference is dbias's
second ``sum_partials`` (the sweep summed dweight's only). ``sum_partials`` launches cdiv(N, 128) programs, each
walking all P rows 32 at a time: 8 programs for N=1024, P=264 (the norm's two programs a multiprocessor), nine
dependent loads each. This times it under other tiles (GPU time only: CUDA graphs of 10+ replays,
``do_bench_cudagraph``), then the norm backward with the best of them, against the library.

    python benchmarks/results/session40/partials_sweep.py [--smoke]
"""
import itertools
import sys
from unittest import mock

import torch
import triton.testing

from fuseops.kernels._triton import cdiv, next_power_of_2
from fuseops.kernels.elementwise import bias_grad, norm
from fuseops.kernels.launch import launch

SMOKE = "--smoke" in sys.argv
DEVICE = "cpu" if SMOKE else "cuda"
PARTIALS = [(4, 64)] if SMOKE else [(p, n) for p in (17, 66, 264, 528) for n in (1024, 2048, 4096, 8192, 16384)]
NORMS = [(16, 64)] if SMOKE else [(16384, 1024), (4096, 4096), (1024, 2048), (1024, 1024), (4096, 1024), (16384, 2048)]


def bench(fn) -> float:
    """Microseconds of GPU time a call."""
    if SMOKE:
        fn()
        return 1.0
    return triton.testing.do_bench_cudagraph(fn, rep=10) * 1e3


def candidates(P: int):
    out = []
    for bm, bn, warps in itertools.product((8, 16, 32, 64, 128, 256, 512), (8, 16, 32, 64, 128, 256), (1, 2, 4, 8)):
        values = bm * bn // (32 * warps)
        if SMOKE:
            return [(8, 16, 1)]
        if 4 <= values <= 64 and bm <= 2 * next_power_of_2(P):
            out.append((bm, bn, warps))
    return out


def summed(partials, dtype, bm, bn, warps):
    P, N = partials.shape
    out = torch.empty(N, dtype=dtype, device=partials.device)
    launch(bias_grad.column_sum_kernel, (1, cdiv(N, bn)), partials, out, P, N, partials.stride(0), 0, P,
           BLOCK_M=bm, BLOCK_N=bn, num_warps=warps)
    return out


_SWEPT = {}


def sweep(P, N, top=5, quiet=False):
    """``[(us, (bm, bn, warps)), ...]`` best first; prints the library's time and the top ones."""
    if (P, N) in _SWEPT:
        return _SWEPT[P, N]
    partials = torch.randn(P, N, device=DEVICE, dtype=torch.float32)
    lib_out = bias_grad.sum_partials(partials, torch.bfloat16)
    lib = bench(lambda: bias_grad.sum_partials(partials, torch.bfloat16))
    rows = []
    for cfg in candidates(P):
        same = torch.equal(summed(partials, torch.bfloat16, *cfg).float(), lib_out.float())
        close = torch.allclose(summed(partials, torch.float32, *cfg), partials.sum(0), rtol=1e-5, atol=1e-4)
        rows.append((bench(lambda cfg=cfg: summed(partials, torch.bfloat16, *cfg)), cfg, same, close))
    rows.sort(key=lambda r: r[0])
    _SWEPT[P, N] = lib, rows
    if not quiet:
        print(f"\npartials [{P}, {N}]: library {lib:6.2f} us", flush=True)
        for us, cfg, same, close in rows[:top]:
            print(f"  {us:6.2f} us {lib / us:5.2f}x  block_m={cfg[0]:3d} block_n={cfg[1]:3d} warps={cfg[2]} "
                  f"bf16 same bits {same} fp32 close {close}", flush=True)
    return lib, rows


def norms():
    for (M, N), layer in itertools.product(NORMS, (False, True)):
        torch.manual_seed(0)
        x = torch.randn(M, N, device=DEVICE, dtype=torch.bfloat16)
        dy = torch.randn_like(x)
        w = torch.randn(N, device=DEVICE, dtype=torch.bfloat16)
        b = torch.randn_like(w) if layer else None
        _, mean, rstd = norm._norm_fwd(x, w, b, 1e-6, False, None, not layer)
        mean = mean if layer else None

        def library():
            return norm._norm_bwd(dy, x, w, mean, rstd, False, layer, not layer)
        _, programs = norm._launch_shape(M, N, x.get_device(), backward=True)
        _, rows = sweep(programs, N, quiet=True)
        best = rows[0][1]
        lib = bench(library)
        lib_host = triton.testing.do_bench(library, rep=50) * 1e3 if not SMOKE else 1.0
        ref = library()
        with mock.patch.object(norm, "sum_partials", lambda p, dtype: summed(p, dtype, *best)):
            got = library()
            new = bench(library)
        # dx bit for bit; the parameter gradients summed in another order, to a bf16 ulp
        ok = torch.equal(got[0], ref[0]) and all(
            a is None or torch.allclose(a.float(), b_.float(), rtol=1e-2, atol=1e-2) for a, b_ in zip(got[1:], ref[1:]))
        print(f"{'LayerNorm' if layer else 'RMSNorm':9s} bwd [{M:5d}, {N:5d}] P={programs}: library {lib:6.1f} us "
              f"(do_bench {lib_host:6.1f}), second stage at {best}: {new:6.1f} us ({lib / new:4.2f}x), "
              f"same results {ok}", flush=True)


def forwards():
    """The forward's tiles before (2048 elements, 4 programs a multiprocessor) and now (``_FORWARD``)."""
    for (M, N), layer in itertools.product(NORMS, (False, True)):
        x = torch.randn(M, N, device=DEVICE, dtype=torch.bfloat16)
        w = torch.randn(N, device=DEVICE, dtype=torch.bfloat16)
        b = torch.randn_like(w) if layer else None
        times = {}
        for name, tiles in (("before", (2048, 4)), ("now", norm._FORWARD)):
            with mock.patch.object(norm, "_FORWARD", tiles):
                norm._launch_shape.cache_clear()
                times[name] = bench(lambda: norm._norm_fwd(x, w, b, 1e-6, False, None, not layer))
        norm._launch_shape.cache_clear()
        print(f"{'LayerNorm' if layer else 'RMSNorm':9s} fwd [{M:5d}, {N:5d}]: before {times['before']:6.1f} us, "
              f"now {times['now']:6.1f} us ({times['before'] / times['now']:4.2f}x)", flush=True)


if __name__ == "__main__":
    for P, N in PARTIALS:
        sweep(P, N)
    print()
    norms()
    print()
    forwards()
