"""Session 66: the norm forward's GPU time, three modules alternating: ``before`` (a1cfaa3, before session 65's
change; ``a1cfaa3_norm.py.txt`` here), ``now`` (the working tree) and ``cap`` (call 3: the working tree's module with
``maxnreg=32`` where a program has 32 warps; call 4: ``nocap``, the working tree's without its register caps). bf16,
randn rows, medians of ``do_bench`` over three rounds; whether ``y`` matches ``before`` bit for bit.

Call 3 ran it on the module with the overflow check before the store (a tile more in registers); call 4 on the
check after the store, with ``_FORWARD_MAXNREG``.

    python benchmarks/results/session66/norm_ab.py
"""
import functools
import importlib.util
import pathlib
import re
import sys

import torch
import triton.testing

from fuseops.kernels.elementwise import norm as now

HERE = pathlib.Path(__file__).parent


def load(name: str, source: str):
    path = pathlib.Path(f"/tmp/norm_ab_{name}.py")
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(f"norm_{name}", path)
    module = sys.modules[f"norm_{name}"] = importlib.util.module_from_spec(spec)  # (dataclasses look it up)
    spec.loader.exec_module(module)
    return module


before = load("before", (HERE / "a1cfaa3_norm.py.txt").read_text())
uncapped, n = re.subn(r'\n        \*\*\(\{"maxnreg": cfg.maxnreg\} if cfg.maxnreg else \{\}\),', "",
                      pathlib.Path(now.__file__).read_text())
assert n == 1, "the forward's launch moved"
nocap = load("nocap", uncapped)


def forward(mod, *, kind, x, w, b):
    """The forward of ``mod`` as a call of no arguments."""
    return (lambda: mod.rmsnorm_fwd(x, w, 1e-5)) if kind == "rms" else (lambda: mod.layernorm_fwd(x, w, b, 1e-5))


modules = {"before": before, "now": now, "nocap": nocap}

for rows, n in ((16384, 1024), (1024, 1024), (16384, 2048), (16384, 4096), (4096, 8192), (1000, 16387),
                (4096, 16384)):
    x = torch.randn(rows, n, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, device="cuda", dtype=torch.bfloat16)
    for kind in ("rms", "ln"):
        fwd = functools.partial(forward, kind=kind, x=x, w=w, b=b)
        times = {name: [] for name in modules}
        for _ in range(3):
            for name, mod in modules.items():
                times[name].append(triton.testing.do_bench(fwd(mod), warmup=25, rep=100))
        med = {name: sorted(t)[1] * 1e3 for name, t in times.items()}
        same = all(torch.equal(fwd(before)()[0], fwd(mod)()[0]) for mod in (now, nocap))
        print(f"{kind} fwd [{rows}, {n}]  " + "  ".join(f"{k} {v:6.1f} us" for k, v in med.items())
              + f"  now/before {med['now'] / med['before']:.3f}  nocap/before {med['nocap'] / med['before']:.3f}"
              + f"  y bit for bit: {same}", flush=True)
