"""Session 25, CPU: a 4-block dense stack (T=16, H=32) with the stand-in for CUDA graphs of
test_graphed_states.py, a training loop that keeps (``hold``) or lets go (``free``) of its output
between steps, or (``accumulate``) runs two micro-batches' forwards before one backward: graph
counts per 10 steps.

    PYTHONPATH=. python3 benchmarks/results/session25/stand_in_held_loop.py hold|free|accumulate
"""
import sys

import pytest
import torch

from benchmarks import sizes
from fuseops.ops.executor import graphed
from tests.ops.executor import test_graphed_states

test_graphed_states.cpu_graphs.__wrapped__(pytest.MonkeyPatch())
mode = sys.argv[1]
torch.manual_seed(0)
model = sizes.fuseops_dense(32, "gelu")
opt = torch.optim.SGD(model.parameters(), lr=1e-6)
xs = [torch.randn(16, 32) for _ in range(2)]
out = loss = None
for window in range(4):
    before = dict(graphed.counts)
    for _ in range(10):
        if mode == "accumulate":
            loss = sum(model(x).square().mean() for x in xs)
        elif mode == "hold":
            out = model(xs[0])
            loss = out.square().mean()
        else:
            loss = model(xs[0]).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    print(window, {k: graphed.counts[k] - before[k] for k in before if graphed.counts[k] != before[k]})
