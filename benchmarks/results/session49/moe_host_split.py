"""Session 49 probe (issue 20's MoE host target, 0.5 ms): an ``expert_layer`` step's drained issue time split into
its phases with both graphs kept, beside two floors measured in the same process: a toy autograd Function that
replays one captured graph in its forward and one in its backward (two weights, the same step), and the plain-torch
composition's issue time.

    python benchmarks/results/session49/moe_host_split.py [qwen3|olmoe] [T]
"""
import sys
import time
from collections import defaultdict

import torch

from benchmarks.sizes import MOE_SHAPES, FuseopsExpertLayer, FuseopsMoE, TorchMoE, moe_args, step_fn
from fuseops.moe import routing_graphs

spent = defaultdict(list)


def timed(name, fn):
    def wrapper(*args, **kwargs):
        start = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            spent[name].append(1e3 * (time.perf_counter() - start))
    return wrapper


def drained(step, reps=30):
    times = []
    for _ in range(reps):
        torch.cuda.synchronize()
        start = time.perf_counter()
        step()
        times.append(1e3 * (time.perf_counter() - start))
    torch.cuda.synchronize()
    return sorted(times)[reps // 2], min(times)


class _Toy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w1, w2, graphs):
        ctx.graphs = graphs
        graphs["fwd"].replay()
        return graphs["y"]

    @staticmethod
    def backward(ctx, dy):
        ctx.graphs["bwd"].replay()
        return ctx.graphs["dx"], ctx.graphs["dw1"], ctx.graphs["dw2"], None


def toy_step(T, H, I):
    x = torch.randn(T, H, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    w1 = torch.randn(H, I, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    w2 = torch.randn(I, H, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    graphs = {"fwd": torch.cuda.CUDAGraph(), "bwd": torch.cuda.CUDAGraph()}
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side), torch.no_grad():
        for _ in range(2):
            (x @ w1 @ w2)
        with torch.cuda.graph(graphs["fwd"]):
            graphs["y"] = torch.relu(x @ w1) @ w2
        with torch.cuda.graph(graphs["bwd"]):
            graphs["dx"], graphs["dw1"], graphs["dw2"] = x @ w1 @ w2, (x.T @ x)[:, :I] * 0, w2 * 2
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()

    def step():
        for p in (w1, w2):
            p.grad = None
        _Toy.apply(x, w1, w2, graphs).sum().backward()
    return step


def main():
    shape = sys.argv[1] if len(sys.argv) > 1 else "qwen3"
    T = int(sys.argv[2]) if len(sys.argv) > 2 else 1024
    E, H, I, K = MOE_SHAPES[shape]
    torch.manual_seed(0)
    mine = FuseopsMoE(E, H, I).to("cuda", torch.bfloat16)
    args = moe_args(T, E, H, K, False, "cuda", torch.bfloat16)
    model = FuseopsExpertLayer(mine)
    step = step_fn(model, args, list(model.parameters()))
    for _ in range(40):
        step()
    torch.cuda.synchronize()
    print(shape, T, {key[1]: [s.phase for s in kept] for key, kept in routing_graphs.states().items()})
    print(f"expert_layer step, drained issue: median/min {drained(step)} ms")
    layer = sys.modules["fuseops.moe.expert_layer"]._ExpertLayer
    forward, backward = layer.forward, layer.backward
    layer.forward = staticmethod(timed("Function.forward", forward))
    layer.backward = staticmethod(timed("Function.backward", backward))
    replay = torch.cuda.CUDAGraph.replay
    torch.cuda.CUDAGraph.replay = timed("CUDAGraph.replay", replay)
    call = routing_graphs.call
    routing_graphs.call = timed("routing_graphs.call", call)
    from fuseops.moe import expert_layer_steps
    expert_layer_steps.routing_graphs.call = routing_graphs.call

    def split_step():
        t0 = time.perf_counter()
        for p in model.parameters():
            p.grad = None
        y = model(*args)
        t1 = time.perf_counter()
        loss = y.sum()
        t2 = time.perf_counter()
        loss.backward()
        t3 = time.perf_counter()
        spent["step: params"].append(0)
        spent["step: model(*args)"].append(1e3 * (t1 - t0))
        spent["step: sum"].append(1e3 * (t2 - t1))
        spent["step: backward()"].append(1e3 * (t3 - t2))
        spent["step: total"].append(1e3 * (t3 - t0))
    print(f"instrumented step, drained: {drained(split_step)}")
    for name, values in sorted(spent.items()):
        values = sorted(values)
        print(f"  {name:28s} n={len(values):3d} median {values[len(values) // 2]:.4f} ms  min {values[0]:.4f}")
    layer.forward, layer.backward, torch.cuda.CUDAGraph.replay = forward, backward, replay
    routing_graphs.call = expert_layer_steps.routing_graphs.call = call
    toy = toy_step(T, H, I)
    for _ in range(10):
        toy()
    print(f"toy Function, one graph each way: median/min {drained(toy)} ms")
    torch_model = TorchMoE(mine)
    torch_step = step_fn(torch_model, args, list(torch_model.parameters()))
    for _ in range(10):
        torch_step()
    print(f"torch composition, eager: median/min {drained(torch_step)} ms")


if __name__ == "__main__":
    main()
