"""Session 20: host time of one fwd+bwd of the 4-block GELU stack at tiny shapes on CPU (T=16,
H=32), fuseops against the same torch model, eager and compiled (aot_eager, inductor): what the
compiled path costs on the host beyond the kernels. Output: compiled_host_cpu.txt.
    python benchmarks/results/session20/compiled_host_cpu.py
"""
import sys
import time

import torch

sys.path.insert(0, ".")
from benchmarks.sizes import fuseops_dense, torch_dense

T, H = 16, 32


def fastest_fwd_bwd_us(model, x, steps=300):
    """The fastest forward and the fastest backward host time over ``steps`` steps."""
    params = list(model.parameters())

    def step():
        for p in params:
            p.grad = None
        t0 = time.perf_counter()
        y = model(x)
        t1 = time.perf_counter()
        y.sum().backward()
        return t1 - t0, time.perf_counter() - t1

    for _ in range(20):
        step()
    times = [step() for _ in range(steps)]
    return min(t[0] for t in times) * 1e6, min(t[1] for t in times) * 1e6


def main():
    torch.manual_seed(0)
    fused = fuseops_dense(H, "gelu")
    models = {"fuseops": fused, "torch": torch_dense(fused)}
    x = torch.randn(T, H, requires_grad=True)
    for backend in ("aot_eager", "inductor", None):
        for name, model in models.items():
            torch._dynamo.reset()
            run = torch.compile(model, backend=backend) if backend else model
            fwd, bwd = fastest_fwd_bwd_us(run, x)
            print(f"{backend or 'eager':9s} {name:8s} host fwd {fwd:7.1f} us  bwd {bwd:7.1f} us")


if __name__ == "__main__":
    main()
