"""Offload under quantized recipes on CPU: fuseops' quantized and grouped storages move
buffer by buffer, bit for bit; marked ones stay, every buffer of them."""

from dataclasses import dataclass

import pytest
import torch

import fuseops
from fuseops import ops
from fuseops.offload import host_arena, mark_not_offload, offload_activations
from fuseops.ops import BasicOp, OpGrads, Saved
from fuseops.ops.contract import activation
from fuseops.quant import recipes
from fuseops.quant.storage import GroupedQuantizedTensor, QuantizedTensor
from tests.offload._models import offloaded_like_plain

RECIPES = [recipes.FP8CurrentScaling(), recipes.FP8Blockwise(), recipes.MXFP8(), recipes.NVFP4()]
SPLITS = [32, 0, 64, 32]


def dense_mlp():
    return fuseops.Sequential(ops.RMSNorm(64), ops.Linear(64, 128), ops.GELU(approximate="tanh"), ops.Linear(128, 64))


def grouped_mlp():
    return fuseops.Sequential(ops.GroupedLinear(4, 64, 2 * 48), ops.SwiGLU(), ops.GroupedLinear(4, 48, 64))


def saved_activations(model, x, extras, recipe):
    """What autograd saves in one forward, but parameters and the leaf input: (tensors,
    bytes of their distinct storages, whether any is a quantized buffer)."""
    tensors, storages = 0, {}

    def pack(t):
        nonlocal tensors
        base = t if t._base is None else t._base
        if not isinstance(base, torch.nn.Parameter) and not (base.is_leaf and base.requires_grad):
            tensors += 1
            storages[t.untyped_storage()._cdata] = t
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), fuseops.autocast(recipe=recipe):
        model(x.clone().requires_grad_(), *extras)
    quantized = any(t.dtype in (torch.uint8, torch.float8_e4m3fn, torch.float8_e5m2) for t in storages.values())
    return tensors, sum(t.untyped_storage().nbytes() for t in storages.values()), quantized


@pytest.mark.parametrize("make, extras", [(dense_mlp, []), (grouped_mlp, [SPLITS, SPLITS])], ids=["dense", "grouped"])
@pytest.mark.parametrize("recipe", RECIPES, ids=lambda r: type(r).__name__)
def test_quantized_mlps_are_bitwise_and_move_every_buffer(make, extras, recipe):
    torch.manual_seed(0)
    model, x = make(), torch.randn(128, 64)

    def step(offload):
        for p in model.parameters():
            p.grad = None
        xr = x.clone().requires_grad_()
        with offload_activations(min_tensor_bytes=0, keep_last=0, group_budget_bytes=None) if offload else torch.enable_grad() as handle:
            with fuseops.autocast(recipe=recipe):
                y = model(xr, *extras)
        y.square().sum().backward()
        return [y.detach(), xr.grad] + [p.grad for p in model.parameters()], handle

    lent = host_arena("cpu").lent_bytes
    want, _ = step(False)
    got, handle = step(True)
    assert all(torch.equal(a, b) for a, b in zip(got, want))
    assert host_arena("cpu").lent_bytes == lent
    tensors, nbytes, quantized = saved_activations(model, x, extras, recipe)
    assert quantized
    stats = handle.stats
    assert stats["tensors_offloaded"] == tensors
    assert stats["bytes_offloaded"] == stats["bytes_reloaded"] == nbytes


@dataclass(frozen=True)
class QuantizedSaved(Saved):
    q: QuantizedTensor | None = activation()


class SaveQuantized(BasicOp):
    """``y = x * dequantize(quantize(x))``, saving the storage (grouped: rows in two
    groups, a ``GroupedQuantizedTensor``) as an activation, marked or not."""

    def __init__(self, *, grouped: bool, mark: bool):
        super().__init__()
        self.grouped, self.mark = grouped, mark

    def op_forward(self, ctx, x, extra_inputs):
        offsets = torch.tensor([0, 100, x.shape[0]]) if self.grouped else None
        q = fuseops.quantize(x.detach(), recipes.NVFP4(), columnwise=not self.grouped, offsets=offsets)
        if self.mark:
            mark_not_offload(q)
        if ctx.needs_backward:
            ctx.saved = QuantizedSaved(q=q)
        return x * q.dequantize(), ()

    def op_backward(self, ctx, dy, extra_output_grads):
        return OpGrads(dy * ctx.saved.q.dequantize())


@pytest.mark.parametrize("mark", [False, True], ids=["unmarked", "marked"])
@pytest.mark.parametrize("grouped", [False, True], ids=["quantized", "grouped"])
def test_real_storages_move_or_stay_buffer_by_buffer(grouped, mark):
    model = fuseops.Sequential(SaveQuantized(grouped=grouped, mark=mark), ops.Identity())
    x = torch.randn(256, 64)
    storage = fuseops.quantize(x, recipes.NVFP4(), columnwise=not grouped,
                               offsets=torch.tensor([0, 100, 256]) if grouped else None)
    assert isinstance(storage, GroupedQuantizedTensor) == grouped
    buffers = storage.data_tensors()
    # data, scale, tensor_scale; the column-wise copy (data_t, scale_t), or the offsets.
    assert len(buffers) == (4 if grouped else 5)

    stats = offloaded_like_plain(model, x).stats
    if mark:
        assert stats["skipped_marked"] == len(buffers) and stats["bytes_offloaded"] == 0
    else:
        assert stats["tensors_offloaded"] == len(buffers)
        moved = sum(b.untyped_storage().nbytes() for b in buffers)
        assert stats["bytes_offloaded"] == stats["bytes_reloaded"] == moved


@pytest.mark.parametrize("make, extras", [(dense_mlp, []), (grouped_mlp, [[s * 8 for s in SPLITS]] * 2)],
                         ids=["dense", "grouped"])
@pytest.mark.parametrize("recipe", RECIPES[:2], ids=lambda r: type(r).__name__)
def test_quantized_stacks_under_a_memory_target_hold_it_from_the_first_step(make, extras, recipe):
    # Four blocks, each its own group, their quantized buffers counted in the account;
    # enough rows that activations, not weight gradients, make the peak.
    torch.manual_seed(0)
    blocks, x = torch.nn.ModuleList(make() for _ in range(4)), torch.randn(1024, 64)

    def step(config):
        for p in blocks.parameters():
            p.grad = None
        xr = x.clone().requires_grad_()
        with offload_activations(min_tensor_bytes=0, link_bytes_per_s=1.0, **config) as handle:
            with fuseops.autocast(recipe=recipe):
                h = xr
                for b in blocks:
                    h = h + b(h, *extras)
        h.square().mean().backward()
        return [xr.grad] + [p.grad for p in blocks.parameters()], handle.stats

    kept, moved = step({})[1], step(dict(group_budget_bytes=None))[1]
    assert moved["peak_bytes"] < kept["peak_bytes"]
    target = (kept["peak_bytes"] + moved["peak_bytes"]) // 2
    runs = [step(dict(peak_bytes_target=target)) for _ in range(2)]
    want = step(dict(enabled=False))[0]
    for grads, stats in runs:
        assert all(torch.equal(a, b) for a, b in zip(grads, want))
        assert stats["peak_bytes"] <= target and stats["bytes_for_target"] > 0
    assert runs[0][1]["bytes_offloaded"] == runs[1][1]["bytes_offloaded"]
