"""Why a planned offload step of the fuseops stack captured a CUDA graph (a host sync) after eight warm-up
steps (session 56, run 4: tests/offload/test_planner_cuda.py[fuseops] failed). Runs that test's model for 30
steps and prints, per step, what the graph states did: captures (by entry), counts and refusals that moved."""

import collections
import sys

import torch

from fuseops.ops.executor import graphed
from tests.offload._models import fuseops_layers, run_step

STEPS = int(sys.argv[1]) if len(sys.argv) > 1 else 30
programs = []
init = graphed.GraphedProgram.__init__


def tracked_init(self, *a, **k):
    init(self, *a, **k)
    self.tag = len(programs)
    programs.append(self)


graphed.GraphedProgram.__init__ = tracked_init
captures = collections.Counter()
real_capture = graphed.GraphedProgram._capture_into_pool


def logged_capture(self, inputs):
    captures[(self.tag, self.phase, "gpu" if self.gpu_bound else "host")] += 1
    return real_capture(self, inputs)


graphed.GraphedProgram._capture_into_pool = logged_capture
layers = fuseops_layers(n=4, width=4096, hidden=16384, device="cuda", dtype=torch.bfloat16)
x = torch.randn(8192, 4096, device="cuda", dtype=torch.bfloat16)
run_step(layers, x, groups=False)
for step in range(STEPS):
    counts, refusals = dict(graphed.counts), dict(graphed.refusals)
    captures.clear()
    run_step(layers, x, dict(group_budget_bytes="auto"), groups=False)
    torch.cuda.synchronize()
    dc = {k: v - counts.get(k, 0) for k, v in graphed.counts.items() if v != counts.get(k, 0) and k != "graph_replays"}
    dr = {k[:60]: v - refusals.get(k, 0) for k, v in graphed.refusals.items() if v != refusals.get(k, 0)}
    phases = collections.Counter(p.phase for p in programs)
    print(f"step {step:2d} programs {len(programs)} phases {dict(phases)} captures {dict(captures)} {dc} {dr}")
