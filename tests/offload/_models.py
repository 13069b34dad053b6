"""Models and one training step, shared by the CPU and GPU offload tests."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from fuseops.offload import offload_activations


def mlp_layers(n: int = 4, width: int = 32, hidden: int = 96, *, device="cpu", dtype=torch.float32, seed=0):
    """Pre-norm residual MLP blocks: ``h + W2 gelu(W1 norm(h))``."""
    torch.manual_seed(seed)
    return nn.ModuleList(
        nn.Sequential(nn.LayerNorm(width), nn.Linear(width, hidden), nn.GELU(), nn.Linear(hidden, width))
        for _ in range(n)
    ).to(device=device, dtype=dtype)


def fuseops_layers(n: int = 3, width: int = 32, hidden: int = 96, *, device="cpu", dtype=torch.float32, seed=0):
    import fuseops
    from fuseops import ops

    torch.manual_seed(seed)
    return nn.ModuleList(
        fuseops.Sequential(ops.RMSNorm(width), ops.Linear(width, hidden), ops.GELU(approximate="tanh"),
                           ops.Linear(hidden, width))
        for _ in range(n)
    ).to(device=device, dtype=dtype)


@dataclass
class Step:
    tensors: list[torch.Tensor]  # output, input grad, every parameter grad
    offload: Any  # the ActivationOffload handle, or None


def run_step(layers, x, offload: dict | None = None, *, groups: bool = True, residual: bool = True) -> Step:
    """Forward (one group per layer when ``groups``) and backward of a squared-mean loss.
    ``offload`` configs move everything (``group_budget_bytes=None``) unless they name a
    budget: these steps test the scheduling, the planner has tests of its own."""
    for p in layers.parameters():
        p.grad = None
    x = x.detach().requires_grad_()
    scope = offload_activations(**{"group_budget_bytes": None, **offload}) if offload is not None else contextlib.nullcontext()
    with scope as handle:
        h = x
        for layer in layers:
            group = handle.group() if handle is not None and groups else contextlib.nullcontext()
            with group:
                h = h + layer(h) if residual else layer(h)
    h.float().square().mean().backward()
    return Step([h.detach(), x.grad] + [p.grad for p in layers.parameters()], handle)


def assert_bitwise(got: Step, want: Step) -> None:
    assert len(got.tensors) == len(want.tensors)
    for i, (a, b) in enumerate(zip(got.tensors, want.tensors)):
        assert a is not None and b is not None, f"tensor {i}: missing gradient"
        assert a.dtype == b.dtype and a.shape == b.shape, f"tensor {i}: {a.dtype} {a.shape} vs {b.dtype} {b.shape}"
        assert torch.equal(a, b), f"tensor {i}: not bit-for-bit equal (max diff {(a - b).abs().max()})"


def offloaded_like_plain(model, x: torch.Tensor) -> Any:
    """A squared-sum step of ``model`` on ``x`` without, then with offloading (every tensor
    moves); asserts bit-equal outputs and input grads and returns the offload handle."""

    def step(offload: bool):
        xr = x.clone().requires_grad_()
        scope = offload_activations(min_tensor_bytes=0, keep_last=0, group_budget_bytes=None) if offload else contextlib.nullcontext()
        with scope as handle:
            y = model(xr)
        y.square().sum().backward()
        return y.detach(), xr.grad, handle

    y0, g0, _ = step(False)
    y1, g1, handle = step(True)
    assert torch.equal(y0, y1) and torch.equal(g0, g1)
    return handle
