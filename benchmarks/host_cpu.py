"""Host microseconds per call of one block on CPU at tiny shapes, fuseops beside the same block
in torch eager: the executor's own Python, with the torch references in place of the kernels
(issue 20: the host path; at these sizes the arithmetic is a few microseconds).

Rows: the dense block (RMSNorm, Linear+bias, GELU(tanh), Linear+bias, AddExtraInput) forward
without grad, forward with grad, forward+backward; the grouped expert MLP (GroupedLinear,
SwiGLU, GroupedLinear, split sizes as a tensor on the input's device) forward+backward; the
MoE layer as users compose it (``benchmarks.sizes.FuseopsMoE``: ``rows`` tokens routed top-2
over 4 experts, permute, the expert MLP with I = 2H, unpermute with router weights)
forward+backward, and the same experts through ``fuseops.moe.expert_layer`` (one autograd
Function), beside the plain torch layer (``TorchMoE``: argsort routing,
``torch._grouped_mm``, index_add; never stubbed). ``--profile`` adds a cProfile of the
fwd+bwd steps. ``--stub-kernels`` replaces every
launcher of the dispatch table by a stub that hands back the outputs of its first call with
the same arguments (tensors by shape): what is left is the host path alone (ours and torch's: the plain
GEMMs of Linear stay), as ``host_costs``' rows without Triton launches on the GPU.

    python -m benchmarks.host_cpu [--rows 16] [--H 32] [--profile dense|grouped|moe|layer] [--top 30] [--stub-kernels]
"""

from __future__ import annotations

import argparse
import functools
import time
from collections.abc import Callable

import torch

import fuseops
from benchmarks._timing import profile_table, profiled
from fuseops import ops


def host_us(fn: Callable[[], object], calls: int = 2000, batch: int = 100) -> float:
    """Microseconds per call: the fastest batch of ``batch`` calls (the host is shared: the
    fastest batch is what the code costs when nothing interferes)."""
    for _ in range(50):
        fn()
    best = float("inf")
    for _ in range(calls // batch):
        start = time.perf_counter()
        for _ in range(batch):
            fn()
        best = min(best, (time.perf_counter() - start) * 1e6 / batch)
    return best


def stub_kernels() -> None:
    """Every dispatch-table launcher answers with the outputs of its first call with the same
    arguments (tensors by shape) (the arithmetic is gone; outputs are stale, gradients meaningless)."""
    from fuseops.kernels import dispatch

    real = dispatch._callable

    def stub(kernel, backend):
        run, memo = real(kernel, backend), {}

        def replay(*args, **kwargs):
            key = tuple(a.shape if isinstance(a, torch.Tensor) else a for a in (*args, *kwargs.values()))
            if key not in memo:
                memo[key] = run(*args, **kwargs)
            return memo[key]
        return replay
    dispatch._callable = functools.cache(stub)


def dense_block(H: int) -> tuple[fuseops.Sequential, torch.nn.Module]:
    block = fuseops.Sequential(ops.RMSNorm(H), ops.Linear(H, 4 * H), ops.GELU(approximate="tanh"),
                               ops.Linear(4 * H, H), ops.AddExtraInput())
    ref = torch.nn.Sequential(torch.nn.RMSNorm(H), torch.nn.Linear(H, 4 * H), torch.nn.GELU(approximate="tanh"),
                              torch.nn.Linear(4 * H, H))
    return block, ref


def moe_layer(T: int, H: int, E: int, I: int, K: int = 2
              ) -> tuple[torch.nn.Module, torch.nn.Module, tuple[torch.Tensor, ...]]:
    """``benchmarks.sizes``' MoE layer and its plain-torch twin, with T tokens routed top-K."""
    from benchmarks.sizes import FuseopsMoE, TorchMoE, routing
    model = FuseopsMoE(E, H, I)
    ids, weights = routing(T, E, K, False, "cpu")
    x = torch.randn(T, H, requires_grad=True)
    return model, TorchMoE(model), (x, ids, weights.requires_grad_())


def step(model: Callable, params: list[torch.Tensor], *inputs: object) -> Callable[[], None]:
    def run() -> None:
        for p in params:
            p.grad = None
        out = model(*inputs)
        out.sum().backward()
    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=16)
    parser.add_argument("--H", type=int, default=32)
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--profile", choices=("dense", "grouped", "moe", "layer"), default=None)
    parser.add_argument("--top", type=int, default=30)
    parser.add_argument("--stub-kernels", action="store_true")
    args = parser.parse_args()
    if args.stub_kernels:
        stub_kernels()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    H, M = args.H, args.rows
    block, ref = dense_block(H)
    x = torch.randn(M, H)
    xg = x.clone().requires_grad_()
    G, I = 4, 2 * H
    experts = fuseops.Sequential(ops.GroupedLinear(G, H, 2 * I), ops.SwiGLU(), ops.GroupedLinear(G, I, H))
    sizes = torch.tensor([M // 4, M // 2, 0, M - M // 4 - M // 2])
    rows: dict[str, float] = {}
    with torch.no_grad():
        rows["fuseops dense fwd, no grad"] = host_us(lambda: block(x, x), args.calls)
        rows["torch dense fwd, no grad"] = host_us(lambda: ref(x) + x, args.calls)
    rows["fuseops dense fwd"] = host_us(lambda: block(xg, xg), args.calls)
    rows["torch dense fwd"] = host_us(lambda: ref(xg) + xg, args.calls)
    dense_step = step(block, list(block.parameters()), xg, xg)
    rows["fuseops dense fwd+bwd"] = host_us(dense_step, args.calls)
    rows["torch dense fwd+bwd"] = host_us(step(lambda t: ref(t) + t, list(ref.parameters()), xg), args.calls)
    grouped_step = step(experts, list(experts.parameters()), xg, sizes, sizes)
    with torch.no_grad():
        rows["fuseops grouped fwd, no grad"] = host_us(lambda: experts(x, sizes, sizes), args.calls)
    rows["fuseops grouped fwd"] = host_us(lambda: experts(xg, sizes, sizes), args.calls)
    rows["fuseops grouped fwd+bwd"] = host_us(grouped_step, args.calls)
    moe, moe_ref, moe_inputs = moe_layer(M, H, G, I)
    moe_step = step(moe, list(moe.parameters()), *moe_inputs)
    rows["fuseops MoE layer fwd+bwd"] = host_us(moe_step, args.calls)
    from benchmarks.sizes import FuseopsExpertLayer
    layer = FuseopsExpertLayer(moe)
    layer_step = step(layer, list(layer.parameters()), *moe_inputs)
    rows["fuseops expert_layer fwd+bwd"] = host_us(layer_step, args.calls)
    rows["torch MoE layer fwd+bwd"] = host_us(step(moe_ref, list(moe_ref.parameters()), *moe_inputs), args.calls)
    stubbed = ", kernels stubbed" if args.stub_kernels else ""
    print(f"host us per call on CPU, rows={M}, H={H} (fastest batch of 100{stubbed})")
    for name, us in rows.items():
        print(f"  {name:36s} {us:8.1f}")
    if args.profile:
        run = {"dense": dense_step, "grouped": grouped_step, "moe": moe_step, "layer": layer_step}[args.profile]
        prof = profiled(run, 500)
        for key in ("tottime", "cumulative"):
            print(profile_table(prof, key, args.top))


if __name__ == "__main__":
    main()
