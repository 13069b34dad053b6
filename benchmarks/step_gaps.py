"""Where the GPU waits within a training step: the idle gaps between a step's kernels, and
whether each was the host's (the next kernel's launch came after the GPU went idle) or not.

Issue 20's MoE cells at T=1024 run slower than the sum of their kernels with the host hidden
(Qwen3's composition: ~2.2 ms a step against ~1.75 of kernels and ~1.35 of enqueue): this
tells in which part of the step the GPU stands idle, between which two kernels, and what the
host was issuing then. ``torch.profiler`` over ``--steps`` steady steps (after ``--warmup``,
so recorded programs and CUDA graphs have settled), CPU and CUDA activity, no Python tracer
(it would slow the host and make every gap the host's). Per step: wall, GPU busy, idle and
the idle that waited on the host; then the gaps summed by (kernel before, kernel after), each
with the API call that launched the later kernel and the innermost torch op around it.

    python -m benchmarks.step_gaps --model moe --shape qwen3 --T 1024      # the composition
    python -m benchmarks.step_gaps --model layer --shape qwen3 --T 1024    # fuseops.moe.expert_layer
    python -m benchmarks.step_gaps --model torch --shape qwen3 --T 1024    # the plain-torch layer
    python -m benchmarks.step_gaps --model dense --cell swiglu:1024:1024
    python -m benchmarks.step_gaps --model dense --cell gelu:1024:4096 --compiled    # under torch.compile
    python -m benchmarks.step_gaps --model fp8 --fp8-shape qwen3-30b-a3b --recipe "fp8 current" --micro-batches 8
    python -m benchmarks.step_gaps --smoke                                 # CPU: the analysis on a toy trace

Each call of the functions ``--mark`` names (default ``DEFAULT_MARKS``: the routing's, the plans'
and ``expert_layer``'s autograd Functions, ``routing_graphs.call``, ``GraphedProgram.run``) shows as a host
range in the median step's listing, so a wait can be traced to the call the host was in.

``--model fp8`` profiles ``benchmarks.fp8_moe``'s optimizer step (``--micro-batches`` forward+backward
calls of the layer, ``--impl``: the quantized ``expert_layer``, the quantized composition or the bf16
layer, then the weights' in-place update), and adds the GPU time summed by the innermost torch op
that launched it (the gradient accumulation's ``aten::add_`` among them).
"""

from __future__ import annotations

import argparse
import bisect
import functools
import gc
import importlib
import inspect
import json
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile, record_function

from benchmarks.sizes import MOE_SHAPES, FuseopsExpertLayer, FuseopsMoE, TorchMoE, dense_cell, moe_args

# A gap shorter than this is launch spacing, not a wait worth naming.
MIN_GAP_US = 2.0
# A host CUDA call this long is listed (a launch takes a few us; a sync or an allocation more).
SLOW_API_US = 50.0
STEP_RANGE = "step_gaps.step"
PHASES = ("step_gaps.forward", "step_gaps.backward")
# Host ranges named in the trace (``--mark module:attr``), each call of the function inside one.
MARK = "mark:"
# Named by default: the calls a step of the MoE composition, expert_layer or the dense stack makes.
DEFAULT_MARKS = (
    "fuseops.moe.routing:_Permute.forward", "fuseops.moe.routing:_Permute.backward",
    "fuseops.moe.routing:_Unpermute.forward", "fuseops.moe.routing:_Unpermute.backward",
    "fuseops.ops.executor.function:PlanFunction.forward", "fuseops.ops.executor.function:PlanFunction.backward",
    "fuseops.moe.expert_layer:_ExpertLayer.forward", "fuseops.moe.expert_layer:_ExpertLayer.backward",
    "fuseops.moe.routing_graphs:call", "fuseops.ops.executor.graphed:GraphedProgram.run",
)


def _is_range(name: str) -> bool:
    return name == STEP_RANGE or name in PHASES or name.startswith(MARK)


def mark(spec: str) -> None:
    """Run every call of ``module:attr`` (``attr`` may be ``Class.method``, a static method of
    an autograd Function too) inside a ``record_function`` range named ``mark:attr``."""
    module_name, attr = spec.split(":")
    *path, name = attr.split(".")
    owner = functools.reduce(getattr, path, importlib.import_module(module_name))
    fn = getattr(owner, name)
    static = isinstance(inspect.getattr_static(owner, name), staticmethod)

    @functools.wraps(fn)
    def marked(*args, **kwargs):
        with record_function(MARK + attr):
            return fn(*args, **kwargs)
    setattr(owner, name, staticmethod(marked) if static else marked)


@dataclass(frozen=True)
class Activity:
    """A GPU activity (kernel, copy, set) and how it was launched."""

    name: str
    start: float  # us
    end: float
    # The launching API call's start on the host (None: not found), its name and the
    # innermost torch op around it.
    launched: float | None
    api: str
    op: str
    # The launching call's correlation id (a graph launch's kernels share one).
    launch_id: int = 0


def _short(name: str, width: int = 48) -> str:
    return name if len(name) <= width else name[:width - 3] + "..."


def gaps(activities: Sequence[Activity], step_start: float, step_end: float) -> dict:
    """One step's GPU busy time, its idle gaps, and the idle that waited on the host."""
    acts = sorted((a for a in activities if a.end > step_start and a.start < step_end), key=lambda a: a.start)
    busy = idle = host_idle = 0.0
    found: list[tuple[str, str, float, float, str, str]] = []
    frontier = step_start
    before = "(step start)"
    for a in acts:
        if a.start > frontier:
            gap = a.start - frontier
            idle += gap
            # The host's wait: the part of the gap before the launch was issued.
            waited = min(gap, max(0.0, a.launched - frontier)) if a.launched is not None else 0.0
            host_idle += waited
            if gap >= MIN_GAP_US:
                found.append((before, a.name, gap, waited, a.api, a.op))
        busy += max(0.0, a.end - max(a.start, frontier))
        if a.end > frontier:
            frontier = a.end
            before = a.name
    tail = max(0.0, step_end - frontier)
    return {"wall_us": step_end - step_start, "busy_us": busy, "idle_us": idle + tail, "host_idle_us": host_idle,
            "tail_us": tail, "gaps": found}


def timeline(activities: Sequence[Activity], step_start: float, step_end: float) -> list[dict]:
    """One step as launches: per launching call (a graph launch is one), when the host issued it
    and when its GPU work ran, microseconds from the step's start."""
    acts = sorted((a for a in activities if a.end > step_start and a.start < step_end), key=lambda a: a.start)
    rows: list[dict] = []
    for a in acts:
        if rows and a.launch_id and rows[-1]["launch_id"] == a.launch_id:
            rows[-1]["gpu_end"] = max(rows[-1]["gpu_end"], a.end - step_start)
            rows[-1]["kernels"] += 1
            continue
        rows.append({"launch_id": a.launch_id, "host": None if a.launched is None else a.launched - step_start,
                     "gpu_start": a.start - step_start, "gpu_end": a.end - step_start, "api": a.api, "op": a.op,
                     "first": a.name, "kernels": 1})
    return rows


def busy_by_op(activities: Sequence[Activity], ranges: Sequence[tuple[float, float]], steps: int) -> list[tuple[str, float]]:
    """GPU time per step (``steps`` of them in ``ranges``) summed by the innermost torch op that
    launched it, longest first."""
    total: dict[str, float] = defaultdict(float)
    for a in activities:
        if any(a.start < end and a.end > start for start, end in ranges):
            total[a.op or a.api or "(unknown)"] += (a.end - a.start) / steps
    return sorted(total.items(), key=lambda kv: -kv[1])


def per_step(summary: dict, n: int) -> dict:
    """A summary of ``n`` steps taken as one window, per step."""
    out = {**summary, "steps": n}
    for k in ("wall_us", "busy_us", "idle_us", "host_idle_us", "tail_us"):
        out[k] = summary[k] / n
    out["gaps"] = [{**g, "us_per_step": g["us_per_step"] / n, "host_us_per_step": g["host_us_per_step"] / n}
                   for g in summary["gaps"]]
    return out


def slow_calls(calls: Sequence[tuple[str, str, float]], n: int, top: int) -> list[dict]:
    """The slow host CUDA calls summed by (call, op), per step, longest first."""
    total: dict[tuple[str, str], list[float]] = defaultdict(lambda: [0.0, 0])
    for name, op, us in calls:
        total[name, op][0] += us / n
        total[name, op][1] += 1
    ranked = sorted(total.items(), key=lambda kv: -kv[1][0])[:top]
    return [{"call": name, "op": op, "us_per_step": v[0], "count": v[1]} for (name, op), v in ranked]


def summarize(steps: list[dict], top: int) -> dict:
    """Means over the steps, and the gaps summed by (before, after) per step."""
    n = len(steps)
    by_pair: dict[tuple[str, str], list[float]] = defaultdict(lambda: [0.0, 0.0, 0, "", ""])
    for s in steps:
        for before, after, gap, waited, api, op in s["gaps"]:
            entry = by_pair[before, after]
            entry[0] += gap / n
            entry[1] += waited / n
            entry[2] += 1
            entry[3], entry[4] = api, op
    ranked = sorted(by_pair.items(), key=lambda kv: -kv[1][0])[:top]
    return {
        "steps": n,
        **{k: sum(s[k] for s in steps) / n for k in ("wall_us", "busy_us", "idle_us", "host_idle_us", "tail_us")},
        "gaps": [{"before": b, "after": a, "us_per_step": v[0], "host_us_per_step": v[1], "count": v[2],
                  "launch": v[3], "op": v[4]} for (b, a), v in ranked],
    }


def activities_of(prof) -> tuple[list[Activity], list[tuple[float, float]], list[tuple[float, float, str]],
                                 list[tuple[str, str, float]]]:
    """The trace's GPU activities with their launches, the steps' host ranges, the phases'
    (forward, backward; us) and the host's CUDA API calls of ``SLOW_API_US`` or more (name, the
    innermost torch op around it, us) within the steps: a synchronising call or an allocation
    shows there."""
    events = list(prof.profiler.kineto_results.events())
    host = [e for e in events if e.device_type() == torch.autograd.DeviceType.CPU]
    api = {e.correlation_id(): e for e in host if e.correlation_id() and (e.name().startswith("cu"))}
    ops = sorted([e for e in host if not e.name().startswith("cu") and e.duration_ns() > 0 and not _is_range(e.name())],
                 key=lambda e: e.start_ns())
    starts = [o.start_ns() for o in ops]
    steps = sorted((e.start_ns() / 1e3, e.end_ns() / 1e3) for e in host if e.name() == STEP_RANGE)
    phases = sorted((e.start_ns() / 1e3, e.end_ns() / 1e3, e.name()) for e in host
                    if e.name() in PHASES or e.name().startswith(MARK))
    slow = [(e.name(), _innermost(ops, starts, e), e.duration_ns() / 1e3) for e in host
            if e.name().startswith("cu") and e.duration_ns() >= SLOW_API_US * 1e3
            and any(a <= e.start_ns() / 1e3 <= b for a, b in steps)]
    # A drained step's closing torch.cuda.synchronize() is ours, not the step's.
    slow = [c for c in slow if (c[0], c[1]) != ("cudaDeviceSynchronize", "")]
    out = []
    for e in events:
        # (record_function's ranges show on the GPU's timeline too: not work.)
        if e.device_type() != torch.autograd.DeviceType.CUDA or e.is_user_annotation() or _is_range(e.name()):
            continue
        launch = api.get(e.correlation_id()) or api.get(e.linked_correlation_id())
        launched = launch.start_ns() / 1e3 if launch is not None else None
        op = _innermost(ops, starts, launch) if launch is not None else ""
        out.append(Activity(e.name(), e.start_ns() / 1e3, e.end_ns() / 1e3, launched,
                            launch.name() if launch is not None else "", op,
                            launch.correlation_id() if launch is not None else 0))
    return out, steps, phases, slow


def _innermost(ops: list, starts: list[int], call) -> str:
    """The innermost op around a host call: of those covering it, the latest to start."""
    t = call.start_ns()
    for k in range(bisect.bisect_right(starts, t) - 1, -1, -1):
        o = ops[k]
        if o.end_ns() >= t and o.start_thread_id() == call.start_thread_id():
            return o.name()
    return ""


def mark_gc() -> None:
    """Python's garbage collections as host ranges (``mark:gc``)."""
    open_ranges = []

    def on_gc(phase: str, info: dict) -> None:
        if phase == "start":
            open_ranges.append(record_function(MARK + "gc"))
            open_ranges[-1].__enter__()
        elif open_ranges:
            open_ranges.pop().__exit__(None, None, None)
    gc.callbacks.append(on_gc)


def profile_steps(step: Callable[[], None], warmup: int, steps: int, drain: bool = True) -> tuple:
    """``steps`` steps under the profiler. ``drain``: each starts with the GPU drained, as a
    step after an optimizer's sync would; else they run back to back, as a sustained loop times
    them (benchmarks._timing.sustained_ms), and the GPU's waits are the host's alone."""
    for _ in range(warmup):
        step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            if drain:
                torch.cuda.synchronize()
            with record_function(STEP_RANGE):
                step()
                if drain:
                    torch.cuda.synchronize()
        torch.cuda.synchronize()
    return activities_of(prof)


def build(args) -> Callable[[], None]:
    device, dtype = "cuda", torch.bfloat16
    if args.model == "fp8":
        return _fp8_step(args)
    if args.model == "dense":
        model, reference, x = dense_cell(args.cell)
        m, inputs = (reference if args.torch else model), (x,)
    else:
        E, H, I, K = MOE_SHAPES[args.shape]
        torch.manual_seed(0)
        mine = FuseopsMoE(E, H, I).to(device, dtype)
        m = {"moe": mine, "layer": FuseopsExpertLayer(mine), "torch": TorchMoE(mine).to(device, dtype)}[args.model]
        inputs = moe_args(args.T, E, H, K, args.skewed, device, dtype)
    params = list(m.parameters())
    if args.compiled:
        m = torch.compile(m)

    def step() -> None:
        # benchmarks.sizes' step_fn, its phases named on the host's timeline.
        for p in params:
            p.grad = None
        with record_function(PHASES[0]):
            y = m(*inputs)
        with record_function(PHASES[1]):
            y.sum().backward()
    return step


def _fp8_step(args) -> Callable[[], None]:
    """``benchmarks.fp8_moe``'s optimizer step of ``args.micro_batches`` micro-batches."""
    from benchmarks import fp8_moe
    from benchmarks.moe_layer import SHAPES, composed_layer, fuseops_layer, make_case, quantized

    shape = dict(SHAPES[args.fp8_shape])
    if args.fp8_tokens:
        shape["T"] = args.fp8_tokens
    case = make_case(**shape)
    layer = composed_layer(case) if args.impl == "composed" else fuseops_layer(case)
    if args.impl != "bf16":
        layer = quantized(layer, fp8_moe.RECIPES[args.recipe])
    optimizer_step = fp8_moe.optimizer_step(case, layer, args.micro_batches)

    def step() -> None:
        with record_function(PHASES[0]):
            optimizer_step()
    return step


def report(summary: dict, label: str) -> None:
    print(f"{label}: wall {summary['wall_us']:.0f} us a step, GPU busy {summary['busy_us']:.0f}, idle "
          f"{summary['idle_us']:.0f} (waiting on the host {summary['host_idle_us']:.0f}, after the last kernel "
          f"{summary['tail_us']:.0f})")
    for name, a, b in summary.get("phases", ()):
        print(f"  host {name}: {a:.0f} to {b:.0f} us ({b - a:.0f})")
    for c in summary.get("slow_api_calls", ()):
        print(f"  slow host call: {c['call']} in {c['op'] or '-'}: {c['us_per_step']:.0f} us a step ({c['count']} calls)")
    if summary.get("by_op"):
        print("  GPU time a step by launching op: " + ", ".join(f"{op} {us:.0f} us" for op, us in summary["by_op"]))
    if summary.get("timeline"):
        print(f"  the median step's launches: {'host':>7} {'gpu':>7} {'to':>7}  kernels  launch / op / first")
        for r in summary["timeline"]:
            host = f"{r['host']:7.0f}" if r["host"] is not None else "      -"
            print(f"  {'':27} {host} {r['gpu_start']:7.0f} {r['gpu_end']:7.0f}  {r['kernels']:7d}  {r['api']} / "
                  f"{r['op']} / {_short(r['first'], 40)}")
    print(f"  {'us/step':>8} {'host':>6} {'n':>4}  {'before':48} {'after':48} launch / op")
    for g in summary["gaps"]:
        print(f"  {g['us_per_step']:8.1f} {g['host_us_per_step']:6.1f} {g['count']:4d}  {_short(g['before']):48} "
              f"{_short(g['after']):48} {g['launch']} / {g['op']}")


def smoke() -> None:
    """The analysis on a made-up step: two kernels, a host-late gap and a latency gap."""
    acts = [Activity("a", 10, 20, 5, "cudaLaunchKernel", "aten::mm"),
            Activity("b", 50, 60, 45, "cuLaunchKernelEx", ""),      # idle 30 us, 25 of them the host's
            Activity("c", 70, 80, 40, "cudaGraphLaunch", "")]       # idle 10 us, launched long before
    s = summarize([gaps(acts, 0, 100)], top=5)
    assert abs(s["busy_us"] - 30) < 1e-9 and abs(s["idle_us"] - 70) < 1e-9, s
    assert abs(s["host_idle_us"] - (5 + 25)) < 1e-9, s
    assert [(g["before"], g["after"]) for g in s["gaps"]] == [("a", "b"), ("(step start)", "a"), ("b", "c")], s
    assert [g["host_us_per_step"] for g in s["gaps"]] == [25, 5, 0], s
    assert busy_by_op(acts, [(0, 100)], 1) == [("aten::mm", 10), ("cuLaunchKernelEx", 10), ("cudaGraphLaunch", 10)]
    assert per_step(s, 2)["busy_us"] == 15 and per_step(s, 2)["gaps"][0]["us_per_step"] == 15
    assert slow_calls([("cudaFree", "aten::empty", 100.0)], 2, 5) == [
        {"call": "cudaFree", "op": "aten::empty", "us_per_step": 50.0, "count": 1}]
    s["timeline"] = timeline(acts, 0, 100)
    assert [(r["host"], r["gpu_start"], r["api"]) for r in s["timeline"]] == [
        (5, 10, "cudaLaunchKernel"), (45, 50, "cuLaunchKernelEx"), (40, 70, "cudaGraphLaunch")], s["timeline"]
    report(s, "smoke")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", choices=("moe", "layer", "torch", "dense", "fp8"), default="moe")
    parser.add_argument("--shape", choices=list(MOE_SHAPES), default="qwen3")
    parser.add_argument("--T", type=int, default=1024)
    parser.add_argument("--skewed", action="store_true")
    parser.add_argument("--cell", default="swiglu:1024:1024", help="dense: act:T:H")
    parser.add_argument("--torch", action="store_true", help="dense: the torch.nn model")
    parser.add_argument("--fp8-shape", choices=("qwen3-30b-a3b", "mixtral-8x7b"), default="qwen3-30b-a3b")
    parser.add_argument("--fp8-tokens", type=int, default=None, help="fp8: tokens a micro-batch (default: the shape's)")
    parser.add_argument("--recipe", default="fp8 current", help="fp8: a recipe of benchmarks.fp8_moe.RECIPES")
    parser.add_argument("--impl", choices=("layer", "composed", "bf16"), default="layer",
                        help="fp8: the quantized expert_layer, the quantized composition, or the bf16 layer")
    parser.add_argument("--micro-batches", type=int, default=8)
    parser.add_argument("--warmup", type=int, default=60)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--top", type=int, default=12)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--mark", nargs="*", default=None,
                        help="module:attr functions whose calls are named on the host's timeline (default: "
                             "DEFAULT_MARKS; none: --mark with no value)")
    parser.add_argument("--no-drain", action="store_true",
                        help="steps back to back (as a sustained loop), not each from a drained GPU")
    parser.add_argument("--gc", action="store_true", help="name Python's garbage collections on the host's timeline")
    parser.add_argument("--compiled", action="store_true",
                        help="dense, moe, layer, torch: the model under torch.compile (compiled in the warm-up)")
    parser.add_argument("--smoke", action="store_true")
    args = parser.parse_args()
    for spec in DEFAULT_MARKS if args.mark is None else args.mark:
        mark(spec)
    if args.smoke:
        smoke()
        return
    if args.gc:
        mark_gc()
    acts, steps, phases, slow = profile_steps(build(args), args.warmup, args.steps, drain=not args.no_drain)
    if args.no_drain:
        # Back to back, a step's host range and its GPU work do not line up: the whole window,
        # per step.
        window = (min(a.start for a in acts), max(a.end for a in acts))
        summary = per_step(summarize([gaps(acts, *window)], args.top), len(steps))
        start, end = window
    else:
        window = None
        summary = summarize([gaps(acts, a, b) for a, b in steps], args.top)
        # The median step's launches, in order, and its phases on the host.
        walls = sorted(range(len(steps)), key=lambda k: steps[k][1] - steps[k][0])
        start, end = steps[walls[len(walls) // 2]]
    summary["slow_api_calls"] = slow_calls(slow, len(steps), args.top)
    summary["timeline"] = timeline(acts, start, end)
    summary["phases"] = [(name, a - start, b - start) for a, b, name in phases if start <= a <= end]
    summary["by_op"] = busy_by_op(acts, [window] if args.no_drain else steps, len(steps))[:args.top]
    if args.model == "dense":
        label = f"{args.model} {args.cell}{' torch' if args.torch else ''}"
    elif args.model == "fp8":
        tokens = f" T={args.fp8_tokens}" if args.fp8_tokens else ""
        label = f"{args.impl} {args.recipe if args.impl != 'bf16' else ''} {args.fp8_shape}{tokens} x{args.micro_batches}"
        # A step of many micro-batches launches hundreds of kernels: the JSON keeps the listing.
        summary["phases"] = [p for p in summary["phases"] if not p[0].startswith(MARK)]
        printed = {k: v for k, v in summary.items() if k != "timeline"}
    else:
        label = f"{args.model} {args.shape} T={args.T} {'skewed' if args.skewed else 'uniform'}"
    if args.compiled and args.model != "fp8":
        label += " compiled"
    report(printed if args.model == "fp8" else summary, label)
    if args.out:
        args.out.write_text(json.dumps({"label": label, **summary}, indent=1))


if __name__ == "__main__":
    main()
