"""Activation offload on a stack of transformer-like layers, bf16 on CUDA.

    python -m benchmarks.offload [--out DIR] [--layers 8] [--tokens 8192] [--hidden 4096]

Each layer: pre-norm attention (qkv Linear, causal F.scaled_dot_product_attention with
heads of 128, output Linear) and a pre-norm GELU MLP (4x), both residual. One training
step (forward, squared-mean loss, backward) is timed (CUDA events, median of --steps
after warm-up) and its peak memory measured (max_memory_allocated above what the step
starts with; reserved too), in the same process, for:

- ``none``: no offload (the baseline of every ratio);
- ``fuseops``: offload_activations(keep_last=1) with one group per layer and a per-group
  budget from ``link_budget`` and the measured forward time of one layer (the arithmetic
  in fuseops/offload/api.py), so the copies hide behind compute;
- ``fuseops_all``: the same without a budget (every activation moves: link-bound);
- ``save_on_cpu``: torch.autograd.graph.save_on_cpu(pin_memory=True).

"peak saved / planned" is (peak of none - peak of the run) / bytes the run offloaded.
The input is marked with mark_not_offload: the caller holds it, moving it frees nothing.
Writes offload.json and offload.png (step time, peak, memory over one step) under --out.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import time

import torch
import torch.nn.functional as F
from torch import nn

from fuseops.offload import link_budget, mark_not_offload, offload_activations


class Layer(nn.Module):
    def __init__(self, hidden: int, head_dim: int = 128) -> None:
        super().__init__()
        self.heads = hidden // head_dim
        self.norm1, self.norm2 = nn.LayerNorm(hidden), nn.LayerNorm(hidden)
        self.qkv = nn.Linear(hidden, 3 * hidden, bias=False)
        self.proj = nn.Linear(hidden, hidden, bias=False)
        self.fc1, self.fc2 = nn.Linear(hidden, 4 * hidden), nn.Linear(4 * hidden, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, h = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, s, 3, self.heads, -1).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, s, h))
        return x + self.fc2(F.gelu(self.fc1(self.norm2(x)), approximate="tanh"))


def scheme_context(name: str, budget: int | None):
    if name == "fuseops":
        return offload_activations(keep_last=1, group_budget_bytes=budget)
    if name == "fuseops_all":
        return offload_activations(keep_last=1, group_budget_bytes=None)
    if name == "save_on_cpu":
        return torch.autograd.graph.save_on_cpu(pin_memory=True)
    return contextlib.nullcontext()


def step(layers: nn.ModuleList, x: torch.Tensor, name: str, budget: int | None, sample=None):
    """One training step; returns the offload stats (or None)."""
    for p in layers.parameters():
        p.grad = None
    with scheme_context(name, budget) as handle:
        h = x
        for layer in layers:
            with handle.group() if name.startswith("fuseops") else contextlib.nullcontext():
                h = layer(h)
    loss = h.float().square().mean()
    if sample:
        sample("loss")
    loss.backward()
    return handle.stats if name.startswith("fuseops") else None


def forward_ms_per_layer(layers, x, steps):
    times = []
    for _ in range(steps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        h = x
        for layer in layers:
            h = layer(h)
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
        del h
    return statistics.median(times) / len(layers)


def measure(layers, x, name, budget, steps):
    for _ in range(3):
        step(layers, x, name, budget)
    times = []
    for _ in range(steps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        start.record()
        step(layers, x, name, budget)
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base, base_reserved = torch.cuda.memory_allocated(), torch.cuda.memory_reserved()
    stats = step(layers, x, name, budget)
    torch.cuda.synchronize()
    return dict(step_ms=statistics.median(times), step_ms_all=times,
                peak_gb=(torch.cuda.max_memory_allocated() - base) / 1e9,
                peak_reserved_gb=(torch.cuda.max_memory_reserved() - base_reserved) / 1e9,
                stats=stats)


def timeline(layers, x, name, budget):
    """memory_allocated at every module boundary of one step, forward and backward. The
    caching allocator accounts in host order, so these samples are its exact curve."""
    samples = []

    def sample(*_):
        samples.append(torch.cuda.memory_allocated() / 1e9)

    def after_forward(module, args, output):
        sample()
        # Fires when backward reaches this module's output: the start of its backward.
        if output.requires_grad:
            output.register_hook(sample)

    hooks = [m.register_forward_hook(after_forward) for m in layers.modules() if not list(m.children())]
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated() / 1e9
    step(layers, x, name, budget, sample)
    torch.cuda.synchronize()
    for h in hooks:
        h.remove()
    return [s - base for s in samples]


def run_benchmark(args):
    torch.manual_seed(0)
    layers = nn.ModuleList(Layer(args.hidden) for _ in range(args.layers)).to("cuda", torch.bfloat16)
    x = torch.randn(1, args.tokens, args.hidden, device="cuda", dtype=torch.bfloat16)
    mark_not_offload(x)
    ms_layer = forward_ms_per_layer(layers, x, args.steps)
    budget = link_budget(ms_layer / 1e3)
    runs = {}
    for name in ("none", "fuseops", "fuseops_all", "save_on_cpu"):
        runs[name] = measure(layers, x, name, budget, args.steps)
        runs[name]["timeline_gb"] = timeline(layers, x, name, budget)
        print(f"{name}: {runs[name]['step_ms']:.1f} ms, peak {runs[name]['peak_gb']:.2f} GB", flush=True)
    base = runs["none"]
    for run in runs.values():
        run["time_ratio"] = run["step_ms"] / base["step_ms"]
        run["peak_saved_gb"] = base["peak_gb"] - run["peak_gb"]
        planned = run["stats"]["bytes_offloaded"] / 1e9 if run["stats"] else None
        run["planned_gb"] = planned
        run["peak_saved_over_planned"] = run["peak_saved_gb"] / planned if planned else None
    result = dict(device=torch.cuda.get_device_name(), torch=torch.__version__, dtype="bfloat16",
                  time=time.strftime("%Y-%m-%d %H:%M"), layers=args.layers, tokens=args.tokens,
                  hidden=args.hidden, forward_ms_per_layer=ms_layer, group_budget_bytes=budget,
                  targets=dict(peak_saved_over_planned=">= 0.95", time_ratio="<= 1.03"), runs=runs)
    with open(os.path.join(args.out, "offload.json"), "w") as f:
        json.dump(result, f, indent=1)
    plot(result, os.path.join(args.out, "offload.png"))
    print(f"forward {ms_layer:.2f} ms/layer -> budget {budget / 1e6:.0f} MB/group")
    print(f"{'run':<12} {'step ms':>8} {'x none':>7} {'peak GB':>8} {'reserved':>9} "
          f"{'saved GB':>9} {'planned':>8} {'saved/pl':>9}")
    for name, r in runs.items():
        planned = f"{r['planned_gb']:.2f}" if r["planned_gb"] else "-"
        ratio = f"{r['peak_saved_over_planned']:.3f}" if r["peak_saved_over_planned"] else "-"
        print(f"{name:<12} {r['step_ms']:>8.1f} {r['time_ratio']:>7.3f} {r['peak_gb']:>8.2f} "
              f"{r['peak_reserved_gb']:>9.2f} {r['peak_saved_gb']:>9.2f} {planned:>8} {ratio:>9}")


def plot(result, path):
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    runs = result["runs"]
    names = list(runs)
    fig, (ax_t, ax_m, ax_line) = plt.subplots(1, 3, figsize=(15, 4.5), gridspec_kw=dict(width_ratios=[1, 1, 2]))
    ax_t.bar(names, [runs[n]["step_ms"] for n in names])
    ax_t.set_ylabel("step time (ms)")
    ax_m.bar(names, [runs[n]["peak_gb"] for n in names])
    ax_m.set_ylabel("peak memory above start (GB)")
    for ax in (ax_t, ax_m):
        ax.tick_params(axis="x", rotation=30)
    for n in names:
        ax_line.plot(runs[n]["timeline_gb"], label=n)
    ax_line.set_xlabel("module boundary (forward, then backward)")
    ax_line.set_ylabel("allocated (GB)")
    ax_line.legend()
    fig.suptitle(f"{result['layers']} layers, H={result['hidden']}, {result['tokens']} tokens, bf16, "
                 f"{result['device']}")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results"))
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=8192)
    parser.add_argument("--hidden", type=int, default=4096)
    parser.add_argument("--steps", type=int, default=10)
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    run_benchmark(args)


if __name__ == "__main__":
    main()
