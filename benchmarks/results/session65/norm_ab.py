"""Session 65: the norm kernels before (the module at a4efc7c: ``norm_gpu.sh`` makes it in /tmp/abn from
``norm_revert.patch``) and after rows above 2^40
were normalized by their largest magnitude (the forward gained a row max, a division per row and a scaled copy of the
row in registers; the chunked path a running row max and a rescue pass for blocks holding such rows). GPU time of the
forward and backward launchers, bf16, ordinary rows (randn), old / new alternating, medians of ``do_bench``.

    python benchmarks/results/session65/norm_ab.py
"""
import importlib.util
import pathlib
import sys

import torch
import triton.testing

from fuseops.kernels.elementwise import norm as new

BEFORE = pathlib.Path("/tmp/abn/fuseops/kernels/elementwise/norm.py")
spec = importlib.util.spec_from_file_location("norm_before", BEFORE)
old = sys.modules["norm_before"] = importlib.util.module_from_spec(spec)  # (dataclasses look it up)
spec.loader.exec_module(old)

for rows, n in ((16384, 1024), (16384, 4096), (4096, 8192), (1000, 16387), (4096, 16384)):
    x = torch.randn(rows, n, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, device="cuda", dtype=torch.bfloat16)
    dy = torch.randn_like(x)
    for kind in ("rms", "ln"):
        times = {"old": [], "new": []}
        for _ in range(3):
            for name, mod in (("old", old), ("new", new)):
                if kind == "rms":
                    fwd = lambda: mod.rmsnorm_fwd(x, w, 1e-5)  # noqa: E731
                else:
                    fwd = lambda: mod.layernorm_fwd(x, w, b, 1e-5)  # noqa: E731
                times[name].append(triton.testing.do_bench(fwd, warmup=25, rep=100))
        o, nw = sorted(times["old"])[1], sorted(times["new"])[1]
        same = torch.equal(old.rmsnorm_fwd(x, w, 1e-5)[0], new.rmsnorm_fwd(x, w, 1e-5)[0]) if kind == "rms" else \
            torch.equal(old.layernorm_fwd(x, w, b, 1e-5)[0], new.layernorm_fwd(x, w, b, 1e-5)[0])
        print(f"{kind} fwd [{rows}, {n}]  old {o * 1e3:7.1f} us  new {nw * 1e3:7.1f} us  new/old {nw / o:.3f}  "
              f"y bit for bit: {same}")
