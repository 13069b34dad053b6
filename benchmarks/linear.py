"""Fused Linear+bias+activation (GELU tanh, SwiGLU) against torch, forward and
forward+backward, bf16, on the GPU.

Baselines in the same run: eager ``F.linear`` + the torch activation, and the same
function under ``torch.compile`` (the stronger of the two is the reference for the
ratio). TFLOP/s count the GEMMs only: 2*T*in*out forward, 3x that for forward+backward.

Times are medians over three interleaved rounds (benchmarks/_timing.py).

    python -m benchmarks.linear [--no-compile] [--out DIR]     # linear-<gpu>-<date>.json and .png
"""

from __future__ import annotations

import argparse
import json
import pathlib

import torch
import torch.nn.functional as F

import fuseops
from benchmarks._results import RESULTS, pyplot, results_path
from benchmarks._timing import interleaved_medians
from fuseops import ops

SHAPES = [(16384, 4096, 14336), (16384, 14336, 4096)]


def torch_gelu(x, w, b):
    return F.gelu(F.linear(x, w, b), approximate="tanh")


def torch_swiglu(x, w, b):
    a, g = F.linear(x, w, b).chunk(2, -1)
    return F.silu(a) * g


def fwd_bwd(fn, x, dy, params):
    def run():
        for t in (x, *params):
            t.grad = None
        fn().backward(dy)

    return run


def measure(tokens, k, n, act, use_compile):
    dev, dt = "cuda", torch.bfloat16
    act_op = ops.GELU(approximate="tanh") if act == "gelu_tanh" else ops.SwiGLU()
    model = fuseops.Sequential(ops.Linear(k, n, device=dev, dtype=dt), act_op)
    w, b = model[0].weight, model[0].bias
    x = torch.randn(tokens, k, device=dev, dtype=dt, requires_grad=True)
    ref_fn = torch_gelu if act == "gelu_tanh" else torch_swiglu
    out_n = n if act == "gelu_tanh" else n // 2
    dy = torch.randn(tokens, out_n, device=dev, dtype=dt)
    candidates = {"torch eager": ref_fn}
    if use_compile:
        candidates["torch.compile"] = torch.compile(ref_fn)

    flops = 2 * tokens * k * n
    row = {"tokens": tokens, "in": k, "out": n, "act": act}
    forward = {"fuseops": lambda: model(x)}
    forward.update({name: (lambda fn=fn: fn(x, w, b)) for name, fn in candidates.items()})
    with torch.no_grad():
        row["fwd_ms"] = interleaved_medians(forward, warmup=50, rep=200)
    both = {name: fwd_bwd(fn, x, dy, (w, b)) for name, fn in forward.items()}
    row["fwdbwd_ms"] = interleaved_medians(both, warmup=50, rep=200)
    row["plan_forward"] = model.plan.forward
    row["plan_backward"] = model.plan.backward
    for stage, mult in (("fwd", 1), ("fwdbwd", 3)):
        times = row[f"{stage}_ms"]
        best = min(v for k_, v in times.items() if k_ != "fuseops")
        row[f"{stage}_tflops"] = {k_: mult * flops / v / 1e9 for k_, v in times.items()}
        row[f"{stage}_ratio"] = best / times["fuseops"]
    return row


def plot(rows, path):
    plt = pyplot()
    if plt is None:
        return
    labels = [f"{r['act']}\n{r['tokens']}x{r['in']}x{r['out']}" for r in rows]
    xs = range(len(rows))
    fig, ax = plt.subplots(figsize=(8, 4))
    ax.bar([i - 0.2 for i in xs], [r["fwd_ratio"] for r in rows], 0.4, label="forward")
    ax.bar([i + 0.2 for i in xs], [r["fwdbwd_ratio"] for r in rows], 0.4, label="forward+backward")
    ax.axhline(1.0, color="k", lw=0.8)
    ax.set_xticks(list(xs), labels, fontsize=8)
    ax.set_ylabel("speed vs best torch baseline (x)")
    ax.set_title("fuseops Linear+bias+activation, bf16, " + torch.cuda.get_device_name())
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--no-compile", action="store_true")
    parser.add_argument("--out", default=str(RESULTS), help="directory (default benchmarks/results)")
    args = parser.parse_args()
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = results_path("linear", "", directory=out)
    rows = []
    for tokens, k, n in SHAPES:
        for act in ("gelu_tanh", "swiglu"):
            print(f"measuring {act} {tokens}x{k}x{n} ...", flush=True)
            rows.append(measure(tokens, k, n, act, not args.no_compile))
            torch.cuda.empty_cache()
    result = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": rows}
    path.with_suffix(".json").write_text(json.dumps(result, indent=1))
    plot(rows, path.with_suffix(".png"))
    print(f"\n{'act':<10}{'T x in x out':<22}{'fwd TFLOP/s':>12}{'ratio':>7}{'f+b TFLOP/s':>13}{'ratio':>7}")
    for r in rows:
        print(
            f"{r['act']:<10}{str(r['tokens']) + 'x' + str(r['in']) + 'x' + str(r['out']):<22}"
            f"{r['fwd_tflops']['fuseops']:>12.0f}{r['fwd_ratio']:>7.2f}"
            f"{r['fwdbwd_tflops']['fuseops']:>13.0f}{r['fwdbwd_ratio']:>7.2f}"
        )


if __name__ == "__main__":
    main()
