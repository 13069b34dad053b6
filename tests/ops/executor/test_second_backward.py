"""``create_graph=True`` through fuseops' own autograd Functions (the MoE routing, the expert
layer, a Sequential's plan): the first-order gradients are torch's, and every one of them sits
behind a node that raises if a second backward reaches it (``second_backward.py``). Session 61:
under a plain cotangent ``expert_layer``'s gradients and ``unpermute``'s weights gradient came
back as constants, so a gradient penalty's second backward ran and took their derivatives as
zero; with batched cotangents the first backward failed inside torch's vmap."""

from __future__ import annotations

import pytest
import torch

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
