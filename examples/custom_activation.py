"""Declare your own activation once and get it fused into fuseops' GEMM epilogues.

Declares two activations fuseops does not ship: xIELU (fixed constants) and a clamped gated
softplus. Each is a ``@triton.jit`` element function returning the value and the derivative,
and a torch reference. Builds a dense block and an MoE expert MLP with them, prints the fused
plans, checks fused against unfused and against plain torch, runs the property tests that the
built-in activations pass (``fuseops.testing.check_activation``), and on CUDA times each against
the built-in nearest to it. The last line starts with ``OK``.

On a CPU the kernels run through Triton's interpreter (seconds at these sizes); on CUDA in bf16.
"""

from __future__ import annotations

import os

import torch

# Triton reads this when first imported: on a CPU the kernels run through its interpreter.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import contextlib  # noqa: E402
import copy  # noqa: E402

import torch.nn.functional as F  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

import fuseops  # noqa: E402
from fuseops import moe, ops  # noqa: E402
from fuseops.kernels.elementwise.element_functions import gelu_tanh, silu  # noqa: E402
from fuseops.testing import check_activation, interpreted_kernels  # noqa: E402

# xIELU (Huang and Schlag) with its learned scalars fixed: x > 0: ap x^2 + beta x;
# else: an (expm1(min(x, eps)) - x) + beta x.
AP, AN, BETA, EPS = 0.8, 0.8, 0.5, -1e-6


@triton.jit
def xielu(x):
    """``(f(x), f'(x))`` of a float32 tile."""
    pos = x > 0.0
    # torch.clamp keeps a NaN: so does this minimum.
    xm = tl.minimum(x, EPS, propagate_nan=tl.PropagateNan.ALL)
    e = tl.exp(xm)
    y = tl.where(pos, AP * x * x + BETA * x, AN * (e - 1.0 - x) + BETA * x)
    # Below 0 the derivative is an (exp(x) - 1) + beta up to eps, and beta - an above it.
    g = tl.where(pos, 2.0 * AP * x + BETA, AN * (tl.where(x <= EPS, e, 0.0) - 1.0) + BETA)
    # A NaN's derivative is NaN, as the reference's (the selects above gave it a number).
    g = tl.where(x == x, g, x)
    return y, g


def xielu_reference(x: torch.Tensor) -> torch.Tensor:
    return torch.where(x > 0, AP * x * x + BETA * x, AN * (torch.expm1(x.clamp(max=EPS)) - x) + BETA * x)


@triton.jit
def softplus(x):
    # log(1 + e^x) = max(x, 0) + log(1 + e^-|x|); its derivative is sigmoid(x).
    e = tl.exp(-tl.abs(x))
    y = tl.maximum(x, 0.0, propagate_nan=tl.PropagateNan.ALL) + tl.log(1.0 + e)
    s = tl.where(x >= 0.0, 1.0 / (1.0 + e), e / (1.0 + e))
    return y, s


# The unfused backward differentiates the reference; a torch derivative may be given instead
# (reference_grad=, as for the softplus below).
XIELU = ops.declare_activation("XIELU", kernel=xielu, reference=xielu_reference)
# y = softplus(min(a, 7)) * (clamp(b, -7, 7) + 1): gated, with gpt-oss's clamps.
SoftplusGLU = ops.declare_activation("SoftplusGLU", kernel=softplus, reference=F.softplus,
                                     reference_grad=torch.sigmoid, gated=True, limit=7.0)

H, FFN, EXPERTS, TOKENS = 32, 64, 4, 16


def dense_block(act: ops.BasicOp) -> fuseops.Sequential:
    return fuseops.Sequential(ops.RMSNorm(H), ops.Linear(H, FFN), act, ops.Linear(FFN, H), ops.AddExtraInput())


def torch_dense_block(block: fuseops.Sequential, x: torch.Tensor) -> torch.Tensor:
    """The same block in plain torch, from the block's parameters."""
    norm, fc1, _, fc2, _ = block
    h = F.rms_norm(x, (H,), norm.weight, norm.eps)
    return F.linear(xielu_reference(F.linear(h, fc1.weight, fc1.bias)), fc2.weight, fc2.bias) + x


def experts(act: ops.BasicOp) -> fuseops.Sequential:
    return fuseops.Sequential(ops.GroupedLinear(EXPERTS, H, 2 * FFN), act, ops.GroupedLinear(EXPERTS, FFN, H))


def torch_expert_layer(mlp: fuseops.Sequential, x, ids, weights) -> torch.Tensor:
    """``sum_k weights[t, k] * expert_{ids[t, k]}(x[t])`` token by token, in plain torch."""
    fc1, _, fc2 = mlp
    y = torch.zeros_like(x)
    for t in range(x.shape[0]):
        for k in range(ids.shape[1]):
            e = int(ids[t, k])
            a, b = F.linear(x[t], fc1.weight[e]).chunk(2, -1)
            h = F.softplus(a.clamp(max=7.0)) * (b.clamp(-7.0, 7.0) + 1)
            y[t] += weights[t, k] * F.linear(h, fc2.weight[e])
    return y


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm())


def grads(fn, model: torch.nn.Module, x: torch.Tensor) -> list[torch.Tensor]:
    x = x.detach().clone().requires_grad_()
    model.zero_grad(set_to_none=True)
    y = fn(model, x)
    y.backward(torch.ones_like(y))
    return [y.detach(), x.grad] + [p.grad for p in model.parameters()]


def agree(name: str, fn, model, x, torch_fn, tol: float) -> None:
    """Fused, unfused and plain torch (float64 for torch): outputs and every gradient."""
    unfused = copy.deepcopy(model)
    unfused.fuse = False
    oracle = copy.deepcopy(model).double()
    fused_g, unfused_g = grads(fn, model, x), grads(fn, unfused, x)
    torch_g = grads(lambda m, x: torch_fn(m, x), oracle, x.double())
    worst = max(max(rel(f, t), rel(u, t)) for f, u, t in zip(fused_g, unfused_g, torch_g, strict=True))
    print(f"{name}: fused and unfused against torch float64, worst relative error {worst:.1e}")
    assert worst < tol, (name, worst)


def bench(fn) -> float:
    return triton.testing.do_bench(fn, warmup=25, rep=200)


@triton.jit
def silu_1(x):
    return silu(x, 1.0)


def timings(device: torch.device) -> None:
    """Fused forward + backward of each declared activation against the built-in nearest to it,
    and of the built-ins re-declared from their own element functions against themselves (CUDA, bf16)."""
    dtype = torch.bfloat16
    gelu_again = ops.declare_activation("GELUTanhAgain", kernel=gelu_tanh,
                                        reference=lambda x: F.gelu(x, approximate="tanh"))
    swiglu_again = ops.declare_activation("SwiGLUAgain", kernel=silu_1, reference=F.silu, gated=True)
    x = torch.randn(16384, 4096, device=device, dtype=dtype, requires_grad=True)
    for act in (XIELU(), ops.SReLU(), gelu_again(), ops.GELU(approximate="tanh")):
        m = fuseops.Sequential(ops.Linear(4096, 4 * 4096), act, ops.Linear(4 * 4096, 4096)).to(device, dtype)
        print(f"dense block T=16384 H=4096, {type(act).__name__}: {bench(lambda: m(x).sum().backward()):.2f} ms")
    # Qwen3-30B-A3B's expert layer: 128 experts, H=2048, I=768, top-8.
    x = torch.randn(32768, 2048, device=device, dtype=dtype, requires_grad=True)
    ids = torch.stack([torch.randperm(128, device=device)[:8] for _ in range(64)]).repeat(512, 1)
    w = torch.softmax(torch.randn(32768, 8, device=device), -1)
    for act in (SoftplusGLU(), ops.ClampedSwiGLU(), swiglu_again(), ops.SwiGLU()):
        e = fuseops.Sequential(ops.GroupedLinear(128, 2048, 2 * 768), act, ops.GroupedLinear(128, 768, 2048))
        e = e.to(device, dtype)
        ms = bench(lambda: moe.expert_layer(x, ids, w, e).sum().backward())
        print(f"expert_layer T=32768 E=128 top-8, {type(act).__name__}: {ms:.2f} ms")


def main() -> None:
    torch.manual_seed(0)
    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    # On a CPU, fuseops runs the kernels' torch references unless asked for the interpreter.
    kernels = contextlib.nullcontext if cuda else interpreted_kernels
    dtype, tol = (torch.float32, 1e-4)

    block = dense_block(XIELU()).to(device, dtype)
    x = torch.randn(TOKENS, H, device=device, dtype=dtype)
    with kernels():
        agree("dense block", lambda m, x: m(x, x), block, x, torch_dense_block, tol)
    print("dense block plan, forward: ", block.plan.forward)
    print("dense block plan, backward:", block.plan.backward)

    mlp = experts(SoftplusGLU()).to(device, dtype)
    ids = torch.stack([torch.randperm(EXPERTS)[:2] for _ in range(TOKENS)]).to(device)
    weights = torch.softmax(torch.randn(TOKENS, 2, device=device), -1)
    with kernels():
        agree("MoE expert layer", lambda m, x: moe.expert_layer(x, ids, weights.to(x.dtype), m), mlp, x,
              lambda m, x: torch_expert_layer(m, x, ids, weights.double()), tol)
        split = torch.tensor([TOKENS // 2, 0, TOKENS // 4, TOKENS // 4], device=device)
        mlp(x, split, split).sum().backward()
    print("expert MLP plan, forward: ", mlp.plan.forward)
    print("expert MLP plan, backward:", mlp.plan.backward)

    for act in (XIELU, SoftplusGLU):
        check_activation(act, device=device.type)
        print(f"check_activation({act.__name__}): passed")
    if cuda:
        timings(device)
    print("OK: declared activations fused in the dense and grouped GEMM epilogues, forward and backward")


if __name__ == "__main__":
    main()
