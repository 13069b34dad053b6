"""Session 19: why the dense stack's eager step takes about its enqueue time PLUS its GPU
time (session 17 call 2, e.g. GELU T=4096 H=1024: 6.54 ms a step, 4.70 ms to enqueue, 1.85 ms
graphed), as if the GPU did not run while the host enqueued. For fuseops and torch: step and
enqueue times, the forward's and backward's host times, torch's sync debug warnings for one
step, and a profile of the CUDA API calls (count, host time) and kernels (count, busy time).
    python benchmarks/results/session19/sync_gap.py [T,H ...]
"""
import sys
import time
import warnings

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, ".")
from benchmarks.sizes import fuseops_dense, torch_dense


def sync():
    torch.cuda.synchronize()


def step(model, x, params):
    for p in params:
        p.grad = None
    t0 = time.perf_counter()
    loss = model(x).sum()
    t1 = time.perf_counter()
    loss.backward()
    t2 = time.perf_counter()
    return t1 - t0, t2 - t1


def timings(model, x, params, reps=20):
    for _ in range(3):
        step(model, x, params)
    sync()
    walls, fwd, bwd = [], [], []
    for _ in range(reps):
        sync()
        t = time.perf_counter()
        f, b = step(model, x, params)
        sync()
        walls.append(time.perf_counter() - t)
        fwd.append(f)
        bwd.append(b)
    med = lambda v: sorted(v)[len(v) // 2] * 1e3
    return med(walls), med(fwd), med(bwd)


def sync_warnings(model, x, params):
    torch.cuda.set_sync_debug_mode("warn")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        step(model, x, params)
    torch.cuda.set_sync_debug_mode("default")
    sync()
    return [str(w.message)[:160] for w in caught]


def api_profile(model, x, params, steps=5):
    sync()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            step(model, x, params)
        sync()
    api, kernels = {}, [0, 0.0]
    for e in prof.events():
        name = e.name
        if e.device_type == torch.autograd.DeviceType.CUDA:
            kernels[0] += 1
            kernels[1] += e.device_time_total if hasattr(e, "device_time_total") else e.cuda_time_total
        elif name.startswith(("cuda", "cu")) and not name.startswith("cudnn"):
            c = api.setdefault(name, [0, 0.0])
            c[0] += 1
            c[1] += e.cpu_time_total
    top = sorted(api.items(), key=lambda kv: -kv[1][1])[:10]
    return kernels[0] / steps, kernels[1] / steps / 1e3, [(n, c / steps, t / steps / 1e3) for n, (c, t) in top]


def main():
    cells = [tuple(int(v) for v in c.split(",")) for c in sys.argv[1:]] or [(4096, 1024), (1024, 2048), (1024, 1024)]
    torch.manual_seed(0)
    for T, H in cells:
        stack = fuseops_dense(H, "gelu").cuda().bfloat16()
        ref = torch_dense(stack).cuda().bfloat16()
        x = torch.randn(T, H, device="cuda", dtype=torch.bfloat16)
        for name, model in (("fuseops", stack), ("torch", ref)):
            params = list(model.parameters())
            wall, fwd, bwd = timings(model, x, params)
            caught = sync_warnings(model, x, params)
            n_k, busy, top = api_profile(model, x, params)
            print(f"T={T} H={H} {name:8} step {wall:.2f} ms; host fwd {fwd:.2f} bwd {bwd:.2f}; "
                  f"kernels {n_k:.0f} busy {busy:.2f} ms; sync warnings {len(caught)}", flush=True)
            for w in caught[:3]:
                print("   sync:", w)
            for n, c, t in top:
                print(f"   {n:40} {c:6.1f}/step {t:7.3f} ms/step")


if __name__ == "__main__":
    main()
