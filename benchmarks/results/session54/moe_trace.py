"""Session 54 probe: which of the MoE composition's graph states replay and which run eagerly at steady state, and
why (``graphed.counts`` / ``graphed.refusals`` over the warm-up), with the drained step's host phases. Run 1 found the
composition's GPU time within 2 % of ``expert_layer``'s but its step 0.2-0.5 ms longer, and Memcpy DtoD kernels
(graph input copies) with skewed routing only.

    python benchmarks/results/session54/moe_trace.py [--shapes qwen3 olmoe] [--T 1024]
"""
import argparse
import time

import torch

from benchmarks._timing import step_phases
from benchmarks.sizes import MOE_SHAPES, FuseopsExpertLayer, FuseopsMoE, moe_args, step_fn
from fuseops.ops.executor import graphed

_calls: list[tuple] = []
_run = graphed.GraphedProgram.run


def _traced(self, inputs):
    before = dict(graphed.counts)
    t0 = time.perf_counter()
    out = _run(self, inputs)
    us = (time.perf_counter() - t0) * 1e6
    changed = {k: graphed.counts[k] - v for k, v in before.items() if graphed.counts[k] != v}
    name = getattr(self.eager_run, "__qualname__", type(self.eager_run).__name__)
    samples = [[tuple(round(v * 1e6) for v in s) for s in kind] for kind in (self.eager_samples, self.graph_samples)]
    _calls.append((id(self) % 10000, name[:40], self.phase, self.captures, self.gpu_bound,
                   sorted(self.unsettled), len(self.buffers), changed, round(us), samples))
    return out


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--shapes", nargs="+", default=["qwen3", "olmoe"])
    p.add_argument("--T", type=int, default=1024)
    a = p.parse_args()
    graphed.GraphedProgram.run = _traced
    for shape in a.shapes:
        for skewed in (False, True):
            E, H, I, K = MOE_SHAPES[shape]
            torch.manual_seed(0)
            model = FuseopsMoE(E, H, I).to("cuda", torch.bfloat16)
            args = moe_args(a.T, E, H, K, skewed)
            params = list(model.parameters())
            for name, m in (("composition", model), ("expert_layer", FuseopsExpertLayer(model))):
                step = step_fn(m, args, params)
                counts, refusals = dict(graphed.counts), dict(graphed.refusals)
                for i in range(60):
                    step()
                    if i < 16:
                        torch.cuda.synchronize()
                        print("  step", i, {k: v - counts[k] for k, v in graphed.counts.items() if v != counts[k]},
                              "refusals", sum(graphed.refusals.values()) - sum(refusals.values()))
                torch.cuda.synchronize()
                cell = f"{shape} T={a.T} {'skewed' if skewed else 'uniform'} {name}"
                print(cell, "warm-up counts", {k: v - counts[k] for k, v in graphed.counts.items() if v != counts[k]},
                      "refusals", {k: v - refusals.get(k, 0) for k, v in graphed.refusals.items()
                                   if v != refusals.get(k, 0)}, flush=True)
                _calls.clear()
                step()
                torch.cuda.synchronize()
                for c in _calls:
                    print("   ", *c)
                print("   ", step_phases(m, args, params), flush=True)
            del model


if __name__ == "__main__":
    main()
