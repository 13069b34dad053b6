"""Session 61: tile candidates for the float32 grouped GEMM (forward, the ``fp32`` entry of
``grouped._configs``, "the largest tiles that compile, not timed") under both float32 matmul
precisions, at one MoE shape (E=64, rows 32768, H=2048, F=1408, uniform), against a per-expert
torch.mm loop. Prints a line per candidate as it goes (a compile failure prints and goes on)."""

import sys
import time

import torch

from benchmarks._timing import interleaved_medians
from benchmarks.float32_precision import calls, under
from benchmarks.grouped_gemm import split_sizes
from fuseops.kernels.gemm.grouped import GemmConfig, group_offsets, launch_grouped_gemm

E, T, H, F = 64, 32768, 2048, 1408
CANDIDATES = [
    GemmConfig(64, 64, 32, 8, 4, 2),    # the table's now
    GemmConfig(128, 128, 32, 8, 8, 3),
    GemmConfig(128, 128, 32, 8, 4, 3),
    GemmConfig(128, 64, 32, 8, 4, 4),
    GemmConfig(128, 256, 32, 8, 8, 3),
    GemmConfig(64, 128, 32, 8, 4, 4),
]
g = torch.Generator(device="cuda").manual_seed(0)
sizes = split_sizes(E, T, "uniform")
offsets = group_offsets(torch.tensor(sizes, device="cuda"))
x = torch.randn(T, H, device="cuda", generator=g)
w = torch.randn(E, F, H, device="cuda", generator=g) / H ** 0.5
y = torch.empty(T, F, device="cuda")
_, loop = calls(E, T, H, F, torch.float32, "forward")
base = interleaved_medians({"loop ieee": under("ieee", loop), "loop tf32": under("tf32", loop)}, rounds=1,
                           warmup=5, rep=30)
print("torch loop", base, flush=True)
limit = float(sys.argv[1]) if len(sys.argv) > 1 else 1e9
start = time.time()
for cfg in CANDIDATES:
    for precision in ("tf32", "ieee"):
        if time.time() - start > limit:
            print("stopped at the time limit", flush=True)
            sys.exit(0)
        fn = under(precision, lambda c=cfg: launch_grouped_gemm(x, w.transpose(1, 2), offsets, None, None, 0, 1.0,
                                                                 False, None, y, c))
        try:
            t0 = time.time()
            fn()
            torch.cuda.synchronize()
            compile_s = time.time() - t0
            ms = interleaved_medians({"f": fn}, rounds=1, warmup=5, rep=30)["f"]
            print(f"{precision} {cfg}: {ms:.3f} ms (compile {compile_s:.0f} s), "
                  f"{base['loop ' + precision] / ms:.2f}x the loop", flush=True)
        except Exception as e:  # noqa: BLE001 - a candidate that does not compile is a result
            print(f"{precision} {cfg}: failed {type(e).__name__}: {str(e)[:120]}", flush=True)
