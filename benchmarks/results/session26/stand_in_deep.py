"""Session 26, CPU: deep dense stacks (T=16, H=32) with the stand-in for CUDA graphs of
test_graphed_states.py, 60 training steps: graph counts per 10 steps, then the programs' phases and
capture counts (device call 1 measured the same on the GPU: depth 24 ended with 21 of 48 eager).

    PYTHONPATH=. python3 benchmarks/results/session26/stand_in_deep.py [depth ...]
"""
import collections
import gc
import sys

import pytest
import torch

from benchmarks import sizes
from fuseops.ops.executor import graphed
from tests.ops.executor import test_graphed_states

test_graphed_states.cpu_graphs.__wrapped__(pytest.MonkeyPatch())
for depth in [int(a) for a in sys.argv[1:]] or [4, 12, 24]:
    torch.manual_seed(0)
    known = {id(o) for o in gc.get_objects() if isinstance(o, graphed.GraphedProgram)}
    model = sizes.fuseops_dense(32, "gelu", depth=depth)
    x = torch.randn(16, 32, requires_grad=True)
    step = sizes.step_fn(model, (x,), list(model.parameters()))
    print("depth", depth)
    for window in range(6):
        before = dict(graphed.counts)
        for _ in range(10):
            step()
        print(" ", window, {k: graphed.counts[k] - before[k] for k in before if graphed.counts[k] != before[k]})
    mine = [o for o in gc.get_objects() if isinstance(o, graphed.GraphedProgram) and id(o) not in known]
    print("  phases", dict(collections.Counter(p.phase for p in mine)),
          "captures", dict(sorted(collections.Counter(p.captures for p in mine).items())))
