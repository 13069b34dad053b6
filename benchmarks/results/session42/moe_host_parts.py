"""Session 42 probe, for the next device session (issue 20: an MoE layer's host time <= 0.5 ms): where a drained
``fuseops.moe.expert_layer`` step's host time goes, piece by piece, with the graph states as the benchmark leaves
them (session 40: 0.43-0.63 ms a step at Qwen3 / OLMoE T=1024-4096 with forward and backward graphed; session 41:
1.57 / 1.94 ms at T=16384, 0.97 / 1.20 with every program graphed). Each piece's inclusive host time a step
(nested pieces are inside their parents), after warm-up, over drained steps; the graph states' phases at the end.

    python benchmarks/results/session42/moe_host_parts.py [--cells qwen3:1024 olmoe:4096 qwen3:16384] [--steps 30]
        [--replay 0]   # recorded programs off: with branch moe-eager-replay, the layer's eager runs then run the
                       # launchers' Python (the A/B of that branch)
"""
import argparse
import collections
import importlib
import time

import torch

from benchmarks.sizes import MOE_SHAPES, FuseopsExpertLayer, FuseopsMoE, moe_args
from fuseops.moe import expert_layer_steps, routing_graphs
from fuseops.ops.executor import graphed, op_programs, replay

# The module (the package's ``expert_layer`` is the function).
layer_module = importlib.import_module("fuseops.moe.expert_layer")
SPENT: dict[str, float] = collections.defaultdict(float)


def timed(owner, name: str, label: str) -> None:
    """Replace ``owner.name`` by a wrapper adding its inclusive host seconds into ``SPENT[label]``."""
    real = getattr(owner, name)

    def wrapper(*args, **kwargs):
        start = time.perf_counter()
        try:
            return real(*args, **kwargs)
        finally:
            SPENT[label] += time.perf_counter() - start
    setattr(owner, name, wrapper)


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--cells", nargs="+", default=["qwen3:1024", "olmoe:4096", "qwen3:16384"])
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--skewed", action="store_true")
    p.add_argument("--replay", type=int, choices=(0, 1), default=1,
                   help="0: replay.ENABLED off (recorded programs, and the eager runs that go through them, off)")
    a = p.parse_args()
    replay.ENABLED = bool(a.replay)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    timed(layer_module, "check_routing", "  check_routing")
    timed(layer_module, "check_weights", "  check_weights")
    timed(layer_module, "_fallback", "  _fallback")
    timed(layer_module._ExpertLayer, "apply", "  _ExpertLayer.apply")
    timed(expert_layer_steps, "_forward_through_graphs", "    forward body (graph state)")
    timed(expert_layer_steps, "_backward_through_graphs", "    backward body (graph state or eager)")
    timed(routing_graphs, "call", "      routing_graphs.call")
    timed(graphed.GraphedProgram, "run", "        GraphedProgram.run")
    timed(graphed.GraphedProgram, "_replay", "          GraphedProgram._replay")
    timed(op_programs, "call", "        op_programs.call (eager runs, branch moe-eager-replay)")
    for cell in a.cells:
        shape, T = cell.split(":")
        E, H, I, K = MOE_SHAPES[shape] if device == "cuda" else (4, 32, 16, 2)
        T = int(T) if device == "cuda" else 16
        torch.manual_seed(0)
        layer = FuseopsExpertLayer(FuseopsMoE(E, H, I).to(device, dtype))
        x, ids, weights = moe_args(T, E, H, K, a.skewed, device, dtype)
        params = list(layer.parameters())
        marks = collections.defaultdict(float)

        def step(record: bool) -> None:
            t0 = time.perf_counter()
            for q in params:
                q.grad = None
            t1 = time.perf_counter()
            y = layer(x, ids, weights)
            t2 = time.perf_counter()
            loss = y.sum()
            t3 = time.perf_counter()
            loss.backward()
            t4 = time.perf_counter()
            if record:
                marks["step"] += t4 - t0
                marks[" grads = None"] += t1 - t0
                marks[" expert_layer (forward call)"] += t2 - t1
                marks[" .sum()"] += t3 - t2
                marks[" .backward()"] += t4 - t3
        for _ in range(60):
            step(False)
        sync(device)
        SPENT.clear()
        for _ in range(a.steps):
            sync(device)
            step(True)
        sync(device)
        rows = {**marks, **SPENT}
        order = ["step", " grads = None", " expert_layer (forward call)", "  check_routing", "  check_weights",
                 "  _fallback", "  _ExpertLayer.apply", "    forward body (graph state)", " .sum()", " .backward()",
                 "    backward body (graph state or eager)", "      routing_graphs.call",
                 "        GraphedProgram.run", "          GraphedProgram._replay",
                 "        op_programs.call (eager runs, branch moe-eager-replay)"]
        print(f"\n== {cell} ({'skewed' if a.skewed else 'uniform'}), {device}, replay {a.replay}: host us a drained "
              f"step, inclusive")
        for label in order:
            print(f"   {rows.get(label, 0.0) / a.steps * 1e6:8.1f}  {label}")
        phases = collections.Counter(s.phase for states in routing_graphs.states().values() for s in states)
        print(f"   graph states' phases: {dict(phases)}; graphed.counts {dict(graphed.counts)}")
        del layer, x, ids, weights, params
        routing_graphs.clear()
        if device == "cuda":
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
