"""Session 49: the expert layer step on this CPU with the stand-in graphs (tests/ops/executor/test_graphed_states.py)
and their replays made no-ops, its host time split by function (each wrapped in a timer).

    PYTHONPATH=. python3 benchmarks/results/session49/moe_cpu_split.py
"""
import sys
import time
from collections import defaultdict

import pytest
import torch

from benchmarks.sizes import FuseopsExpertLayer, FuseopsMoE, moe_args, step_fn
from fuseops.moe import expert_layer_steps, routing_graphs
from fuseops.ops.executor import graphed as _g
from tests.ops.executor import test_graphed_states as st

originals = {m: _g.GraphedProgram.__dict__[m] for m in ("_capture", "_replay")}
mp = pytest.MonkeyPatch()
st.cpu_graphs.__wrapped__(mp)
torch.manual_seed(0)
E,H,I,K,T = 8,64,32,2,64
model = FuseopsExpertLayer(FuseopsMoE(E,H,I))
step = step_fn(model, moe_args(T,E,H,K,False,"cpu",torch.float32), list(model.parameters()))
for _ in range(60): step()
import fuseops.ops.executor.graphed as g

st._CALL["inputs"] = ()
for m in ("_capture","_replay"):
    mp.setattr(g.GraphedProgram, m, originals[m])
mp.setattr(st._StandInGraph, "replay", lambda self: None)
print({key[1]: [s.phase for s in kept] for key, kept in routing_graphs.states().items()})
spent = defaultdict(float)
def timed(name, fn):
    def w(*a, **k):
        s=time.perf_counter()
        try: return fn(*a, **k)
        finally: spent[name]+=time.perf_counter()-s
    return w
layer = sys.modules["fuseops.moe.expert_layer"]._ExpertLayer
mp.setattr(layer, "forward", staticmethod(timed("Function.forward", layer.forward)))
mp.setattr(layer, "backward", staticmethod(timed("Function.backward", layer.backward)))
mp.setattr(routing_graphs, "call", timed("routing_graphs.call", routing_graphs.call))
mp.setattr(g.GraphedProgram, "run", timed("GraphedProgram.run", g.GraphedProgram.run))
mp.setattr(g.GraphedProgram, "_replay", timed("_replay", g.GraphedProgram._replay))
mp.setattr(g.GraphedProgram, "_outputs", timed("_outputs", g.GraphedProgram._outputs))
el = sys.modules["fuseops.moe.expert_layer"]
mp.setattr(el, "check_routing", timed("check_routing", el.check_routing))
mp.setattr(el, "_fallback", timed("_fallback", el._fallback))
mp.setattr(el, "graph_freed_after_backward", timed("graph_freed_after_backward", el.graph_freed_after_backward))
mp.setattr(expert_layer_steps, "backward", timed("steps.backward", expert_layer_steps.backward))
mp.setattr(expert_layer_steps, "forward", timed("steps.forward", expert_layer_steps.forward))
mp.setattr(g, "in_graph_memory", timed("in_graph_memory", g.in_graph_memory))
N=500
total=0
for _ in range(N):
    s=time.perf_counter(); step(); total+=time.perf_counter()-s
print(f"step {1e6*total/N:.1f} us (instrumented)")
for k,v in sorted(spent.items(), key=lambda kv:-kv[1]): print(f"  {k:28s} {1e6*v/N:6.1f} us")
