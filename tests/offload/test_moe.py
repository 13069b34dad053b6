"""Offload inside a stack of expert layers (route, permute, grouped MLP, unpermute) with
the default budget and a memory target, bf16 and under FP8 recipes: gradients bit for
bit, the same bytes moved from the first step, on CPU and on the GPU."""

import contextlib

import pytest
import torch
from torch import nn

import fuseops
from fuseops import ops
from fuseops.offload import offload_activations
from fuseops.quant import recipes

RECIPES = [None, recipes.FP8CurrentScaling(), recipes.MXFP8()]


class MoELayer(nn.Module):
    """``h + unpermute(experts(permute(h)), probs)`` with a top-k softmax router."""

    def __init__(self, hidden: int, ffn: int, experts: int, top_k: int) -> None:
        super().__init__()
        self.router = nn.Linear(hidden, experts, bias=False)
        self.experts = fuseops.Sequential(
            ops.GroupedLinear(experts, hidden, 2 * ffn), ops.SwiGLU(), ops.GroupedLinear(experts, ffn, hidden))
        self.num_experts, self.top_k = experts, top_k

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        probs, ids = self.router(h).float().softmax(-1).topk(self.top_k, dim=-1)
        x_sorted, splits, row_map = fuseops.moe.permute(h, ids, self.num_experts)
        y = self.experts(x_sorted, splits, splits)
        return h + fuseops.moe.unpermute(y, row_map, probs.to(h.dtype))


def moe_stack(n, hidden, ffn, experts, top_k, *, device="cpu", dtype=torch.bfloat16):
    torch.manual_seed(0)
    return nn.ModuleList(MoELayer(hidden, ffn, experts, top_k) for _ in range(n)).to(device=device, dtype=dtype)


def moe_step(layers, x, recipe, offload):
    """Output, input grad and every parameter grad of one step, and the offload stats."""
    for p in layers.parameters():
        p.grad = None
    xr = x.clone().requires_grad_()
    scope = offload_activations(**offload) if offload is not None else contextlib.nullcontext()
    with scope as handle, fuseops.autocast(recipe=recipe):
        h = xr
        for layer in layers:
            with handle.group() if handle is not None else contextlib.nullcontext():
                h = layer(h)
    h.float().square().mean().backward()
    return [h.detach(), xr.grad] + [p.grad for p in layers.parameters()], handle.stats if handle else None


def assert_same(got, want):
    assert len(got) == len(want)
    for i, (a, b) in enumerate(zip(got, want)):
        assert a is not None and torch.equal(a, b), f"tensor {i} differs"


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda r: type(r).__name__ if r else "bf16")
def test_moe_stack_with_the_default_budget_is_bitwise_and_the_same_from_step_one(recipe):
    layers = moe_stack(3, 64, 48, 4, 2)
    x = torch.randn(64, 64, dtype=torch.bfloat16)
    want, _ = moe_step(layers, x, recipe, None)
    # A slow stated link: each group hides part of what it saves (its router's and
    # experts' FLOPs at the CPU's stated rate), not all of it.
    config = dict(min_tensor_bytes=0, link_bytes_per_s=2e7)
    moved = []
    for _ in range(3):
        got, stats = moe_step(layers, x, recipe, config)
        assert_same(got, want)
        assert stats["bytes_offloaded"] == stats["bytes_reloaded"]
        moved.append(stats["bytes_offloaded"])
    assert moved[0] == moved[1] == moved[2] > 0
    everything = moe_step(layers, x, recipe, dict(min_tensor_bytes=0, group_budget_bytes=None))
    assert_same(everything[0], want)
    assert everything[1]["bytes_offloaded"] > moved[0]


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda r: type(r).__name__ if r else "bf16")
def test_moe_stack_under_a_memory_target_is_bitwise_and_holds_it(recipe):
    layers = moe_stack(4, 64, 48, 4, 2)
    # Enough tokens that activations, not weight gradients, make the peak.
    x = torch.randn(512, 64, dtype=torch.bfloat16)
    want, _ = moe_step(layers, x, recipe, None)
    base = dict(min_tensor_bytes=0, link_bytes_per_s=1.0)
    _, kept = moe_step(layers, x, recipe, base)
    _, moved = moe_step(layers, x, recipe, dict(base, group_budget_bytes=None))
    assert moved["peak_bytes"] < kept["peak_bytes"]
    target = (kept["peak_bytes"] + moved["peak_bytes"]) // 2
    for _ in range(2):
        got, stats = moe_step(layers, x, recipe, dict(base, peak_bytes_target=target))
        assert_same(got, want)
        assert stats["peak_bytes"] <= target and stats["bytes_for_target"] == stats["bytes_offloaded"] > 0


@pytest.mark.gpu
@pytest.mark.parametrize("recipe", RECIPES, ids=lambda r: type(r).__name__ if r else "bf16")
def test_cuda_moe_stack_with_the_default_budget_is_bitwise(recipe):
    layers = moe_stack(4, 1024, 1408, 8, 2, device="cuda")
    x = torch.randn(4096, 1024, device="cuda", dtype=torch.bfloat16)
    want, _ = moe_step(layers, x, recipe, None)
    moved = []
    for config in (dict(), dict(), dict(), dict(group_budget_bytes=None)):
        got, stats = moe_step(layers, x, recipe, config)
        assert_same(got, want)
        assert stats["bytes_offloaded"] == stats["bytes_reloaded"]
        moved.append(stats["bytes_offloaded"])
    # The default moves the same from the first step; the last, moving everything, moved
    # every group but the kept one.
    assert moved[0] == moved[1] == moved[2] and moved[3] > 0 and stats["skipped_budget"] == 0
