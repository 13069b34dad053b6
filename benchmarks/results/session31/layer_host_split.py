"""Session 31: where ``expert_layer``'s steady-state host time goes on the GPU machine's host (issue
20: an MoE layer's fwd+bwd enqueue <= 0.5 ms; session 31 call 1 measured 0.655 ms at Qwen3 T=1024,
torch.profiler putting ~350 us of it in the backward Function's own Python).

First a cProfile of 100 steps (the device drained before each, as an enqueue is taken), by own time;
then the inclusive time of the functions on the path, each wrapped with a timer (a wrapper costs
~0.3 us a call), in us per step over 300 steps, beside the step's phases.

    python benchmarks/results/session31/layer_host_split.py [shape] [T]
"""
import functools
import importlib
import sys
import time

import torch

import fuseops.moe
from benchmarks import sizes
from benchmarks._timing import profile_table, profiled, step_phases
from fuseops.moe import expert_layer_steps as steps
from fuseops.moe import routing_graphs
from fuseops.ops.executor import graphed

# fuseops.moe.expert_layer is the function (the package re-exports it over the module's name).
el = importlib.import_module("fuseops.moe.expert_layer")

shape = sys.argv[1] if len(sys.argv) > 1 else "qwen3"
T = int(sys.argv[2]) if len(sys.argv) > 2 else 1024
E, H, F, K = sizes.MOE_SHAPES[shape]
torch.manual_seed(0)
model = sizes.FuseopsExpertLayer(sizes.FuseopsMoE(E, H, F).cuda().bfloat16())
args = sizes.moe_args(T, E, H, K)
params = list(model.parameters())
step = sizes.step_fn(model, args, params)
for _ in range(60):
    step()
torch.cuda.synchronize()
print(f"== expert_layer {shape} T={T}: enqueue {sizes.enqueue_ms(step, 'cuda', 50):.3f} ms; "
      f"{step_phases(model, args, params)}", flush=True)
print(profile_table(profiled(step, 100, torch.cuda.synchronize), "tottime", 32), flush=True)

totals: dict[str, list[int]] = {}


def timed(name, fn):
    cell = totals.setdefault(name, [0, 0])

    @functools.wraps(fn)
    def wrapper(*a, **k):
        start = time.perf_counter_ns()
        try:
            return fn(*a, **k)
        finally:
            cell[0] += time.perf_counter_ns() - start
            cell[1] += 1
    return wrapper


def patch(owner, attr, name=None, static=False):
    fn = getattr(owner, attr)
    wrapped = timed(name or f"{getattr(owner, '__name__', owner)}.{attr}", fn)
    setattr(owner, attr, staticmethod(wrapped) if static else wrapped)


patch(fuseops.moe, "expert_layer", "expert_layer (all of the forward call)")
for attr in ("check_routing", "check_weights", "_fallback", "_parts", "graph_freed_after_backward"):
    patch(el, attr)
patch(el._ExpertLayer, "forward", "_ExpertLayer.forward", static=True)
patch(el._ExpertLayer, "backward", "_ExpertLayer.backward", static=True)
for attr in ("forward", "_forward_through_graphs", "backward", "_backward_through_graphs", "_forward", "_backward"):
    patch(steps, attr, f"steps.{attr}")
for attr in ("call", "applies", "_in_use", "_signature"):
    patch(routing_graphs, attr, f"routing_graphs.{attr}")
for attr in ("run", "_replay", "_outputs", "_alive", "busy"):
    patch(graphed.GraphedProgram, attr, f"GraphedProgram.{attr}")
patch(graphed, "in_graph_memory", "graphed.in_graph_memory")
patch(torch.cuda.CUDAGraph, "replay", "CUDAGraph.replay")

for _ in range(5):
    step()
for cell in totals.values():
    cell[:] = [0, 0]
STEPS = 300
for _ in range(STEPS):
    torch.cuda.synchronize()
    step()
torch.cuda.synchronize()
print(f"\n{'function (inclusive)':58s} {'us/step':>8s} {'calls/step':>10s}")
for name, (ns, calls) in sorted(totals.items(), key=lambda kv: -kv[1][0]):
    print(f"{name:58s} {ns / STEPS / 1e3:8.1f} {calls / STEPS:10.1f}")
print(f"with the wrappers: {step_phases(model, args, params)}")
print("graph counts", graphed.counts, graphed.refusals)
