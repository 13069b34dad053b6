"""Elementwise, gated and normalization kernels against torch eager, bf16, on the GPU.

Each launcher is timed beside its torch equivalent in the same run (``F.gelu``,
``F.silu(a) * b``, ``F.rms_norm``, ``F.layer_norm``; backward through autograd), with the
median of ``triton.testing.do_bench``. GB/s count the bytes each op must move at least
(inputs read once, outputs written once); ratio = torch time / fuseops time.
Gated ops read [rows, 2F] and write [rows, F], with F the shape's second dim.

    python -m benchmarks.elementwise [--out DIR]     # elementwise-<gpu>-<date>.json and .png
"""

from __future__ import annotations

import argparse
import json
import pathlib

import torch
import torch.nn.functional as F
import triton.testing

from benchmarks._results import RESULTS, results_path
from benchmarks.plot import plot_file
from fuseops.kernels.elementwise import activation as activation
from fuseops.kernels.elementwise import gated_activation as gated_activation
from fuseops.kernels.elementwise import norm as norm
from fuseops.kernels.elementwise.activation_math import Activation

SHAPES = [(16384, 4096), (16384, 14336)]
EPS = 1e-5


def bench(fn) -> float:
    return triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")


def grad(y, inputs, dy):
    return lambda: torch.autograd.grad(y, inputs, dy, retain_graph=True)


def cases(rows, n):
    """``(name, fuseops fn, torch fn, bytes moved)`` for one shape."""
    dev, dt = "cuda", torch.bfloat16
    x = torch.randn(rows, n, device=dev, dtype=dt, requires_grad=True)
    dy = torch.randn(rows, n, device=dev, dtype=dt)
    w = torch.randn(n, device=dev, dtype=dt, requires_grad=True)
    b = torch.randn(n, device=dev, dtype=dt, requires_grad=True)
    size = x.numel() * x.element_size()
    gelu = Activation.GELU_TANH
    yield "gelu_tanh fwd", lambda: activation.activation_fwd(x, gelu), lambda: F.gelu(x, approximate="tanh"), 2 * size
    y = F.gelu(x, approximate="tanh")
    yield "gelu_tanh bwd", lambda: activation.activation_bwd(x, dy, gelu), grad(y, x, dy), 3 * size
    gelu_grad = grad(y, x, dy)
    yield ("gelu_tanh bwd+dbias", lambda: activation.activation_bwd_dbias(x, dy, gelu),
           lambda: gelu_grad()[0].sum(0), 3 * size)

    xg = torch.randn(rows, 2 * n, device=dev, dtype=dt, requires_grad=True)
    silu = Activation.SILU

    def swiglu():
        a, g = xg.chunk(2, -1)
        return F.silu(a) * g

    yield "swiglu fwd", lambda: gated_activation.gated_fwd(xg, silu), swiglu, 3 * size
    y = swiglu()
    yield "swiglu bwd", lambda: gated_activation.gated_bwd(xg, dy, silu), grad(y, xg, dy), 5 * size

    _, rstd = norm.rmsnorm_fwd(x, w, EPS)
    yield "rmsnorm fwd", lambda: norm.rmsnorm_fwd(x, w, EPS), lambda: F.rms_norm(x, (n,), w, EPS), 2 * size
    y = F.rms_norm(x, (n,), w, EPS)
    yield "rmsnorm bwd", lambda: norm.rmsnorm_bwd(dy, x, w, rstd), grad(y, (x, w), dy), 3 * size
    _, mean, rstd = norm.layernorm_fwd(x, w, b, EPS)
    yield ("layernorm fwd", lambda: norm.layernorm_fwd(x, w, b, EPS),
           lambda: F.layer_norm(x, (n,), w, b, EPS), 2 * size)
    y = F.layer_norm(x, (n,), w, b, EPS)
    yield "layernorm bwd", lambda: norm.layernorm_bwd(dy, x, w, mean, rstd), grad(y, (x, w, b), dy), 3 * size


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=str(RESULTS), help="directory (default benchmarks/results)")
    args = parser.parse_args()
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = results_path("elementwise", "", directory=out)
    rows = []
    for shape in SHAPES:
        for name, ours, theirs, nbytes in cases(*shape):
            with torch.no_grad() if name.endswith("fwd") else torch.enable_grad():
                t_ours, t_torch = bench(ours), bench(theirs)
            rows.append({
                "op": name, "shape": list(shape), "fuseops_ms": t_ours, "torch_ms": t_torch,
                "fuseops_gbps": nbytes / t_ours / 1e6, "torch_gbps": nbytes / t_torch / 1e6,
                "ratio": t_torch / t_ours,
            })
            print(f"{name} {shape}: {rows[-1]['ratio']:.2f}x", flush=True)
        torch.cuda.empty_cache()
    result = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": rows}
    path.with_suffix(".json").write_text(json.dumps(result, indent=1))
    plot_file(path.with_suffix(".json"))
    print(f"\n{'op':<22}{'shape':<16}{'fuseops GB/s':>13}{'torch GB/s':>12}{'ratio':>7}")
    for r in rows:
        shape = "x".join(map(str, r["shape"]))
        print(f"{r['op']:<22}{shape:<16}{r['fuseops_gbps']:>13.0f}{r['torch_gbps']:>12.0f}{r['ratio']:>7.2f}")


if __name__ == "__main__":
    main()
