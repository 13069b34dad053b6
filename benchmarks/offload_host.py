"""The host's time inside the offload scheduler, per step and per saved tensor.

    python -m benchmarks.offload_host [--stacks mlp,attn,moe] [--layers 8] [--steps 20]
    python -m benchmarks.offload_host --breakdown          # time per scheduler function too
    python -m benchmarks.offload_host --profile moe:auto   # cProfile of that point's steps
    python -m benchmarks.offload_host --cuda --breakdown   # the H100 benchmark's sizes, bf16

On an H100 the offload hooks add host time to every step (benchmarks/offload.py's "host
ms"), and a step whose host is behind its device costs that 1:1. Timed here: every call
into the scheduler (the saved-tensor hooks, the module hooks, the executor's save
notices, groups opening and closing, the context's end), summed per step; the median over ``--steps`` is printed
with the count of tensors that reached ``pack`` and the time per packed tensor. Points
as in the benchmark: no offload, budget 0 (the hooks alone: groups pass tensors
through), a tenth of a group (records, little moves), "auto" and everything.

By default on the CPU, without a GPU: the stacks of ``benchmarks/offload.py`` at a tiny
size (the link copies synchronously into host blocks, a few KB each; the planner reads
the host clock), ``min_tensor_bytes`` scaled with the activations (``SCALE``: a tiny
activation is that many times smaller than the benchmark's 64 MB), so the same tensors
are saved, skipped, recorded and moved. What the CUDA calls of a GPU step cost the host
(events, copies, stream waits) is not in it; ``--cuda`` measures the same on a GPU.

``--breakdown``: inclusive time per call of the scheduler's inner functions and of the
link's copies (a function called inside another counts in both).
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import functools
import pstats
import statistics
import time

import torch
from torch import nn

from benchmarks import offload as bench
from benchmarks.offload import STACKS, step
from fuseops.offload import hooks as hooks_module
from fuseops.offload import link as link_module
from fuseops.offload import mark_not_offload, offload_activations
from fuseops.offload import planner as planner_module
from fuseops.offload import timing as timing_module
from fuseops.offload.backward import BackwardPath
from fuseops.offload.notice import NoticePath
from fuseops.offload.scheduler import Scheduler

# The H100 benchmark's activation is 8192 x 4096 bf16 (64 MB); here 32 x 128 float32.
TOKENS, HIDDEN = 32, 128
SCALE = (8192 * 4096 * 2) // (TOKENS * HIDDEN * 4)

ENTRY_POINTS = [(Scheduler, "pack"), (BackwardPath, "unpack"), (Scheduler, "open_group"), (Scheduler, "close_group"),
                (Scheduler, "finish"), (Scheduler, "__init__"), (hooks_module, "_pre_hook"),
                (hooks_module, "_post_hook"), (hooks_module, "_notice")]
INNER = [(Scheduler, n) for n in ("_skip_reason", "_group_for_save", "_offload_group", "_offload", "_pass",
                                  "_pass_over_cap", "_release_copied", "_resident_bytes", "_settle", "_mark_forward")]
INNER += [(NoticePath, n) for n in ("notice", "_pack_noticed")]
INNER += [(BackwardPath, n) for n in ("_start_backward", "_advance_prefetch", "_reload")]
INNER += [(cls, n) for cls in (link_module.HostLink, link_module.CudaLink)
          for n in ("copy_out", "copy_in", "consume", "settle", "fence")]
INNER += [(planner_module.Planner, n) for n in ("begin_step", "poll", "budget", "moved", "waiting")]
INNER += [(timing_module.EventTimer, "mark"), (timing_module.EventTimer, "seconds"),
          (timing_module.CopyMeter, "record"), (timing_module.CopyMeter, "bytes_per_s")]


class HostMeter:
    """Seconds inside the scheduler's entry points (outermost call only), packed tensors,
    and with ``breakdown`` the inclusive seconds and calls of each inner function."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.packs = 0
        self.inner: dict[str, list[float]] = {}
        self._depth = 0

    def reset(self) -> None:
        self.seconds, self.packs = 0.0, 0

    def reset_inner(self) -> None:
        for cell in self.inner.values():
            cell[:] = [0.0, 0]

    def entry(self, fn, counts_pack: bool):
        @functools.wraps(fn)
        def timed(*args, **kwargs):
            if counts_pack:
                self.packs += 1
            if self._depth:
                return fn(*args, **kwargs)
            self._depth += 1
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.seconds += time.perf_counter() - start
                self._depth -= 1

        return timed

    def part(self, fn, name: str):
        cell = self.inner.setdefault(name, [0.0, 0])

        @functools.wraps(fn)
        def timed(*args, **kwargs):
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                cell[0] += time.perf_counter() - start
                cell[1] += 1

        return timed


def install(meter: HostMeter, patches: contextlib.ExitStack, breakdown: bool) -> None:
    """Time the scheduler (patched for the duration of ``patches``)."""
    wrapped = [(owner, name, meter.entry(getattr(owner, name), name == "pack")) for owner, name in ENTRY_POINTS]
    if breakdown:
        wrapped += [(owner, name, meter.part(owner.__dict__[name], f"{owner.__name__}.{name}"))
                    for owner, name in INNER if name in owner.__dict__]
    for owner, name, fn in wrapped:
        patches.callback(setattr, owner, name, getattr(owner, name) if owner is hooks_module else owner.__dict__[name])
        setattr(owner, name, fn)


def run_point(layers, x, budget, args, sync):
    name = "none" if budget == "none" else "fuseops"
    meter = HostMeter()
    prof = cProfile.Profile() if args.profile else None
    with contextlib.ExitStack() as patches:
        install(meter, patches, args.breakdown)
        for _ in range(args.warm_up):
            stats = step(layers, x, name, budget)
            sync()
        meter.reset_inner()
        host, packs, wall = [], [], []
        for _ in range(args.steps):
            meter.reset()
            start = time.perf_counter()
            if prof:
                prof.enable()
            stats = step(layers, x, name, budget)
            if prof:
                prof.disable()
            wall.append(time.perf_counter() - start)
            sync()
            host.append(meter.seconds)
            packs.append(meter.packs)
    if prof:
        table = pstats.Stats(prof).sort_stats("tottime")
        table.print_stats("offload/|weakref|reductions", 40)
    inner = {k: (v[0] / args.steps * 1e6, v[1] / args.steps) for k, v in meter.inner.items() if v[1]}
    return dict(host_us=statistics.median(host) * 1e6, wall_ms=statistics.median(wall) * 1e3,
                packs=statistics.median(packs), stats=stats, inner=inner)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stacks", default="mlp,attn,moe")
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warm-up", type=int, default=6, help="steps before timing (auto plans after 2-3)")
    parser.add_argument("--breakdown", action="store_true", help="time per scheduler function")
    parser.add_argument("--profile", default=None, help="stack:budget to cProfile (budget: none, 0, 10%%, auto, all)")
    parser.add_argument("--cuda", action="store_true", help="the benchmark's sizes (8192 x 4096, bf16) on a GPU")
    args = parser.parse_args()
    torch.manual_seed(0)
    if args.cuda:
        device, dtype, tokens, hidden, min_bytes = torch.device("cuda"), torch.bfloat16, 8192, 4096, 2**18
        sync = torch.cuda.synchronize
    else:
        torch.set_num_threads(1)
        device, dtype, tokens, hidden, min_bytes = torch.device("cpu"), torch.float32, TOKENS, HIDDEN, 2**18 // SCALE

        def sync():
            pass

    def scaled_context(name, budget):
        if name == "none":
            return contextlib.nullcontext()
        return offload_activations(keep_last=1, min_tensor_bytes=min_bytes, group_budget_bytes=budget)

    # benchmarks.offload.step builds its context through scheme_context: scale it.
    bench.scheme_context = scaled_context
    kinds = [args.profile.split(":")[0]] if args.profile else args.stacks.split(",")
    print(f"{'stack':>6} {'budget':>8} {'host us':>9} {'packs':>6} {'us/pack':>8} {'wall ms':>8} "
          f"{'offloaded':>10} {'skipped':>8} {'groups':>6}")
    for kind in kinds:
        layers = nn.ModuleList(STACKS[kind](hidden) for _ in range(args.layers)).to(device, dtype)
        x = torch.randn(1, tokens, hidden, device=device, dtype=dtype)
        mark_not_offload(x)
        everything = step(layers, x, "fuseops_all", None)
        group = everything["bytes_offloaded"] // max(1, args.layers - 1)
        budgets = {"none": "none", "0": 0, "10%": max(min_bytes, group // 10), "auto": "auto", "all": None}
        if args.profile:
            label = args.profile.split(":")[1]
            budgets = {label: budgets[label]}
        for label, budget in budgets.items():
            p = run_point(layers, x, budget, args, sync)
            s = p["stats"] or {}
            per = p["host_us"] / p["packs"] if p["packs"] else 0.0
            print(f"{kind:>6} {label:>8} {p['host_us']:>9.0f} {p['packs']:>6.0f} {per:>8.1f} {p['wall_ms']:>8.2f} "
                  f"{s.get('tensors_offloaded', 0):>10} {s.get('tensors_skipped', 0):>8} {s.get('groups', 0):>6}")
            if args.breakdown and p["inner"]:
                for fn, (us, calls) in sorted(p["inner"].items(), key=lambda kv: -kv[1][0]):
                    print(f"{'':>16} {fn:<32} {us:>8.0f} us/step {calls:>6.1f} calls {us / calls:>7.1f} us/call")


if __name__ == "__main__":
    main()
