"""Batched cotangents: ``torch.autograd.grad(..., is_grads_batched=True)`` and
``torch.autograd.functional.jacobian(..., vectorize=True)``, which batch the cotangents with
torch's older vmap (no torch.func level; only the gradients are batched tensors, without
storage). The ops' backward runs its references on them (``function.py``'s
``_backward_unrecorded``, the MoE routing's and ``expert_layer``'s backward): equal to torch.nn
(float64 on the CPU), to the same model's backward one cotangent at a time (float32 through
the Triton kernels: the interpreter on the CPU, CUDA's), eager and compiled; what cannot batch
raises (rather than "Cannot access data pointer" or a vmap error from inside a fuseops model)."""

from __future__ import annotations

import contextlib

import pytest
import torch
from torch.autograd.functional import jacobian

import fuseops
from fuseops import ops
from fuseops.kernels._triton import interpreted_kernels
from tests.helpers import cpu_and_cuda, grouped_swiglu_reference, kernel_devices, routed_tokens

REFUSED = "batched cotangents"


def _kernels(device):
    return interpreted_kernels() if device == "cpu" else contextlib.nullcontext()


def _close(device):
    # CUDA: float32, whose GEMMs (torch.nn's and the references') may take TF32.
    return {"rtol": 1e-10, "atol": 1e-10} if device == "cpu" else {"rtol": 2e-2, "atol": 2e-2}


def _dtype(device):
    return torch.float64 if device == "cpu" else torch.float32


# -- the models, each beside the same model in torch.nn or plain torch ---------------------------

def _dense(act, fuse, device, dtype):
    torch.manual_seed(0)
    gated = act == "swiglu"
    seq = fuseops.Sequential(ops.RMSNorm(8), ops.Linear(8, 24 if gated else 12),
                             ops.SwiGLU() if gated else ops.GELU("tanh"), ops.Linear(12, 8), fuse=fuse).to(device, dtype)
    norm = torch.nn.RMSNorm(8, eps=seq[0].eps).to(device, dtype)
    fc1, fc2 = torch.nn.Linear(8, 24 if gated else 12), torch.nn.Linear(12, 8)
    fc1, fc2 = fc1.to(device, dtype), fc2.to(device, dtype)
    with torch.no_grad():
        norm.weight.copy_(seq[0].weight)
        for mine, theirs in ((fc1, seq[1]), (fc2, seq[3])):
            mine.weight.copy_(theirs.weight), mine.bias.copy_(theirs.bias)

    def reference(x):
        z = fc1(norm(x))
        if gated:
            a, b = z.chunk(2, -1)
            return fc2(torch.nn.functional.silu(a) * b)
        return fc2(torch.nn.functional.gelu(z, approximate="tanh"))

    ref_params = [norm.weight, fc1.weight, fc1.bias, fc2.weight, fc2.bias]
    return seq, reference, ref_params


def _experts(device, dtype, E=3):
    torch.manual_seed(0)
    return fuseops.Sequential(ops.GroupedLinear(E, 8, 12), ops.SwiGLU(), ops.GroupedLinear(E, 6, 8)).to(device, dtype)


def _moe_reference(experts, ids):
    """``y[t] = sum_k weights[t, k] * expert_{ids[t, k]}(x[t])``, gathered per (token, k)."""
    w1, w2 = experts[0].weight, experts[2].weight

    def reference(x, weights):
        z = torch.einsum("th,tkfh->tkf", x, w1[ids])
        gate, up = z.chunk(2, -1)
        h = torch.nn.functional.silu(gate) * up
        return (torch.einsum("tkf,tkhf->tkh", h, w2[ids]) * weights[..., None]).sum(1)
    return reference


def _routing(device, dtype):
    return routed_tokens(device, dtype, E=3, T=5, seed=1)


def _composition(experts, ids, E=3):
    def layer(x, weights):
        x_sorted, splits, row_map = fuseops.moe.permute(x, ids, E)
        return fuseops.moe.unpermute(experts(x_sorted, splits, splits), row_map, weights)
    return layer


def _expert_layer(experts, ids, lean):
    def layer(x, weights):
        return fuseops.moe.expert_layer(x, ids, weights, experts, lean=lean)
    return layer


def _moe_layers(experts, ids):
    return {"composition": _composition(experts, ids), "expert_layer": _expert_layer(experts, ids, False),
            "expert_layer_lean": _expert_layer(experts, ids, True)}


# -- against torch.nn: the Jacobian, and every parameter's batched vector-Jacobian products ----

@pytest.mark.parametrize("device", cpu_and_cuda())
@pytest.mark.parametrize("fuse", [True, False], ids=["fused", "unfused"])
@pytest.mark.parametrize("act", ["gelu", "swiglu"])
def test_dense_jacobian_and_batched_grads_match_torch_nn(act, fuse, device):
    dtype = _dtype(device)
    seq, reference, ref_params = _dense(act, fuse, device, dtype)
    x = torch.randn(2, 3, 8, device=device, dtype=dtype)
    torch.testing.assert_close(jacobian(seq, x, vectorize=True), jacobian(reference, x, vectorize=True),
                               **_close(device))
    xx = x.clone().requires_grad_()
    y = seq(xx)
    cotangents = torch.randn(4, *y.shape, device=device, dtype=dtype)
    got = torch.autograd.grad(y, [xx, *seq.parameters()], cotangents, is_grads_batched=True)
    want = torch.autograd.grad(reference(xx), [xx, *ref_params], cotangents, is_grads_batched=True)
    torch.testing.assert_close(got, want, **_close(device))


@pytest.mark.parametrize("device", cpu_and_cuda())
@pytest.mark.parametrize("form", ["list", "tensor"])
def test_grouped_jacobian_matches_plain_torch(form, device):
    dtype = _dtype(device)
    experts = _experts(device, dtype)
    sizes = [2, 0, 3]
    splits = sizes if form == "list" else torch.tensor(sizes, device=device)
    x = torch.randn(5, 8, device=device, dtype=dtype)
    reference = grouped_swiglu_reference(experts, sizes)
    torch.testing.assert_close(jacobian(lambda x: experts(x, splits, splits), x, vectorize=True),
                               jacobian(reference, x, vectorize=True), **_close(device))
    xx = x.clone().requires_grad_()
    y = experts(xx, splits, splits)
    cotangents = torch.randn(3, *y.shape, device=device, dtype=dtype)
    params = [experts[0].weight, experts[2].weight]
    got = torch.autograd.grad(y, [xx, *params], cotangents, is_grads_batched=True)
    want = torch.autograd.grad(reference(xx), [xx, *params], cotangents, is_grads_batched=True)
    torch.testing.assert_close(got, want, **_close(device))


@pytest.mark.parametrize("device", cpu_and_cuda())
@pytest.mark.parametrize("layer", ["composition", "expert_layer", "expert_layer_lean"])
def test_moe_jacobian_matches_plain_torch(layer, device):
    """In ``x`` and the router weights; the expert layer's own Function (not its fallback)."""
    dtype = _dtype(device)
    experts = _experts(device, dtype)
    x, ids, weights = _routing(device, dtype)
    if layer != "composition":
        assert fuseops.moe.expert_layer_fallback(x, ids, weights, experts, lean=layer.endswith("lean")) is None
    run, reference = _moe_layers(experts, ids)[layer], _moe_reference(experts, ids)
    got = jacobian(run, (x, weights), vectorize=True)
    torch.testing.assert_close(got, jacobian(reference, (x, weights), vectorize=True), **_close(device))
    xx, ww = x.clone().requires_grad_(), weights.clone().requires_grad_()
    cotangents = torch.randn(3, *x.shape, device=device, dtype=dtype)
    params = [experts[0].weight, experts[2].weight]
    got = torch.autograd.grad(run(xx, ww), [xx, ww, *params], cotangents, is_grads_batched=True)
    want = torch.autograd.grad(reference(xx, ww), [xx, ww, *params], cotangents, is_grads_batched=True)
    torch.testing.assert_close(got, want, **_close(device))


@pytest.mark.parametrize("device", cpu_and_cuda())
@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
@pytest.mark.parametrize("model", ["dense", "composition", "expert_layer"])
def test_compiled_models_take_batched_cotangents(model, backend, device):
    """A compiled Sequential (its ops traced), the compiled MoE composition and expert layer, against torch.nn / plain torch; under
    inductor too, whose generated backward calls the operators with the batched cotangents as
    aot_eager's does. Where one raises, torch.nn's own compiled model must raise too: inductor's
    backward reads each input's data pointer on CUDA (its alignment check), which a batched
    cotangent has none of, and on the CPU has no batching rule for its ``mm.out``."""
    dtype = _dtype(device)
    torch._dynamo.reset()
    if model == "dense":
        seq, reference, _ = _dense("gelu", True, device, dtype)
        x = torch.randn(3, 8, device=device, dtype=dtype)
        args, run = (x,), torch.compile(seq, backend=backend, fullgraph=True)
    else:
        experts = _experts(device, dtype)
        x, ids, weights = _routing(device, dtype)
        args, reference = (x, weights), _moe_reference(experts, ids)
        run = torch.compile(_moe_layers(experts, ids)[model], backend=backend, fullgraph=True)
    leaves = [a.clone().requires_grad_() for a in args]
    y = run(*leaves)
    cotangents = torch.randn(4, *y.shape, device=device, dtype=dtype)
    try:
        got = torch.autograd.grad(y, leaves, cotangents, is_grads_batched=True)
    except RuntimeError:
        compiled_reference = torch.compile(reference, backend=backend)
        with pytest.raises(RuntimeError):
            torch.autograd.grad(compiled_reference(*leaves), leaves, cotangents, is_grads_batched=True)
        assert backend == "inductor", "aot_eager runs torch.nn's compiled models with batched cotangents"
        return
    want = torch.autograd.grad(reference(*leaves), leaves, cotangents, is_grads_batched=True)
    torch.testing.assert_close(got, want, **_close(device))


# -- through the Triton kernels: the batched backward equals the kernels' one at a time ----------

@pytest.mark.parametrize("device", kernel_devices())
@pytest.mark.parametrize("model", ["dense_gelu", "dense_swiglu", "grouped", "composition", "expert_layer"])
def test_batched_equals_one_cotangent_at_a_time_through_the_kernels(model, device):
    """The forward (and the loop's backward) on the Triton kernels in float32; the batched
    backward on the references; three calls of one signature (the first prepares the run, the
    later ones reuse it): a batched backward after each."""
    dtype = torch.float32
    with _kernels(device):
        if model.startswith("dense"):
            seq, _, _ = _dense(model.split("_")[1], True, device, dtype)
            x = torch.randn(6, 8, device=device, dtype=dtype)
            args, run = (x,), seq
        elif model == "grouped":
            experts = _experts(device, dtype)
            splits = torch.tensor([2, 0, 4], device=device)
            args, run = (torch.randn(6, 8, device=device, dtype=dtype),), lambda x: experts(x, splits, splits)
        else:
            experts = _experts(device, dtype)
            x, ids, weights = _routing(device, dtype)
            args, run = (x, weights), _moe_layers(experts, ids)[model]
        for _ in range(3):
            leaves = [a.clone().requires_grad_() for a in args]
            y = run(*leaves)
            cotangents = torch.randn(3, *y.shape, device=device, dtype=dtype)
            got = torch.autograd.grad(y, leaves, cotangents, is_grads_batched=True, retain_graph=True)
            loop = [torch.autograd.grad(y, leaves, c, retain_graph=True) for c in cotangents]
            want = [torch.stack(per_leaf) for per_leaf in zip(*loop)]
            torch.testing.assert_close(got, want, **({"rtol": 1e-5, "atol": 1e-5} if device == "cpu" else
                                                     {"rtol": 2e-2, "atol": 2e-2}))


# -- what cannot batch raises, naming why --------------------------------------------------------

def test_a_quantized_recipe_raises():
    torch.manual_seed(0)
    seq = fuseops.Sequential(ops.Linear(32, 64), ops.GELU(), ops.Linear(64, 32))
    experts = fuseops.Sequential(ops.GroupedLinear(2, 32, 64), ops.SwiGLU(), ops.GroupedLinear(2, 32, 32))
    x = torch.randn(16, 32, requires_grad=True)
    ids, weights = torch.randint(0, 2, (16, 2)), torch.rand(16, 2)
    for run in (seq, lambda x: fuseops.moe.expert_layer(x, ids, weights, experts)):
        with fuseops.autocast(recipe=fuseops.recipes.FP8CurrentScaling()):
            y = run(x)
        with pytest.raises(RuntimeError, match=f"{REFUSED}.*quantized recipe"):
            torch.autograd.grad(y, x, torch.randn(2, *y.shape), is_grads_batched=True)


def test_accumulate_into_main_grad_raises():
    torch.manual_seed(0)
    seq = fuseops.Sequential(ops.Linear(8, 8, accumulate_into_main_grad=True))
    experts = fuseops.Sequential(ops.GroupedLinear(2, 8, 12, accumulate_into_main_grad=True), ops.SwiGLU(),
                                 ops.GroupedLinear(2, 6, 8))
    for p in (*seq.parameters(), *experts.parameters()):
        p.main_grad = torch.zeros_like(p)
    x = torch.randn(4, 8, requires_grad=True)
    ids, weights = torch.randint(0, 2, (4, 2)), torch.rand(4, 2)
    for run, named in ((seq, r"op 0 \(Linear\)"), (lambda x: fuseops.moe.expert_layer(x, ids, weights, experts), "FC1")):
        y = run(x)
        with pytest.raises(RuntimeError, match=f"{REFUSED}.*{named} adds its weight gradient into main_grad"):
            torch.autograd.grad(y, x, torch.randn(2, *y.shape), is_grads_batched=True)
    assert all(not p.main_grad.any() for p in (*seq.parameters(), *experts.parameters()))
