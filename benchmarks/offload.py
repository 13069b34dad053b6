"""Activation offload: the memory/overhead curve of three stacks, bf16 on CUDA.

    python -m benchmarks.offload [--out DIR] [--layers 8] [--tokens 8192] [--hidden 4096]
    python -m benchmarks.offload --smoke      # CPU, tiny: runs end to end (writes under the temp dir)

Stacks (one offload group per layer, keep_last=1, the input marked not to offload):
``mlp`` (pre-norm LayerNorm + GELU MLP, 4x), ``attn`` (pre-norm causal attention, heads
of 128, then the MLP) and ``moe`` (top-2 router, ``fuseops.moe.permute``, a grouped
SwiGLU MLP over 8 experts, ``unpermute``). Per stack, one training step (forward,
squared-mean loss, backward) is timed (CUDA events, median of --steps after warm-up)
and its peak measured (max_memory_allocated above the step's start) for budgets from
nothing to everything: no offload, int budgets at fractions of the largest group's
saved bytes, ``"auto"`` (the default; marked) and ``None`` (everything moves).
Gradients are kept allocated and zeroed in place, as in training with gradient
buffers, so that the peak is that of activations: with ``set_to_none`` the weight
gradients alive at the end of backward set a floor under the peak that offloading
cannot lower.

Beside each point: the link-bound floor, ``max(fwd, bytes/bw) + max(bwd, bytes/bw)``
with fwd/bwd the compute of the step without offload and bw the pinned bandwidth
measured once here (a 256 MB device-to-host copy, alone); "saved/moved", the peak saved
over the bytes moved; and moved over what the link hides (the forward of every group but
the kept one, times a bandwidth), twice: "mv/hide" at that standalone bandwidth and
"mv/h ach" at the bandwidth the planner counts on after the auto
point's steps (``Planner.achieved_bytes_per_s``: the link's own copies as measured in
the run, beside compute, times the efficiency that planned steps' waits on the link
calibrated; "ach GB/s" in the header). The second is the model "auto" plans with, so
its target (>= 0.9) is read there. Writes ``offload-<gpu>-<date>.json`` and ``.png`` under --out
(default ``benchmarks/results``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

import fuseops
from benchmarks._results import PEAK_CONVENTION, RESULTS, pyplot, results_path
from fuseops import ops
from fuseops.offload import mark_not_offload, offload_activations
from fuseops.offload.planner import planner_for

FRACTIONS = (0.1, 0.25, 0.5, 0.75)


class Layer(nn.Module):
    """Pre-norm causal attention then a pre-norm GELU MLP, both residual."""

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


class MLPLayer(nn.Module):
    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.norm, self.fc1, self.fc2 = nn.LayerNorm(hidden), nn.Linear(hidden, 4 * hidden), nn.Linear(4 * hidden, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(F.gelu(self.fc1(self.norm(x)), approximate="tanh"))


class MoELayer(nn.Module):
    """``x + unpermute(experts(permute(x)), probs)``, top-k of a softmax router."""

    def __init__(self, hidden: int, experts: int = 8, top_k: int = 2) -> None:
        super().__init__()
        ffn = hidden * 11 // 16
        self.router = nn.Linear(hidden, experts, bias=False)
        self.experts = fuseops.Sequential(
            ops.GroupedLinear(experts, hidden, 2 * ffn), ops.SwiGLU(), ops.GroupedLinear(experts, ffn, hidden))
        self.num_experts, self.top_k = experts, top_k

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, h = x.shape
        rows = x.reshape(b * s, h)
        probs, ids = self.router(rows).float().softmax(-1).topk(self.top_k, dim=-1)
        x_sorted, splits, row_map = fuseops.moe.permute(rows, ids, self.num_experts)
        y = self.experts(x_sorted, splits, splits)
        return x + fuseops.moe.unpermute(y, row_map, probs.to(x.dtype)).view(b, s, h)


STACKS = {"mlp": MLPLayer, "attn": Layer, "moe": MoELayer}


def scheme_context(name: str, budget: int | str | None):
    """``none``; ``fuseops`` with ``budget`` (an int, "auto" or None); ``fuseops_all``
    (everything moves); ``save_on_cpu`` (torch's, pinned)."""
    if name == "fuseops":
        return offload_activations(keep_last=1, group_budget_bytes=budget)
    if name == "fuseops_all":
        return offload_activations(keep_last=1, group_budget_bytes=None)
    if name == "save_on_cpu":
        return torch.autograd.graph.save_on_cpu(pin_memory=torch.cuda.is_available())
    return contextlib.nullcontext()


def step(layers: nn.ModuleList, x: torch.Tensor, name: str, budget: int | str | None):
    """One training step, gradients zeroed in place; returns the offload stats (or None)."""
    for p in layers.parameters():
        if p.grad is not None:
            p.grad.zero_()
    with scheme_context(name, budget) as handle:
        h = x
        for layer in layers:
            with handle.group() if name.startswith("fuseops") else contextlib.nullcontext():
                h = layer(h)
    h.float().square().mean().backward()
    return dict(handle.stats) if name.startswith("fuseops") else None


class Clock:
    """CUDA events on a GPU, the host clock on CPU (--smoke)."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()

    def time_ms(self, fn) -> float:
        return self.times_ms(fn)[0]

    def times_ms(self, fn) -> tuple[float, float]:
        """The step's device time and its host time (``fn`` from call to return, before the
        sync: what the host takes to queue the step; a step whose host time is close to its
        device time is bound by the host, and host work added there costs time 1:1)."""
        self.sync()
        if not self.cuda:
            start = time.perf_counter()
            fn()
            ms = (time.perf_counter() - start) * 1e3
            return ms, ms
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        host = time.perf_counter()
        fn()
        host = time.perf_counter() - host
        end.record()
        end.synchronize()
        return start.elapsed_time(end), host * 1e3


def pinned_bytes_per_s(device: torch.device, clock: Clock, nbytes: int) -> float:
    src = torch.empty(nbytes, dtype=torch.uint8, device=device)
    dst = torch.empty(nbytes, dtype=torch.uint8, pin_memory=clock.cuda)
    dst.copy_(src, non_blocking=True)
    return nbytes / (min(clock.time_ms(lambda: dst.copy_(src, non_blocking=True)) for _ in range(5)) / 1e3)


def compute_ms(layers, x, clock, steps):
    """Forward and backward of the step without offload, separately (medians)."""
    fwd, bwd = [], []
    for _ in range(steps):
        out = []
        fwd.append(clock.time_ms(lambda: out.append(_forward(layers, x))))
        bwd.append(clock.time_ms(out[0].backward))
    return statistics.median(fwd), statistics.median(bwd)


def _forward(layers, x):
    h = x
    for layer in layers:
        h = layer(h)
    return h.float().square().mean()


def _plan_state(device):
    planner = planner_for(device)
    profile = planner.profile
    return (profile.layout if profile else None, profile is not None and profile.steps >= planner.learn_steps,
            dict(planner.planned), planner.efficiency)


def record_calibrations(planner) -> list[dict]:
    """Every planned step the planner digests from now on: the seconds its compute waited on
    the link, the bytes it moved and the link efficiency before and after (``_calibrate``
    cuts it where a wait exceeds its tolerance): which step cut the auto point's plan."""
    seen: list[dict] = []
    calibrate = planner._calibrate

    def recording(log, stalled):
        before = planner.efficiency
        calibrate(log, stalled)
        seen.append(dict(stalled_ms=round(stalled * 1e3, 3), moved_mb=round(log.moved / 1e6, 1),
                         efficiency=(round(before, 3), round(planner.efficiency, 3))))

    planner._calibrate = recording
    return seen


def measure(layers, x, clock, budget, steps, warm_up, settle_max=12, retime_max=2):
    """Steps after ``warm_up`` (each synchronised, as a training loop reading its loss:
    "auto" learns from events once passed); for "auto", more until its plan has settled
    (budgets and link efficiency unchanged over a step, at most ``settle_max`` more), so
    the timed steps are planned ones, not the learning or calibrating ones; timed again
    (at most ``retime_max`` times) where the plan changed while they ran."""
    name = "none" if budget == "none" else "fuseops"
    planner = planner_for(x.device)
    calibrations = record_calibrations(planner) if budget == "auto" else None
    warmed = 0
    for _ in range(warm_up):
        step(layers, x, name, budget)
        clock.sync()
        warmed += 1
    if budget == "auto":
        before = _plan_state(x.device)
        for _ in range(settle_max):
            step(layers, x, name, budget)
            clock.sync()
            warmed += 1
            after = _plan_state(x.device)
            if after == before and after[1]:
                break
            before = after
    timed = [clock.times_ms(lambda: step(layers, x, name, budget)) for _ in range(steps)]
    settled = budget != "auto" or _plan_state(x.device) == before
    for _ in range(retime_max if budget == "auto" else 0):
        if settled:
            break
        # The plan changed under the timed steps (a wait on the link cut the efficiency):
        # time the plan it settled on, not a mix of two.
        before = _plan_state(x.device)
        timed = [clock.times_ms(lambda: step(layers, x, name, budget)) for _ in range(steps)]
        settled = _plan_state(x.device) == before
    times, host = [t for t, _ in timed], [h for _, h in timed]
    clock.sync()
    peak, stats = peak_step(layers, x, name, budget, clock)
    if calibrations is not None:
        del planner._calibrate
    return dict(budget=budget, auto=budget == "auto", step_ms=statistics.median(times), peak_gb=peak,
                host_ms=statistics.median(host), warm_up_steps=warmed, plan_settled=settled,
                stall_ms=planner.last_stall_s * 1e3 if budget == "auto" else None,
                bytes_offloaded=stats["bytes_offloaded"] if stats else 0, stats=stats,
                calibrations=[c for c in calibrations or () if c["moved_mb"] > 0])


def peak_step(layers, x, name, budget, clock):
    """One step's peak above its start (GB; None off the GPU) and its offload stats; the step
    allocates its gradient buffers, as a first step does (``PEAK_CONVENTION``)."""
    for p in layers.parameters():
        p.grad = None
    clock.sync()
    base = None
    if clock.cuda:
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    stats = step(layers, x, name, budget)
    clock.sync()
    return (None if base is None else (torch.cuda.max_memory_allocated() - base) / 1e9), stats


def interleaved(layers, x, clock, steps, rounds):
    """The default ("auto") and the hooks alone (budget 0) against no offload in interleaved
    rounds, each the median of ``steps`` steps, the fastest round of each: the curve
    measures its points one after the other, and clock or thermal drift between two of
    them moves ratios by up to +-4 % on an H100 (the hooks alone read 1.072x and a budget
    moving nothing 0.990x in one run of the moe stack). The hooks' point splits auto's
    overhead into what the hooks cost with nothing moved and what moving adds."""
    points = (("none", "none", None), ("hooks", "fuseops", 0), ("auto", "fuseops", "auto"))
    best = {key: float("inf") for key, _, _ in points}
    for _ in range(rounds):
        for key, name, budget in points:
            times = [clock.time_ms(lambda: step(layers, x, name, budget)) for _ in range(steps)]
            best[key] = min(best[key], statistics.median(times))
    return dict(none_ms=best["none"], hooks_ms=best["hooks"], auto_ms=best["auto"], rounds=rounds,
                ratio=best["auto"] / best["none"], hooks_ratio=best["hooks"] / best["none"])


def curve(kind, args, device, dtype, clock, bytes_per_s):
    torch.manual_seed(0)
    layers = nn.ModuleList(STACKS[kind](args.hidden) for _ in range(args.layers)).to(device, dtype)
    x = torch.randn(1, args.tokens, args.hidden, device=device, dtype=dtype)
    mark_not_offload(x)
    fwd_ms, bwd_ms = compute_ms(layers, x, clock, args.steps)
    everything = measure(layers, x, clock, None, args.steps, args.warm_up)
    group = everything["bytes_offloaded"] / max(1, args.layers - 1)
    # 0: the hooks alone (groups that can move nothing pass their tensors through), then
    # the record path at budgets that move little, some, most of a group.
    budgets = ["none", 0] + [int(f * group) for f in FRACTIONS] + ["auto", None]
    points, achieved = [], None
    for b in budgets:
        points.append(everything if b is None else measure(layers, x, clock, b, args.steps, args.warm_up))
        if b == "auto":
            planner = planner_for(device)
            achieved, efficiency = planner.achieved_bytes_per_s(), planner.efficiency
            # Per group, what auto planned (MiB), at the bandwidth it counts on: to set
            # against tests/offload/_device_sim.py's plans for the same stack.
            points[-1]["planned_mib"] = {pos: round(n / 2**20, 1) for pos, n in sorted(planner.planned.items())}
            # And what the last planned step the planner digested moved of it, per group.
            points[-1]["moved_mib"] = {pos: round(n / 2**20, 1) for pos, n in planner.last_moved.items()}
            # The profile the plan came from (the planner's inputs: to rerun its planning offline).
            prof = planner.profile
            if prof is not None:
                points[-1]["profile"] = {
                    "forward_ms": [round(t * 1e3, 3) for t in prof.forward],
                    "backward_ms": [None if t is None else round(t * 1e3, 3) for t in prof.backward],
                    "first_reload": [(pos, round(t * 1e3, 3)) for pos, t in prof.first_reload],
                    "sizes_mib": [[round(n / 2**20, 1) for n in g] for g in prof.sizes],
                    # Where each of those storages was saved, ms from its group's start.
                    "ready_ms": [[round(t * 1e3, 3) for t in g] for g in prof.ready],
                    "rate_gbps": planner._planning_bytes_per_s() * planner.margin / 1e9}
    base = points[0]
    for p in points:
        link_ms = p["bytes_offloaded"] / bytes_per_s * 1e3
        p["floor_ms"] = max(fwd_ms, link_ms) + max(bwd_ms, link_ms)
        p["over_floor"] = p["step_ms"] / p["floor_ms"]
        p["time_ratio"] = p["step_ms"] / base["step_ms"]
        saved = base["peak_gb"] - p["peak_gb"] if base["peak_gb"] is not None else None
        p["peak_saved_gb"] = saved
        p["saved_over_moved"] = saved / (p["bytes_offloaded"] / 1e9) if saved is not None and p["bytes_offloaded"] else None
        # What the link hides: the forward of every group but the kept one, at bw.
        p["hideable_gb"] = fwd_ms / 1e3 * (args.layers - 1) / args.layers * bytes_per_s / 1e9
        p["moved_over_hideable"] = p["bytes_offloaded"] / 1e9 / p["hideable_gb"]
        p["moved_over_hideable_achieved"] = p["moved_over_hideable"] * bytes_per_s / achieved
    # The auto plan has settled above: these steps are planned ones.
    paired = interleaved(layers, x, clock, args.steps, args.rounds)
    return dict(forward_ms=fwd_ms, backward_ms=bwd_ms, points=points, achieved_bytes_per_s=achieved,
                link_efficiency=efficiency, auto_interleaved=paired)


def report(kind, result):
    print(f"\n{kind}: forward {result['forward_ms']:.2f} ms, backward {result['backward_ms']:.2f} ms, "
          f"ach {result['achieved_bytes_per_s'] / 1e9:.1f} GB/s (efficiency {result['link_efficiency']:.3f})")
    print(f"{'budget':>12} {'step ms':>8} {'x none':>7} {'host ms':>8} {'peak GB':>8} {'moved GB':>9} {'mv/hide':>8} "
          f"{'mv/h ach':>8} {'saved/mv':>9} {'floor ms':>9} {'x floor':>8}")
    for p in result["points"]:
        label = ("* auto" if p["auto"] else "all" if p["budget"] is None else "0 hooks" if p["budget"] == 0
                 else str(p["budget"]))
        peak = f"{p['peak_gb']:.2f}" if p["peak_gb"] is not None else "-"
        ratio = f"{p['saved_over_moved']:.3f}" if p["saved_over_moved"] is not None else "-"
        print(f"{label:>12} {p['step_ms']:>8.1f} {p['time_ratio']:>7.3f} {p['host_ms']:>8.1f} {peak:>8} "
              f"{p['bytes_offloaded'] / 1e9:>9.3f} {p['moved_over_hideable']:>8.2f} {p['moved_over_hideable_achieved']:>8.2f} "
              f"{ratio:>9} {p['floor_ms']:>9.1f} {p['over_floor']:>8.3f}")
    auto = next(p for p in result["points"] if p["auto"])
    print(f"  auto: {auto['warm_up_steps']} steps before timing, plan settled {auto['plan_settled']}, "
          f"compute waited on the link {auto['stall_ms']:.2f} ms in the last planned step read")
    print(f"  auto planned (MiB by group) {auto.get('planned_mib')} at {result['achieved_bytes_per_s'] / 1e9:.1f} GB/s")
    print(f"  auto profile {auto.get('profile')}")
    print(f"  auto moved (MiB by group, the last planned step digested) {auto.get('moved_mib')}")
    print(f"  auto's planned steps digested (compute's wait on the link, moved, efficiency before/after): "
          f"{auto['calibrations']}")
    paired = result["auto_interleaved"]
    print(f"  auto against none in {paired['rounds']} interleaved rounds: {paired['auto_ms']:.1f} / "
          f"{paired['none_ms']:.1f} ms = {paired['ratio']:.3f}x (the hooks alone: {paired['hooks_ms']:.1f} ms = "
          f"{paired['hooks_ratio']:.3f}x)")


def plot(result, path):
    plt = pyplot()
    if plt is None:
        return
    stacks = result["stacks"]
    fig, axes = plt.subplots(1, len(stacks), figsize=(5 * len(stacks), 4.2), squeeze=False)
    for ax, (kind, r) in zip(axes[0], stacks.items()):
        pts = r["points"]
        moved = [p["bytes_offloaded"] / 1e9 for p in pts]
        ax.plot(moved, [p["step_ms"] for p in pts], "o-", label="step")
        ax.plot(moved, [p["floor_ms"] for p in pts], "k--", label="link-bound floor")
        auto = [(m, p["step_ms"]) for m, p in zip(moved, pts) if p["auto"]]
        ax.plot(*zip(*auto), "r*", markersize=14, label="auto (default)")
        ax.set_xlabel("offloaded (GB)")
        ax.set_ylabel("step (ms)")
        if pts[0]["peak_gb"] is not None:
            twin = ax.twinx()
            twin.plot(moved, [p["peak_gb"] for p in pts], "s:", color="tab:green", label="peak")
            twin.set_ylabel("peak above start (GB)")
        ax.set_title(kind)
        ax.legend(loc="upper left", fontsize=8)
    fig.suptitle(f"{result['layers']} layers, H={result['hidden']}, {result['tokens']} tokens, {result['device']}")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def stack_arguments(description: str, steps: int, stacks: str) -> argparse.ArgumentParser:
    """The stacks' shape and timing arguments."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=8192)
    parser.add_argument("--hidden", type=int, default=4096)
    parser.add_argument("--steps", type=int, default=steps)
    parser.add_argument("--warm-up", type=int, default=4, help="steps before timing; >= 3 for auto to plan")
    parser.add_argument("--stacks", default=stacks)
    parser.add_argument("--smoke", action="store_true", help="CPU, tiny sizes, two steps")
    return parser


def setup(args: argparse.Namespace) -> tuple[torch.device, torch.dtype, Clock]:
    """Device, dtype and clock of a run (``--smoke``: CPU, float32, tiny sizes)."""
    if args.smoke:
        args.layers, args.tokens, args.hidden, args.steps = 3, 512, 128, 2
    device = torch.device("cpu" if args.smoke else "cuda")
    dtype = torch.float32 if args.smoke else torch.bfloat16
    return device, dtype, Clock(device)


def main():
    parser = stack_arguments(__doc__.splitlines()[0], steps=10, stacks="mlp,attn,moe")
    parser.add_argument("--out", help="directory (default benchmarks/results; with --smoke the temp dir)")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds of none, the hooks alone and auto, after the curve")
    args = parser.parse_args()
    device, dtype, clock = setup(args)
    bytes_per_s = pinned_bytes_per_s(device, clock, (1 << 20) if args.smoke else (256 << 20))
    print(f"pinned copy: {bytes_per_s / 1e9:.1f} GB/s")
    stacks = {}
    for kind in args.stacks.split(","):
        stacks[kind] = curve(kind, args, device, dtype, clock, bytes_per_s)
        report(kind, stacks[kind])
    result = dict(device=torch.cuda.get_device_name() if clock.cuda else "cpu (smoke)", torch=torch.__version__,
                  dtype=str(dtype), time=time.strftime("%Y-%m-%d %H:%M"), layers=args.layers, tokens=args.tokens,
                  hidden=args.hidden, pinned_bytes_per_s=bytes_per_s, peak=PEAK_CONVENTION, stacks=stacks,
                  targets=dict(auto_time_ratio="<= 1.03", auto_moved_over_hideable_achieved=">= 0.9",
                               auto_saved_over_moved=">= 0.9", all_over_floor="<= 1.2"))
    out = args.out or (tempfile.gettempdir() if args.smoke else RESULTS)
    os.makedirs(out, exist_ok=True)
    path = results_path("offload", "", device=device.type, directory=Path(out))
    with open(f"{path}.json", "w") as f:
        json.dump(result, f, indent=1)
    plot(result, f"{path}.png")
    print(f"results: {path}.json")


if __name__ == "__main__":
    main()
