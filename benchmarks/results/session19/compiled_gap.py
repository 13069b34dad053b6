"""Session 19: where compiled fuseops loses to torch.compile of the same dense stack at small
sizes (session 17: 0.74-0.80x at T=1024). Per model, compiled with inductor: step time, host
time of forward and backward, Dynamo's cache lookup (guards) per call, kernels per step and
the top host ops by self time (torch.profiler).
    python benchmarks/results/session19/compiled_gap.py [T,H ...]
"""
import sys
import time

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, ".")
from benchmarks.sizes import fuseops_dense, torch_dense


def step(model, x, params):
    for p in params:
        p.grad = None
    t0 = time.perf_counter()
    loss = model(x).sum()
    t1 = time.perf_counter()
    loss.backward()
    return t1 - t0, time.perf_counter() - t1


def main():
    cells = [tuple(int(v) for v in c.split(",")) for c in sys.argv[1:]] or [(1024, 1024), (4096, 1024)]
    torch.manual_seed(0)
    for T, H in cells:
        stack = fuseops_dense(H, "gelu").cuda().bfloat16()
        ref = torch_dense(stack).cuda().bfloat16()
        x = torch.randn(T, H, device="cuda", dtype=torch.bfloat16)
        for name, model in (("fuseops", stack), ("torch", ref)):
            params = list(model.parameters())
            compiled = torch.compile(model)
            for _ in range(5):
                step(compiled, x, params)
            torch.cuda.synchronize()
            walls, fwd, bwd = [], [], []
            for _ in range(30):
                torch.cuda.synchronize()
                t = time.perf_counter()
                f, b = step(compiled, x, params)
                torch.cuda.synchronize()
                walls.append(time.perf_counter() - t)
                fwd.append(f)
                bwd.append(b)
            med = lambda v: sorted(v)[len(v) // 2] * 1e3
            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                for _ in range(5):
                    step(compiled, x, params)
                torch.cuda.synchronize()
            rows = prof.key_averages()
            kernels = sum(e.count for e in rows if e.device_type == torch.autograd.DeviceType.CUDA) / 5
            lookup = sum(e.self_cpu_time_total for e in rows if e.key == "TorchDynamo Cache Lookup") / 5
            print(f"T={T} H={H} compiled {name:8} step {med(walls):.2f} ms; host fwd {med(fwd):.2f} bwd {med(bwd):.2f}; "
                  f"kernels {kernels:.0f}; cache lookup {lookup:.0f} us", flush=True)
            top = sorted((e for e in rows if e.device_type == torch.autograd.DeviceType.CPU),
                         key=lambda e: -e.self_cpu_time_total)[:12]
            for e in top:
                print(f"   {e.key[:60]:60} {e.count / 5:5.1f}/step {e.self_cpu_time_total / 5:8.1f} us/step")
            torch._dynamo.reset()


if __name__ == "__main__":
    main()
