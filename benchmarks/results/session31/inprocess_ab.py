"""Session 31: ``expert_layer``'s host path before and after this session's cuts, in ONE process,
interleaved (call 4's A/B ran each tree in its own process: the device host's run-to-run spread,
+-0.1 ms, was larger than the change). The tree before the cuts lives in ``base_files/``: its
``graphed.py`` and ``routing_graphs.py`` are loaded as modules of their own, and the "before" variant
points ``expert_layer_steps`` at them (each variant then has its own graph states) and calls the old
``expert_layer`` function; the "after" variant runs the installed modules.

    python benchmarks/results/session31/inprocess_ab.py [T] [rounds] [shapes...]

Prints per shape the minimum over rounds of each variant's median enqueue (the device drained
before each step) and median synchronised step, and the per-round enqueues.
"""
import importlib.machinery
import importlib.util
import pathlib
import sys

import torch

import fuseops.moe
from benchmarks import sizes
from fuseops.moe import expert_layer_steps as steps
from fuseops.moe import routing_graphs
from fuseops.ops.executor import graphed

BASE = pathlib.Path(__file__).parent / "base_files"


def _load(name: str, file: str):
    # Kept as .py.txt: copies of the modules at c5c4341 (session 30's last commit), out of the linters' way.
    loader = importlib.machinery.SourceFileLoader(name, str(BASE / f"{file}.txt"))
    spec = importlib.util.spec_from_loader(name, loader)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


old_graphed = _load("base_graphed", "graphed.py")
old_routing_graphs = _load("base_routing_graphs", "routing_graphs.py")
old_routing_graphs.graphed = old_graphed
old_expert_layer = _load("base_expert_layer", "expert_layer.py").expert_layer
new_expert_layer = fuseops.moe.expert_layer
VARIANTS = {"before": (old_routing_graphs, old_graphed, old_expert_layer),
            "after": (routing_graphs, graphed, new_expert_layer)}


def use(variant: str) -> None:
    steps.routing_graphs, steps.graphed, fuseops.moe.expert_layer = VARIANTS[variant]


def main() -> None:
    T = int(sys.argv[1]) if len(sys.argv) > 1 else 1024
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 5
    device = "cuda" if torch.cuda.is_available() else "cpu"
    for shape in sys.argv[3:] or ["qwen3", "olmoe"]:
        E, H, F, K = sizes.MOE_SHAPES[shape]
        torch.manual_seed(0)
        dtype = torch.bfloat16 if device == "cuda" else torch.float32
        model = sizes.FuseopsExpertLayer(sizes.FuseopsMoE(E, H, F).to(device, dtype))
        args = sizes.moe_args(T, E, H, K, device=device, dtype=dtype)
        step = sizes.step_fn(model, args, list(model.parameters()))
        for variant in VARIANTS:
            use(variant)
            for _ in range(60):
                step()
        enq = {v: [] for v in VARIANTS}
        ms = {v: [] for v in VARIANTS}
        for _ in range(rounds):
            for variant in VARIANTS:
                use(variant)
                enq[variant].append(sizes.enqueue_ms(step, device, 40))
                ms[variant].append(sizes.time_ms(step, device, 20))
        cells = [f"{v} enq {min(enq[v]):.3f} step {min(ms[v]):.3f} (rounds {' '.join(f'{e:.3f}' for e in enq[v])})"
                 for v in VARIANTS]
        print(f"{shape} T={T}: " + "; ".join(cells), flush=True)
    use("after")
    print("states: before", sum(len(e.states if hasattr(e, "states") else e) for e in old_routing_graphs._states.values()),
          "after", sum(len(e.states) for e in routing_graphs._states.values()),
          "| counts before", old_graphed.counts, "after", graphed.counts)


if __name__ == "__main__":
    main()
