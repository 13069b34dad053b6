"""Session 43 probe (issue 20): an A/B of the MoE layer's host path in one process. Two layers with the same weights,
each warmed up in its own mode, then timed in alternating blocks, the mode switched before each: median drained host
time of a step (issue time, the device synchronised before each step), the issue time of a second step while the
device still runs the first ("busy": the host has not waited, so it is not slowed by waiting) and median step time
(the two steps, synchronised, halved); torch's plain composition (``TorchMoE``) beside. Session 42's call 1 ran each mode in its own process and saw the host vary 2x
between processes. The two layers share the routing's graph states (keyed by call and shape, not by layer): a mode
that changes the graph decision cannot be compared this way (call 4 tried ``graphed.GPU_BOUND``: both layers kept the
first one's decisions).

    --ab replay: branch moe-eager-replay's routing calls and expert_layer bodies replaying recorded programs eagerly
                 ("replay") against ``replay.ENABLED`` off ("launchers", the launchers' Python as before the branch)
    --ab ragged: ragged descriptors with tuple geometry ("tuples", kept encoded maps) against the lists before session
                 43 ("lists": every launch encodes its ragged maps afresh)

    python benchmarks/results/session43/moe_host_ab.py --ab replay [--cells qwen3:16384 qwen3:4096 qwen3:1024]
"""
import argparse
import collections
import statistics
import time

import torch

from benchmarks.sizes import MOE_SHAPES, FuseopsExpertLayer, FuseopsMoE, TorchMoE, moe_args
from fuseops.kernels.gemm import grouped
from fuseops.kernels.hopper import wgrad
from fuseops.moe import routing_graphs
from fuseops.ops.executor import graphed, replay

TUPLES = grouped.ragged_geometry


def lists(t):
    shape, strides = TUPLES(t)
    return list(shape), list(strides)


def set_replay(on: bool) -> None:
    replay.ENABLED = on


def set_ragged(as_lists: bool) -> None:
    grouped.ragged_geometry = wgrad.ragged_geometry = lists if as_lists else TUPLES


# --ab: (mode a, mode b), the setter and its argument for each (torch's model runs in mode a).
AB = {"replay": (("replay", "launchers"), set_replay, (True, False)),
      "ragged": (("tuples", "lists"), set_ragged, (False, True))}


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--cells", nargs="+", default=["qwen3:16384", "qwen3:4096", "qwen3:1024"])
    p.add_argument("--blocks", type=int, default=4)
    p.add_argument("--steps", type=int, default=10, help="steps a block")
    p.add_argument("--skewed", action="store_true")
    p.add_argument("--ab", choices=sorted(AB), default="replay")
    a = p.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    for cell in a.cells:
        shape, T = cell.split(":")
        E, H, I, K = MOE_SHAPES[shape] if device == "cuda" else (4, 32, 16, 2)
        T = int(T) if device == "cuda" else 16
        torch.manual_seed(0)
        mine = FuseopsMoE(E, H, I).to(device, dtype)
        (first, second), setter, values = AB[a.ab]
        models = {first: FuseopsExpertLayer(mine), second: FuseopsExpertLayer(mine), "torch": TorchMoE(mine)}
        modes = {first: values[0], second: values[1], "torch": values[0]}
        x, ids, weights = moe_args(T, E, H, K, a.skewed, device, dtype)
        params = {name: [*m.parameters(), x, weights] for name, m in models.items()}

        def step(name: str) -> None:
            for q in params[name]:
                q.grad = None
            models[name](x, ids, weights).sum().backward()

        issue, busy, whole = (collections.defaultdict(list) for _ in range(3))
        counts = {}
        for name in models:
            setter(modes[name])
            for _ in range(30):
                step(name)
            sync(device)
        for block in range(a.blocks):
            order = list(models) if block % 2 == 0 else list(models)[::-1]
            for name in order:
                setter(modes[name])
                before = dict(graphed.counts)
                for _ in range(a.steps):
                    sync(device)
                    start = time.perf_counter()
                    step(name)
                    issued = time.perf_counter()
                    step(name)  # issued while the device still runs the first: the host never waits
                    busy[name].append(time.perf_counter() - issued)
                    sync(device)
                    issue[name].append(issued - start)
                    whole[name].append((time.perf_counter() - start) / 2)
                counts[name] = {k: v - before.get(k, 0) for k, v in graphed.counts.items() if v != before.get(k, 0)}
        setter(values[0])
        print(f"\n== {cell} ({'skewed' if a.skewed else 'uniform'}), {device}, {a.blocks} alternating blocks of "
              f"{a.steps} steps; medians")
        print(f"   {'':10s} {'issue us':>9s} {'busy us':>8s} {'step ms':>8s}  graphed.counts, last block")
        for name in models:
            print(f"   {name:10s} {statistics.median(issue[name]) * 1e6:9.1f} {statistics.median(busy[name]) * 1e6:8.1f}"
                  f" {statistics.median(whole[name]) * 1e3:8.3f}  {counts.get(name, {})}")
        phases = collections.Counter(s.phase for states in routing_graphs.states().values() for s in states)
        print(f"   graph states' phases (both layers): {dict(phases)}")
        del models, params, mine, x, ids, weights
        routing_graphs.clear()
        if device == "cuda":
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
