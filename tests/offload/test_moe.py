"""Offload inside a stack of expert layers (route, permute, grouped MLP, unpermute) with
the default budget, bf16 and under FP8 recipes: gradients bit for bit, on CPU under the
fake clock (so "auto" plans) and on the GPU under CUDA events."""

import contextlib

import pytest
import torch
from torch import nn

import fuseops
from fuseops import ops
from fuseops.offload import offload_activations
from fuseops.offload import planner as planner_module
from fuseops.offload.planner import Planner
from fuseops.quant import recipes
from tests.offload.test_planner import FakeTimer, Timed

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
def test_moe_stack_with_the_default_budget_is_bitwise(monkeypatch, recipe):
    timer = FakeTimer()
    monkeypatch.setitem(planner_module._planners, torch.device("cpu"), Planner(timer, bytes_per_s=10e6))
    times = [[3e-3] * 3, [6e-3] * 3]
    layers = nn.ModuleList(Timed(layer, timer, times, i) for i, layer in enumerate(moe_stack(3, 64, 48, 4, 2)))
    x = torch.randn(64, 64, dtype=torch.bfloat16)
    want, _ = moe_step(layers, x, recipe, None)
    moved = []
    for _ in range(5):
        got, stats = moe_step(layers, x, recipe, dict(min_tensor_bytes=0))
        assert_same(got, want)
        assert stats["bytes_offloaded"] == stats["bytes_reloaded"]
        moved.append((stats["bytes_offloaded"], stats["skipped_learning"]))
    # Two steps learn; then what fits 3 ms x 10 MB/s x 0.9 per group moves, not all (the
    # first planned step's budgets are provisional: planned afresh once it is digested).
    assert moved[0][0] == moved[1][0] == 0 and moved[0][1] > 0
    assert moved[3] == moved[4] and moved[2][0] > 0 and moved[2][1] == moved[3][1] == 0
    everything = moe_step(layers, x, recipe, dict(min_tensor_bytes=0, group_budget_bytes=None))
    assert_same(everything[0], want)
    assert everything[1]["bytes_offloaded"] > moved[3][0]


@pytest.mark.gpu
@pytest.mark.parametrize("recipe", RECIPES, ids=lambda r: type(r).__name__ if r else "bf16")
def test_cuda_moe_stack_with_the_default_budget_is_bitwise(recipe):
    layers = moe_stack(4, 1024, 1408, 8, 2, device="cuda")
    x = torch.randn(4096, 1024, device="cuda", dtype=torch.bfloat16)
    want, _ = moe_step(layers, x, recipe, None)
    for config in (dict(), dict(), dict(), dict(), dict(group_budget_bytes=None)):
        got, stats = moe_step(layers, x, recipe, config)
        assert_same(got, want)
        assert stats["bytes_offloaded"] == stats["bytes_reloaded"]
    # The last, moving everything, moved every group but the kept one.
    assert stats["bytes_offloaded"] > 0 and stats["skipped_budget"] == stats["skipped_learning"] == 0
