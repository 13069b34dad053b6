"""Session 49 calibration: the device host's floor for an autograd Function step (apply, sum, backward) with CPU
tensors, with CUDA tensors and no kernels of its own, and the expert layer's Python checks, to compare with this
machine's numbers (toy on the 2-core CPU: 22 us; the checks 0.3-3 us each).

    python benchmarks/results/session49/host_floor.py
"""
import sys
import time

import torch

from benchmarks.sizes import FuseopsMoE, moe_args


class _Toy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w1, w2, g):
        ctx.g = g
        return g["y"]

    @staticmethod
    def backward(ctx, dy):
        return ctx.g["dx"], ctx.g["dw1"], ctx.g["dw2"], None


def toy(device):
    x = torch.randn(16, 64, device=device, requires_grad=True)
    w1 = torch.randn(64, 32, device=device, requires_grad=True)
    w2 = torch.randn(32, 64, device=device, requires_grad=True)
    g = {"y": torch.randn(16, 64, device=device), "dx": torch.randn(16, 64, device=device),
         "dw1": torch.randn(64, 32, device=device), "dw2": torch.randn(32, 64, device=device)}

    def step():
        w1.grad = w2.grad = x.grad = None
        _Toy.apply(x, w1, w2, g).sum().backward()
    for _ in range(100):
        step()
    times = []
    for _ in range(400):
        if device == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        step()
        times.append(1e6 * (time.perf_counter() - start))
    times.sort()
    print(f"toy step on {device}: median {times[200]:.1f} us, min {times[0]:.1f}")


def checks():
    em = sys.modules["fuseops.moe.expert_layer"]
    from fuseops.moe.routing import check_routing
    torch.manual_seed(0)
    experts = FuseopsMoE(8, 64, 32).experts
    x, ids, _ = moe_args(16, 8, 64, 2, False, "cpu", torch.float32)
    parts = em._parts(experts)
    for name, fn in (("_parts", lambda: em._parts(experts)), ("check_routing", lambda: check_routing(x, ids, 8)),
                     ("_fallback", lambda: em._fallback(x, experts, parts, False, None))):
        for _ in range(50):
            fn()
        start = time.perf_counter()
        for _ in range(2000):
            fn()
        print(f"{name}: {1e6 * (time.perf_counter() - start) / 2000:.2f} us")


if __name__ == "__main__":
    toy("cpu")
    toy("cuda")
    toy("cpu")
    toy("cuda")
    checks()
