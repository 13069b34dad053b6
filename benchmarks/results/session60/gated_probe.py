"""Session 60 probe (issue 20, shape-aware dispatch of the gated GEMM): the cuBLAS branch of
``dense_cublas.gemm_gated`` is ``torch.addmm`` then fuseops' gated activation kernel, whose tile
configs were never timed ("not timed yet", elementwise/gated_activation.py). Run 5 put that
branch at 323 us for M=1024 K=4096 2F=21760 where torch.compile's profile (session 52) had
cuBLAS 247 us + its fused silu-mul 19 us. GPU time (CUDA-graph replays) of the forward and
backward gated kernels per tile config, beside torch eager and torch.compile of
``silu(a) * b``, at the dense stacks' shapes; and addmm alone at that shape.

    python benchmarks/results/session60/gated_probe.py
"""
import torch
import torch.nn.functional as F

from benchmarks.dense_dispatch import graphed_us
from fuseops.kernels.elementwise import gated_activation as ga
from fuseops.kernels.elementwise.activation_math import Activation

SHAPES = ((1024, 2688), (1024, 5440), (1024, 10880), (4096, 5440), (4096, 10880), (16384, 5440), (16384, 10880))
FWD = ((8, 256, 8), (4, 256, 4), (4, 512, 4), (8, 512, 8), (16, 256, 8), (2, 1024, 4), (1, 1024, 4), (32, 128, 8),
       (16, 512, 8), (32, 256, 8))
BWD = ((4, 256, 4), (2, 256, 4), (8, 256, 8), (4, 512, 8), (2, 512, 4), (1, 1024, 4), (8, 128, 4), (16, 128, 8))
_original = ga._configs


def with_config(kind, cfg):
    configs = dict(_original())
    configs[kind] = ga.GatedConfig(*cfg[:2], num_warps=cfg[2])
    ga._configs = lambda: configs


def swiglu(x):
    a, b = x.chunk(2, -1)
    return F.silu(a) * b


compiled = torch.compile(swiglu, dynamic=False)


def timed(fn):
    try:
        return graphed_us(fn)
    except Exception as e:  # a probe: one failing variant must not stop the others
        print("  ", type(e).__name__, str(e)[:200])
        return None


def main():
    kw = dict(device="cuda", dtype=torch.bfloat16)
    for M, Fw in SHAPES:
        x = torch.randn(M, 2 * Fw, **kw)
        dy = torch.randn(M, Fw, **kw)
        gb = (M * 2 * Fw + M * Fw) * 2 / 1e3  # bytes / 1e3: GB/s from us
        row = {}
        for cfg in FWD:
            with_config("fwd", cfg)
            row[f"fwd{cfg}"] = timed(lambda: ga.gated_fwd(x, Activation.SILU))
        ga._configs = _original
        row["torch fwd"] = timed(lambda: swiglu(x))
        row["compile fwd"] = timed(lambda: compiled(x))
        for cfg in BWD:
            with_config("bwd", cfg)
            row[f"bwd{cfg}"] = timed(lambda: ga.gated_bwd(x, dy, Activation.SILU))
        ga._configs = _original
        print(f"M={M} F={Fw}  (fwd moves {gb/1e3:.1f} MB; bwd {gb*5/3/1e3:.1f} MB)")
        for name, us in row.items():
            if us is None:
                print(f"   {name:22s} failed")
                continue
            moved = gb * (5 / 3 if "bwd" in name else 1)
            print(f"   {name:22s} {us:8.1f} us {moved / us:7.0f} GB/s", flush=True)
    a = torch.randn(1024, 4096, **kw)
    w = torch.randn(21760, 4096, **kw)
    bias = torch.randn(21760, **kw)
    print(f"addmm M=1024 K=4096 N=21760: {graphed_us(lambda: torch.addmm(bias, a, w.t())):.1f} us; "
          f"mm {graphed_us(lambda: torch.mm(a, w.t())):.1f} us; "
          f"F.linear {graphed_us(lambda: F.linear(a, w, bias)):.1f} us")


if __name__ == "__main__":
    main()
