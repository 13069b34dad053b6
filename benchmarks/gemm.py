"""Dense GEMM with fused epilogues against cuBLAS + the torch elementwise op, bf16 on CUDA.

    python -m benchmarks.gemm [--out DIR] [--tune]

Cases, at (M, K, N) = (16384, 4096, 14336) and (16384, 14336, 4096):
``fwd_gelu`` gemm(bias, GELU_TANH) vs F.linear + F.gelu(tanh) (``+save``: also the
pre-activation); ``fwd_swiglu`` gemm_gated(SILU) on N = 2F vs F.linear + silu(a) * b;
``dgrad_gelu`` (dy @ W) * gelu'(z) with W [K, N] row-major vs matmul + aten.gelu_backward;
``plain`` / ``plain_dgrad`` against torch.matmul. Times are do_bench medians on random
data; the ratio is torch time / fuseops time in the same run. Writes
``gemm-<gpu>-<date>.json`` (and ``.png`` when matplotlib imports) under --out (default
``benchmarks/results``); --tune sweeps the tile configs instead and appends to
``gemm_tune.jsonl`` under --out (default the temp dir).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F
import triton

from benchmarks._results import RESULTS, pyplot, results_path
from benchmarks._timing import interleaved_medians
from fuseops.kernels.elementwise.activation_math import Activation
from fuseops.kernels.gemm.dense import GemmConfig, gemm, launch_gemm, reference_gemm
from fuseops.kernels.gemm.dense_gated import gemm_gated, launch_gemm_gated

SHAPES = [(16384, 4096, 14336), (16384, 14336, 4096)]
GELU = Activation.GELU_TANH


def inputs(m, k, n):
    """x [M, K]; w [N, K] (a Linear's weight); bias [N]; dy [M, K]; wd [K, N] (the weight
    of a Linear N -> K, for dgrad); z [M, N] (the activation input dgrad differentiates)."""
    def rand(*shape, scale=1.0):
        return (torch.randn(*shape, device="cuda") * scale).to(torch.bfloat16)

    return dict(x=rand(m, k), w=rand(n, k, scale=k**-0.5), bias=rand(n), dy=rand(m, k),
                wd=rand(k, n, scale=k**-0.5), z=rand(m, n))


def cases(t):
    """name -> (fuseops fn, torch fn); each returns the tensor compared for correctness."""
    x, w, bias, dy, wd, z = (t[k] for k in ("x", "w", "bias", "dy", "wd", "z"))

    def torch_swiglu():
        h = F.linear(x, w)
        ga, up = h.chunk(2, dim=-1)
        return F.silu(ga) * up

    return {
        "fwd_gelu": (lambda: gemm(x, w.t(), bias=bias, act=GELU)[0],
                     lambda: F.gelu(F.linear(x, w, bias), approximate="tanh")),
        "fwd_gelu+save": (lambda: gemm(x, w.t(), bias=bias, act=GELU, save_preact=True)[0],
                          lambda: F.gelu(F.linear(x, w, bias), approximate="tanh")),
        "fwd_swiglu": (lambda: gemm_gated(x, w.t(), act=Activation.SILU)[0], torch_swiglu),
        "fwd_swiglu+save": (lambda: gemm_gated(x, w.t(), act=Activation.SILU, save_preact=True)[0],
                            torch_swiglu),
        "dgrad_gelu": (lambda: gemm(dy, wd, act=GELU, act_grad_input=z)[0],
                       lambda: torch.ops.aten.gelu_backward(dy @ wd, z, approximate="tanh")),
        "plain": (lambda: gemm(x, w.t())[0], lambda: torch.matmul(x, w.t())),
        "plain_dgrad": (lambda: gemm(dy, wd)[0], lambda: torch.matmul(dy, wd)),
    }


def rel_err(out, ref):
    return ((out.float() - ref.float()).norm() / ref.float().norm()).item()


def bench(fn):
    return triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")


def bench_pair(ours, theirs, rounds=3):
    times = interleaved_medians({"ours": ours, "theirs": theirs}, rounds)
    return times["ours"], times["theirs"]


def run_benchmark(out_dir):
    rows = []
    for m, k, n in SHAPES:
        t = inputs(m, k, n)
        flops = 2.0 * m * k * n
        for name, (ours, theirs) in cases(t).items():
            err = rel_err(ours(), theirs())
            ms_ours, ms_torch = bench_pair(ours, theirs)
            rows.append(dict(case=name, M=m, K=k, N=n, fuseops_ms=ms_ours, torch_ms=ms_torch,
                             fuseops_tflops=flops / ms_ours * 1e-9,
                             torch_tflops=flops / ms_torch * 1e-9,
                             ratio=ms_torch / ms_ours, rel_err=err))
        del t
    result = dict(device=torch.cuda.get_device_name(), torch=torch.__version__,
                  triton=triton.__version__, dtype="bfloat16", time=time.strftime("%Y-%m-%d %H:%M"),
                  rows=rows)
    path = results_path("gemm", "", directory=Path(out_dir))
    with open(f"{path}.json", "w") as f:
        json.dump(result, f, indent=1)
    plot(rows, f"{path}.png")
    print(f"{'case':<16} {'M,K,N':<18} {'fuseops TF/s':>12} {'torch TF/s':>11} {'ratio':>6} {'rel err':>8}")
    for r in rows:
        shape = f"{r['M']},{r['K']},{r['N']}"
        print(f"{r['case']:<16} {shape:<18} {r['fuseops_tflops']:>12.0f} "
              f"{r['torch_tflops']:>11.0f} {r['ratio']:>6.3f} {r['rel_err']:>8.1e}")


def plot(rows, path):
    plt = pyplot()
    if plt is None:
        return
    labels = [f"{r['case']}\n{r['K']}->{r['N']}" for r in rows]
    pos = range(len(rows))
    fig, ax = plt.subplots(figsize=(max(8, len(rows) * 0.9), 4.5))
    ax.bar([p - 0.2 for p in pos], [r["fuseops_tflops"] for r in rows], 0.4, label="fuseops")
    ax.bar([p + 0.2 for p in pos], [r["torch_tflops"] for r in rows], 0.4, label="torch")
    ax.set_xticks(list(pos), labels, rotation=60, ha="right", fontsize=7)
    ax.set_ylabel("TFLOP/s (bf16, M=16384)")
    ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


# The tune sweep's candidates: whether 4 stages pays where the epilogue loads nothing (with an
# epilogue load 4 stages do not fit in shared memory). Timed with CUDA graphs, so small shapes
# measure the GPU, not the launch.
LARGE = [(16384, 4096, 14336), (16384, 14336, 4096)]
SMALL = [(1024, 4096, 4096)]
GEMM_CANDIDATES = {
    "large": [GemmConfig(128, 256, 64, 8, 8, 3), GemmConfig(128, 256, 64, 8, 8, 4)],
}
GATED_CANDIDATES: dict[str, list[GemmConfig]] = {}


def run_tune(out_dir):
    for klass, shapes in (("large", LARGE), ("small", SMALL)):
        for m, k, n in shapes:
            t = inputs(m, k, n)
            x, w, bias, dy, wd, z = (t[key] for key in ("x", "w", "bias", "dy", "wd", "z"))
            flops = 2.0 * m * k * n
            variants = {
                "fwd_gelu+save": (lambda c: launch_gemm(x, w.t(), bias, GELU, 1.0, True, None, None, None, c),
                                  lambda: reference_gemm(x, w.t(), bias=bias, act=GELU)[0]),
                "dgrad_gelu": (lambda c: launch_gemm(dy, wd, None, GELU, 1.0, False, z, None, None, c),
                               lambda: reference_gemm(dy, wd, act=GELU, act_grad_input=z)[0]),
                "plain": (lambda c: launch_gemm(x, w.t(), None, Activation.IDENTITY, 1.0, False, None, None, None, c),
                          lambda: reference_gemm(x, w.t())[0]),
            }
            for name, (fn, reference) in variants.items():
                if not GEMM_CANDIDATES.get(klass):
                    break
                ref = reference()
                for cfg in GEMM_CANDIDATES[klass]:
                    _try(name, (m, k, n), cfg, lambda c=cfg: fn(c)[0], ref, flops, out_dir)
                del ref
            gated = lambda c: launch_gemm_gated(x, w.t(), None, Activation.SILU, False, False, 7.0, 1.0, True, None, c)
            h = F.linear(x, w).float()
            ref = F.silu(h[:, : n // 2]) * h[:, n // 2:]
            del h
            for cfg in GATED_CANDIDATES.get(klass, []):
                _try("fwd_swiglu+save", (m, k, n), cfg, lambda c=cfg: gated(c)[0], ref, flops, out_dir)
            del t, ref


def _try(name, shape, cfg, fn, ref, flops, out_dir):
    row = dict(case=name, shape=shape, cfg=dataclasses.astuple(cfg))
    try:
        row["rel_err"] = rel_err(fn(), ref)
        row["tflops"] = flops / triton.testing.do_bench_cudagraph(fn, rep=100, return_mode="median") * 1e-9
    except Exception as exc:  # a config that does not fit (shared memory, registers)
        lines = str(exc).strip().splitlines() or [""]
        row["error"] = f"{type(exc).__name__}: {lines[-1][:160]}"
    print(name, shape, row["cfg"], f"{row.get('tflops', 0):.0f} TF/s",
          f"err {row.get('rel_err', float('nan')):.1e}", row.get("error", ""), flush=True)
    # One JSON line per candidate, written as it comes, so a cut-off sweep keeps its rows.
    with open(os.path.join(out_dir, "gemm_tune.jsonl"), "a") as f:
        f.write(json.dumps(row) + "\n")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="directory (default benchmarks/results; with --tune the temp dir)")
    parser.add_argument("--tune", action="store_true")
    args = parser.parse_args()
    out = args.out or (tempfile.gettempdir() if args.tune else str(RESULTS))
    os.makedirs(out, exist_ok=True)
    if args.tune:
        run_tune(out)
    else:
        run_benchmark(out)


if __name__ == "__main__":
    main()
