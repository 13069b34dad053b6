"""Session 51: why test_gpu_compiled_steps_are_the_eager_steps_and_replay_graphs[dense] saw no forward
replay under FUSEOPS_CUDA_GRAPHS=1 (run 8). Runs its steps and prints, per recorded program, the graph
state and the eager samples (enqueue us, GPU span us), then the counts and refusals."""
import copy
import sys

import torch

from fuseops.ops.executor import graphed
from tests.ops.executor.test_graphed_states import graph_states
from tests.test_compile import _call, _inputs, _model
from tests.test_compiled_sequential import _assert_same_steps

kind = sys.argv[1] if len(sys.argv) > 1 else "dense"
torch.manual_seed(0)
model = _model(kind).cuda().bfloat16()
eager_model = copy.deepcopy(model)
compiled = torch.compile(lambda *a: _call(kind, model, a), fullgraph=True)
replays = 0


def forward(*a):
    global replays
    before = graphed.counts["graph_replays"]
    y = compiled(*a)
    replays += graphed.counts["graph_replays"] - before
    return y


for rows in (256, 384, *[512] * 10):
    args = tuple(a.detach().cuda() for a in _inputs(kind, rows, seed=rows))
    args = tuple(a.bfloat16().requires_grad_() if a.is_floating_point() else a for a in args)
    _assert_same_steps(kind, model, eager_model, forward, args)
print(f"mode={graphed._MODE} kind={kind} forward replays={replays}")
for name, m in (("compiled", model), ("eager", eager_model)):
    for g in graph_states(m):
        samples = [(round(s[0] * 1e6), round(s[1] * 1e6)) for s in (g.eager_samples or [])]
        print(f"  {name}: phase={g.phase} gpu_bound={g.gpu_bound} captures={g.captures} samples={samples}")
print("counts", {k: v for k, v in graphed.counts.items() if v})
print("refusals", graphed.refusals)
