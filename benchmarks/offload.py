"""Activation offload, step by step: the peak memory and time of steps 1-6 in each mode.

    python -m benchmarks.offload [--out DIR] [--layers 8] [--tokens 8192] [--hidden 4096] [--stacks dense,moe]
    python -m benchmarks.offload --smoke      # CPU, tiny: runs end to end (writes under the temp dir)

Stacks, bf16: ``dense``, ``--layers`` x ``fuseops.Sequential(LayerNorm, Linear(H, 4H), GELU,
Linear(4H, H))`` (each call a group); ``moe``, ``--layers`` blocks of a top-2 softmax router
and ``fuseops.moe.expert_layer`` over ``Sequential(GroupedLinear(8, H, 2F), SwiGLU,
GroupedLinear(8, F, H))``, F = 11H/16 (each block in ``offload.group()``), residual. The
input is marked not to offload.

Modes: ``none``; ``default`` (``offload_activations()``); ``target``
(``peak_bytes_target`` halfway between none's and everything's largest step peak);
``everything`` (``group_budget_bytes=None``); ``save_on_cpu`` (torch's, pinned). Each mode
starts with every ``.grad`` set to None and runs 6 steps (forward, squared-mean loss,
backward; gradients accumulate from step 2), each synchronised, after one step without
offloading that compiles the kernels. Per step: the peak (``max_memory_allocated``,
absolute: what a target caps; and above the step's start), the time (CUDA events), and
for fuseops' modes the bytes moved and the accounted peak with where it fell
(``stats``). Beside them, the rates the default's stated ones stand for: a pinned copy's
bandwidth alone, and the dense stack's FLOP rate without offloading. Writes ``offload-<gpu>-<date>.json`` under --out (default
``benchmarks/results``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import tempfile
import time
from pathlib import Path

import torch
from torch import nn

import fuseops
from benchmarks._results import RESULTS, results_path
from fuseops import ops
from fuseops.offload import mark_not_offload, offload_activations

STEPS = 6
MODES = ("none", "default", "target", "everything", "save_on_cpu")


class ExpertBlock(nn.Module):
    """``x + expert_layer(x, top-2 of a softmax router)``."""

    def __init__(self, hidden: int, experts: int = 8, top_k: int = 2) -> None:
        super().__init__()
        ffn = hidden * 11 // 16
        self.router = nn.Linear(hidden, experts, bias=False)
        self.experts = fuseops.Sequential(
            ops.GroupedLinear(experts, hidden, 2 * ffn), ops.SwiGLU(), ops.GroupedLinear(experts, ffn, hidden))
        self.top_k = top_k

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        probs, ids = self.router(x).float().softmax(-1).topk(self.top_k, dim=-1)
        return x + fuseops.moe.expert_layer(x, ids, probs, self.experts)


def dense_layer(hidden: int) -> nn.Module:
    return fuseops.Sequential(ops.LayerNorm(hidden), ops.Linear(hidden, 4 * hidden), ops.GELU(),
                              ops.Linear(4 * hidden, hidden))


STACKS = {"dense": dense_layer, "moe": ExpertBlock}


def scope(mode: str, target: int | None):
    if mode == "default":
        return offload_activations()
    if mode == "target":
        return offload_activations(peak_bytes_target=target)
    if mode == "everything":
        return offload_activations(group_budget_bytes=None)
    if mode == "save_on_cpu":
        return torch.autograd.graph.save_on_cpu(pin_memory=torch.cuda.is_available())
    return contextlib.nullcontext()


def step(layers: nn.ModuleList, x: torch.Tensor, mode: str, target: int | None = None) -> dict | None:
    """One training step; the offload stats of fuseops' modes (else None)."""
    fuseops_mode = mode in ("default", "target", "everything")
    with scope(mode, target) as handle:
        h = x
        for layer in layers:
            with handle.group() if fuseops_mode else contextlib.nullcontext():
                h = layer(h)
    h.float().square().mean().backward()
    return dict(handle.stats) if fuseops_mode else None


class Clock:
    """CUDA events and the allocator's peak on a GPU; the host clock on a CPU (--smoke)."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"

    def measure(self, fn):
        """``fn()``'s result, its milliseconds, its absolute peak and its peak above its
        start (bytes; None off the GPU)."""
        if not self.cuda:
            start = time.perf_counter()
            out = fn()
            return out, (time.perf_counter() - start) * 1e3, None, None
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        out = fn()
        end.record()
        end.synchronize()
        peak = torch.cuda.max_memory_allocated()
        return out, begin.elapsed_time(end), peak, peak - base


def run_mode(layers, x, clock, mode, target=None) -> dict:
    """Steps 1-6 of ``mode`` from gradients set to None."""
    for p in layers.parameters():
        p.grad = None
    rows = []
    for _ in range(STEPS):
        try:
            stats, ms, peak, above = clock.measure(lambda: step(layers, x, mode, target))
        except ValueError as error:
            # A target under the lowest peak offloading reaches: the error is the result.
            return dict(mode=mode, target=target, error=str(error), steps=rows)
        row = dict(ms=ms, peak=peak, peak_above_start=above)
        if stats is not None:
            row.update({k: stats[k] for k in ("bytes_offloaded", "bytes_for_target", "peak_bytes", "peak_where",
                                              "peak_offload_can_lower")})
        rows.append(row)
    return dict(mode=mode, target=target, steps=rows)


def largest_peak(result: dict) -> int | None:
    peaks = [r["peak"] for r in result["steps"]]
    if any(p is None for p in peaks):
        # Off the GPU: the scheduler's accounted peak stands in (none has none: everything's).
        peaks = [r.get("peak_bytes") for r in result["steps"]]
        return max(peaks) if all(p is not None for p in peaks) else None
    return max(peaks)


def pinned_bytes_per_s(device: torch.device, clock: Clock, nbytes: int) -> float:
    """A device-to-host copy into pinned memory, alone (the best of 5): the bandwidth to set
    beside the stated one (``fuseops.offload.estimate.LINK_BYTES_PER_S``)."""
    src = torch.empty(nbytes, dtype=torch.uint8, device=device)
    dst = torch.empty(nbytes, dtype=torch.uint8, pin_memory=clock.cuda)
    dst.copy_(src, non_blocking=True)
    best = min(clock.measure(lambda: dst.copy_(src, non_blocking=True))[1] for _ in range(5))
    return nbytes / (best / 1e3)


def dense_flops_per_s(results: list[dict], args) -> float:
    """The dense stack's FLOP rate without offloading (forward and backward, the median of
    steps 2-6): the compute rate to set beside the stated one (``estimate.FLOPS_PER_S``)."""
    none = next(r for r in results if r["mode"] == "none")
    times = sorted(s["ms"] for s in none["steps"][1:])
    flops = 3 * args.layers * 2 * args.tokens * 2 * args.hidden * 4 * args.hidden
    return flops / (times[len(times) // 2] / 1e3)


def run_stack(kind, args, device, dtype, clock) -> list[dict]:
    torch.manual_seed(0)
    layers = nn.ModuleList(STACKS[kind](args.hidden) for _ in range(args.layers)).to(device, dtype)
    x = torch.randn(args.tokens, args.hidden, device=device, dtype=dtype)
    mark_not_offload(x)
    # Compiles the kernels (and warms the allocator): step 1 of a mode is its own first step.
    step(layers, x, "none")
    results = {}
    for mode in ("none", "everything", "default"):
        results[mode] = run_mode(layers, x, clock, mode)
    none, everything = largest_peak(results["none"]), largest_peak(results["everything"])
    if none is None:
        # Off the GPU none has no accounted peak: the default's (it keeps more than everything).
        none = largest_peak(results["default"])
    target = (none + everything) // 2
    results["target"] = run_mode(layers, x, clock, "target", target)
    results["save_on_cpu"] = run_mode(layers, x, clock, "save_on_cpu")
    return [results[m] for m in MODES]


def report(kind: str, results: list[dict]) -> None:
    gb = 1e9
    print(f"\n{kind}: peak GB (absolute) and ms, steps 1-{STEPS}")
    head = " ".join(f"{'peak ' + str(i + 1):>7}" for i in range(STEPS)) + " " + " ".join(
        f"{'ms ' + str(i + 1):>7}" for i in range(STEPS))
    print(f"{'mode':>12} {head} {'moved GB':>9} {'for tgt':>8}  accounted peak, where, offload could lower")
    for r in results:
        if "error" in r and not r["steps"]:
            print(f"{r['mode']:>12} {r['error']}")
            continue
        steps = r["steps"]
        peaks = " ".join(f"{s['peak'] / gb:>7.2f}" if s["peak"] is not None else f"{'-':>7}" for s in steps)
        times = " ".join(f"{s['ms']:>7.1f}" for s in steps)
        last = steps[-1]
        moved = f"{last['bytes_offloaded'] / gb:>9.3f}" if "bytes_offloaded" in last else f"{'-':>9}"
        extra = f"{last['bytes_for_target'] / gb:>8.3f}" if "bytes_for_target" in last else f"{'-':>8}"
        account = (f"  {last['peak_bytes'] / gb:.2f} GB, {last['peak_where']}, {last['peak_offload_can_lower'] / gb:.2f} GB"
                   if "peak_bytes" in last else "")
        label = r["mode"] if r["target"] is None else f"target {r['target'] / gb:.2f}"
        print(f"{label:>12} {peaks} {times} {moved} {extra}{account}")
        if "error" in r:
            print(f"{'':>12} then: {r['error']}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=8192)
    parser.add_argument("--hidden", type=int, default=4096)
    parser.add_argument("--stacks", default="dense,moe")
    parser.add_argument("--smoke", action="store_true", help="CPU, float32, tiny sizes")
    parser.add_argument("--out", help="directory (default benchmarks/results; with --smoke the temp dir)")
    args = parser.parse_args(argv)
    if args.smoke:
        args.layers, args.tokens, args.hidden = 3, 512, 128
    device = torch.device("cpu" if args.smoke else "cuda")
    dtype = torch.float32 if args.smoke else torch.bfloat16
    clock = Clock(device)
    link = pinned_bytes_per_s(device, clock, (1 << 20) if args.smoke else (256 << 20))
    print(f"pinned device-to-host copy: {link / 1e9:.1f} GB/s")
    stacks, rates = {}, {"pinned_bytes_per_s": link}
    for kind in args.stacks.split(","):
        stacks[kind] = run_stack(kind, args, device, dtype, clock)
        report(kind, stacks[kind])
        if kind == "dense":
            rates["dense_flops_per_s"] = dense_flops_per_s(stacks[kind], args)
            print(f"dense stack without offloading: {rates['dense_flops_per_s'] / 1e12:.0f} TFLOP/s")
    result = dict(device=torch.cuda.get_device_name() if clock.cuda else "cpu (smoke)", torch=torch.__version__,
                  dtype=str(dtype), time=time.strftime("%Y-%m-%d %H:%M"), layers=args.layers, tokens=args.tokens,
                  hidden=args.hidden, steps=STEPS, measured_rates=rates, stacks=stacks,
                  command="python -m benchmarks.offload" + (" --smoke" if args.smoke else ""),
                  targets=dict(default_every_step_peak="<= the steady step's peak x 1.03",
                               default_moved_dense=">= 1.0 GB at <= 1.03x none's time",
                               steps_after_the_first="<= 1.5x the steady step's time",
                               target_every_step_peak="<= the target", target_time="<= 1.5x none's time"))
    out = args.out or (tempfile.gettempdir() if args.smoke else RESULTS)
    os.makedirs(out, exist_ok=True)
    path = results_path("offload", ".json", device=device.type, directory=Path(out))
    with open(path, "w") as f:
        json.dump(result, f, indent=1)
    print(f"results: {path}")


if __name__ == "__main__":
    main()
