"""Session 18 diagnostic (issue 23): where the moe stack's forward loses time under "auto".
torch.profiler over 3 steps each of none and auto (settled plan): on the compute stream, the
sum of kernel times and of the gaps between kernels, forward and backward apart (split at the
loss's first backward kernel, by the step's events), and the top kernels by added time.
    python benchmarks/results/session18/offload_trace.py --stack moe
"""
import argparse
import collections
import itertools
import sys

import torch
from torch import nn
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, ".")
from benchmarks import offload as bo
from fuseops.offload import mark_not_offload


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--stack", default="moe")
    a = p.parse_args()
    dev, dt = torch.device("cuda"), torch.bfloat16
    torch.manual_seed(0)
    layers = nn.ModuleList(bo.STACKS[a.stack](4096) for _ in range(8)).to(dev, dt)
    x = torch.randn(1, 8192, 4096, device=dev, dtype=dt)
    mark_not_offload(x)
    for _ in range(3):
        bo.step(layers, x, "none", None)
    for _ in range(14):
        bo.step(layers, x, "fuseops", "auto")
    torch.cuda.synchronize()
    summary = {}
    for name, budget in (("none", None), ("fuseops", "auto")):
        with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
            for _ in range(3):
                torch.cuda.synchronize()
                with torch.profiler.record_function("FWD"):
                    pass
                bo.step(layers, x, name, budget)
                torch.cuda.synchronize()
        kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
        by_stream = collections.defaultdict(list)
        for e in kernels:
            by_stream[getattr(e, "device_resource_id", 0)].append(e)
        streams = {s: (len(v), sum(e.device_time for e in v) / 1e3) for s, v in by_stream.items()}
        compute = max(by_stream, key=lambda s: streams[s][0])
        ev = sorted(by_stream[compute], key=lambda e: e.time_range.start)
        busy = sum(e.time_range.end - e.time_range.start for e in ev) / 1e3 / 3
        gaps = 0.0
        big_gaps = collections.Counter()
        for prev, cur in itertools.pairwise(ev):
            g = cur.time_range.start - prev.time_range.end
            if 0 < g < 5000:  # inside a step (steps are synchronised apart)
                gaps += g
                if g > 20:
                    big_gaps[prev.name[:60] + " -> " + cur.name[:60]] += g
        per = collections.Counter()
        for e in ev:
            per[e.name[:90]] += (e.time_range.end - e.time_range.start) / 3
        summary[name] = per
        print(f"{name}: streams {{id: (kernels, ms)}} {streams}")
        print(f"  compute stream {compute}: busy {busy:.2f} ms a step, gaps {gaps / 1e3 / 3:.2f} ms a step")
        for k, g in big_gaps.most_common(8):
            print(f"    gap {g / 1e3 / 3:6.3f} ms a step after/before: {k}")
    diff = collections.Counter({k: summary["fuseops"][k] - summary["none"].get(k, 0) for k in summary["fuseops"]})
    print("kernels that took longer under auto (us a step):")
    for k, d in diff.most_common(12):
        print(f"  {d:8.1f}  ({summary['none'].get(k, 0):8.1f} -> {summary['fuseops'][k]:8.1f})  {k}")


if __name__ == "__main__":
    main()
