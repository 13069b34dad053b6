"""Session 26: do deep stacks settle on the GPU? The CPU stand-in for graphs (session 25) left a
12-block stack with 10 of 24 programs at MAX_CAPTURES and 3 eager for good. Per depth, a fresh GELU
stack (T=1024, H=1024), 80 training steps: the graph counts and the mean synced step per window of
10, the step against torch eager's, then how many programs ended in each phase and the histogram
of their capture counts.

    python benchmarks/results/session26/deep_settle.py [depth ...]
"""
import collections
import gc
import sys

import torch

from benchmarks import sizes
from benchmarks.results.session25.settle import windows
from fuseops.ops.executor import graphed

KEYS = ("captured", "recaptured", "kept", "dropped", "moved", "busy", "copied_out")


def programs():
    return [o for o in gc.get_objects() if isinstance(o, graphed.GraphedProgram)]


for depth in [int(a) for a in sys.argv[1:]] or [4, 12, 24]:
    torch.manual_seed(0)
    known = set(map(id, programs()))
    m = sizes.fuseops_dense(1024, "gelu", depth=depth).cuda().bfloat16()
    x = torch.randn(1024, 1024, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    step = sizes.step_fn(m, (x,), list(m.parameters()))
    print(f"depth {depth}")
    print("\n".join(windows(step, 8, KEYS)))
    reference = sizes.torch_dense(m).cuda().bfloat16()
    torch_step = sizes.step_fn(reference, (x,), list(reference.parameters()))
    torch_ms, fuseops_ms = sizes.time_ms(torch_step, "cuda", 20), sizes.time_ms(step, "cuda", 20)
    print(f"  torch eager {torch_ms:.2f} ms, fuseops {fuseops_ms:.2f} ms (synced steps, same run)")
    mine = [p for p in programs() if id(p) not in known]
    print("  phases", dict(collections.Counter(p.phase for p in mine)),
          "captures", dict(sorted(collections.Counter(p.captures for p in mine).items())))
    del m, step, x, reference, torch_step
    gc.collect()
    torch.cuda.empty_cache()
print(graphed.counts, graphed.refusals)
