"""``create_graph=True`` through fuseops' own autograd Functions (the MoE routing, the expert
layer, a Sequential's plan): the first-order gradients are torch's, and every one of them sits
behind a node that raises if a second backward reaches it (``second_backward.py``). The tests
guard against three silent failures: under a plain cotangent, ``expert_layer``'s gradients and
``unpermute``'s weights gradient coming back as constants, so that a gradient penalty's second
backward runs and takes their derivatives as zero; with batched cotangents, the first backward
failing inside torch's vmap; and the raising node, linked to nothing, being left out by
``torch.autograd.grad(..., inputs, allow_unused=True)`` (``gradgradcheck``'s call), which then
returns None, a zero, for every second derivative."""

from __future__ import annotations

import gc
import weakref

import pytest
import torch

import fuseops
from fuseops import ops
from tests.helpers import cpu_and_cuda
from tests.ops.executor.test_batched_cotangents import (
    _close,
    _dense,
    _dtype,
    _experts,
    _moe_layers,
    _moe_reference,
    _routing,
)

MOE = ["composition", "expert_layer", "expert_layer_lean"]


def _moe(model, device):
    dtype = _dtype(device)
    experts = _experts(device, dtype)
    x, ids, weights = _routing(device, dtype)
    params = [experts[0].weight, experts[2].weight]
    return _moe_layers(experts, ids)[model], _moe_reference(experts, ids), [x, weights], params


@pytest.mark.parametrize("device", cpu_and_cuda())
@pytest.mark.parametrize("model", MOE)
def test_a_gradient_penalty_through_a_moe_layer_raises_never_drops_a_term(model, device):
    run, reference, args, params = _moe(model, device)
    leaves = [a.clone().requires_grad_() for a in args]
    y = run(*leaves)
    cotangent = torch.randn_like(y)
    got = torch.autograd.grad(y, [*leaves, *params], cotangent, create_graph=True)
    want = torch.autograd.grad(reference(*leaves), [*leaves, *params], cotangent)
    torch.testing.assert_close(got, want, **_close(device))
    for name, g in zip(["x", "weights", "w1", "w2"], got):
        assert g.requires_grad, f"the gradient of {name} came back a constant: a second backward would drop it"
        # The penalty with another term that does differentiate: the backward must not run
        # through with this gradient's derivatives taken as zero.
        with pytest.raises(RuntimeError, match="double backward"):
            (g.square().sum() + y.sum()).backward(retain_graph=True)


@pytest.mark.parametrize("device", cpu_and_cuda())
@pytest.mark.parametrize("model", ["dense", *MOE])
def test_create_graph_with_batched_cotangents_raises_naming_both(model, device):
    if model == "dense":
        seq, _, _ = _dense("gelu", True, device, _dtype(device))
        run, leaves = seq, [torch.randn(3, 8, device=device, dtype=_dtype(device), requires_grad=True)]
    else:
        run, _, args, _ = _moe(model, device)
        leaves = [a.clone().requires_grad_() for a in args]
    y = run(*leaves)
    cotangents = torch.randn(3, *y.shape, device=device, dtype=y.dtype)
    with pytest.raises(RuntimeError, match="create_graph=True with batched cotangents"):
        torch.autograd.grad(y, leaves, cotangents, is_grads_batched=True, create_graph=True)
    # Without create_graph the same call batches (test_batched_cotangents.py checks the values).
    torch.autograd.grad(run(*leaves), leaves, cotangents, is_grads_batched=True)


def _frozen_first_linear(device, dtype):
    # The frozen Linear saves nothing; GELU saves its input, an intermediate made from x.
    seq = fuseops.Sequential(ops.Linear(8, 8), ops.GELU(), ops.Linear(8, 8)).to(device, dtype)
    seq[0].requires_grad_(False)
    return seq


@pytest.mark.parametrize("device", cpu_and_cuda())
@pytest.mark.parametrize("model", ["dense", "frozen_first_linear", "residual", *MOE])
def test_a_second_derivative_asked_for_by_input_raises_never_returns_none(model, device):
    """``torch.autograd.grad(g, x, allow_unused=True)`` after ``create_graph=True``: the raising
    node must lie on the path to x, also where no op saved x (a frozen first Linear, a residual
    input, the expert layer's tokens), never be pruned away into a None."""
    dtype = _dtype(device)
    x = torch.randn(5, 8, device=device, dtype=dtype)
    if model == "dense":
        seq, _, _ = _dense("gelu", True, device, dtype)
        run = seq
    elif model == "frozen_first_linear":
        run = _frozen_first_linear(device, dtype)
    elif model == "residual":
        seq = fuseops.Sequential(ops.AddExtraInput(), ops.RMSNorm(8)).to(device, dtype)
        branch = torch.randn(5, 8, device=device, dtype=dtype)
        # x is the residual input (the extra one), which no op saves.
        run = lambda x: seq(branch, x)
    else:
        moe, _, args, _ = _moe(model, device)
        x, weights = args
        run = lambda x: moe(x, weights)
    x = x.clone().requires_grad_()
    y = run(x)
    (g,) = torch.autograd.grad(y, x, torch.randn_like(y), create_graph=True)
    with pytest.raises(RuntimeError, match="double backward"):
        torch.autograd.grad(g.square().sum(), x, allow_unused=True)


def test_gradgradcheck_raises_instead_of_a_wrong_second_derivative():
    seq, _, _ = _dense("swiglu", True, "cpu", torch.float64)
    with pytest.raises(RuntimeError, match="double backward"):
        torch.autograd.gradgradcheck(seq, (torch.randn(3, 8, dtype=torch.float64, requires_grad=True),))


def test_the_link_to_an_unsaved_input_keeps_none_of_its_memory_and_saves_nothing():
    # The residual input is not saved: its link must not keep it alive until the backward, as a
    # view of it would, nor save a tensor of its own (saved-tensor hooks, offloading's, see those).
    seq = fuseops.Sequential(ops.GELU(), ops.AddExtraInput())
    leaf = torch.randn(64, 8, requires_grad=True)
    residual = leaf * 2
    alive = weakref.ref(residual)
    packed = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: packed.append(t) or t, lambda t: t):
        y = seq(torch.randn(64, 8, requires_grad=True), residual)
    assert all(t.numel() for t in packed), "the link saved a tensor"
    del residual
    gc.collect()
    assert alive() is None, "the forward kept the unsaved residual input alive"
    y.sum().backward()
    torch.testing.assert_close(leaf.grad, torch.full_like(leaf, 2.0))


def test_create_graph_through_a_call_whose_unsaved_input_is_gone_raises():
    # Its gradient's dependence on that input cannot be linked: create_graph=True raises at once,
    # naming why (a first-order backward of the same graph runs).
    seq = fuseops.Sequential(ops.AddExtraInput(), ops.RMSNorm(8))
    leaf = torch.randn(5, 8, requires_grad=True)
    residual = leaf * 2
    y = seq(torch.randn(5, 8), residual)
    del residual
    gc.collect()
    with pytest.raises(RuntimeError, match="no longer referenced"):
        torch.autograd.grad(y.sum(), leaf, create_graph=True)
    (g,) = torch.autograd.grad(y.sum(), leaf)
    assert torch.isfinite(g).all()


@pytest.mark.parametrize("recipe", ["FP8CurrentScaling", "FP8Blockwise", "MXFP8", "NVFP4"])
def test_the_quantized_expert_layer_under_create_graph_is_right_then_raises(recipe):
    # QuantizedExpertLayer saves quantized buffers, not x: its link to x is an unsaved input's.
    from fuseops import moe
    from fuseops.quant import recipes

    experts = _experts("cpu", torch.bfloat16)
    x, ids, weights = _routing("cpu", torch.bfloat16)
    grads = []
    for create_graph in (False, True):
        leaf = x.clone().requires_grad_()
        with fuseops.autocast(recipe=getattr(recipes, recipe)()):
            y = moe.expert_layer(leaf, ids, weights, experts)
        grads.append(torch.autograd.grad(y, leaf, torch.ones_like(y), create_graph=create_graph)[0])
    assert torch.equal(grads[0], grads[1])
    with pytest.raises(RuntimeError, match="double backward"):
        torch.autograd.grad(grads[1].float().square().sum(), leaf, allow_unused=True)
