"""Forward-mode and higher-order derivatives (``fuseops/ops/executor/plain_autograd.py``):
``torch.func.jvp``, ``jacfwd``, ``hessian``, grad of grad and ``torch.autograd.forward_ad``
through fuseops models equal the same models built from torch.nn (float64 on the CPU), for
every basic op and every fusion's ops, dense, grouped and MoE; what they cannot do raises."""

from __future__ import annotations

import contextlib

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.autograd import forward_ad
from torch.utils._pytree import tree_flatten, tree_map

import fuseops
from fuseops import ops
from fuseops.fusions import REGISTRY
from fuseops.fusions.fusion import OpMatch
from fuseops.kernels._triton import interpreted_kernels
from tests.fusions.op_strategies import BUILDERS, op_chain
from tests.helpers import cpu_and_cuda, grouped_swiglu_reference, kernel_devices, routed_tokens


def _close(device):
    # CUDA: float32, whose GEMMs (torch.nn's and the references') may take TF32.
    return {"rtol": 1e-12, "atol": 1e-12} if device == "cpu" else {"rtol": 2e-2, "atol": 2e-2}


def _dtype(device):
    return torch.float64 if device == "cpu" else torch.float32


# -- every op and every fusion's ops: forward mode equals the reverse-mode Jacobian -------------

# Each fusion's pattern, and each basic op alone (the property suite's builders).
PATTERNS = [(f.name, f.pattern) for f in REGISTRY] + [
    (cls.__name__, (OpMatch((cls,)),)) for cls in sorted(BUILDERS, key=lambda c: c.__name__)]


@pytest.mark.parametrize("pattern", [p for _, p in PATTERNS], ids=[name for name, _ in PATTERNS])
@settings(max_examples=6, deadline=None)
@given(data=st.data())
def test_forward_mode_equals_the_reverse_mode_jacobian(pattern, data):
    """``jacfwd`` (forward mode, torch differentiating the references) against ``jacrev`` (the
    ops' own backward, which the property suite checks against float64 references), in the
    input, every float extra input and every parameter; outputs and extra outputs."""
    in_features, specs = data.draw(op_chain(pattern), label="ops")
    lead = data.draw(st.sampled_from([(3,), (2, 2), (1,)]), label="leading shape")
    torch.manual_seed(data.draw(st.integers(0, 2**16), label="seed"))
    model = fuseops.Sequential(*[s.op for s in specs]).double()
    x = torch.randn(*lead, in_features, dtype=torch.float64)
    extras, n, shared = [], in_features, {}
    for spec in specs:
        extras += [make(lead, n, torch.float64, "cpu", shared) for make in spec.extra_inputs]
        n = spec.out_features
    floats = [i for i, e in enumerate(extras) if isinstance(e, torch.Tensor) and e.is_floating_point()]
    params = {k: v.detach() for k, v in model.named_parameters()}

    def f(params, x, *float_extras):
        given = list(extras)
        for i, e in zip(floats, float_extras):
            given[i] = e
        return torch.func.functional_call(model, params, (x, *given))

    args = (params, x, *[extras[i] for i in floats])
    argnums = tuple(range(len(args)))
    by_forward = torch.func.jacfwd(f, argnums=argnums)(*args)
    by_reverse = torch.func.jacrev(f, argnums=argnums)(*args)
    forward_blocks, layout = tree_flatten(by_forward)
    reverse_blocks, reverse_layout = tree_flatten(by_reverse)
    assert layout == reverse_layout
    for a, b in zip(forward_blocks, reverse_blocks):
        # A float32 extra input of the float64 model (a gated op's probs): jacrev's block is
        # float32, its gradient's dtype, and jacfwd's float64, the output's, as for any torch
        # function. Float64 blocks agree to float64's rounding.
        wide = a.dtype == b.dtype == torch.float64
        torch.testing.assert_close(a, b, rtol=1e-10 if wide else 1e-6, atol=1e-12 if wide else 1e-6,
                                   check_dtype=False)


def _adjoint_case(pattern, data, dtype, device):
    """A drawn chain of ``pattern``, its arguments (parameters, x, float extra inputs in
    ``dtype``), random tangents and the forward-mode ``(outputs, J t)`` (the references, as
    plain torch); ``call(*leaves)`` runs the model on given x and float extra inputs."""
    in_features, specs = data.draw(op_chain(pattern), label="ops")
    lead = data.draw(st.sampled_from([(3,), (2, 2), (5,)]), label="leading shape")
    torch.manual_seed(data.draw(st.integers(0, 2**16), label="seed"))
    model = fuseops.Sequential(*[s.op for s in specs]).to(device, dtype)
    x = torch.randn(*lead, in_features, dtype=dtype, device=device)
    extras, n, shared = [], in_features, {}
    for spec in specs:
        extras += [make(lead, n, dtype, device, shared) for make in spec.extra_inputs]
        n = spec.out_features
    floats = [i for i, e in enumerate(extras) if isinstance(e, torch.Tensor) and e.is_floating_point()]

    def call(x, *float_extras):
        given = list(extras)
        for i, e in zip(floats, float_extras):
            given[i] = e.to(dtype)  # a float32 extra input (probs) differentiated in dtype
        return model(x, *given)

    def f(params, *leaves):
        with torch.nn.utils.stateless._reparametrize_module(model, params):
            return call(*leaves)

    params = {k: v.detach() for k, v in model.named_parameters()}
    args = (params, x, *[extras[i].to(dtype) for i in floats])
    tangents = tree_map(torch.randn_like, args)
    outputs, forward = torch.func.jvp(f, args, tangents)
    return model, call, f, args, tangents, tree_map(torch.randn_like, outputs), forward


def _dots(cotangents, forward, reverse, tangents):
    """``(<u, J t>, <J^T u, t>, sum |u * J t|)``: the last scales a tolerance (the dot may cancel)."""
    terms = [u * jt for u, jt in zip(*[tree_flatten(v)[0] for v in (cotangents, forward)])]
    reverse_dot = sum((g * t).sum() for g, t in zip(*[tree_flatten(v)[0] for v in (reverse, tangents)]) if g is not None)
    return sum(t.sum() for t in terms), reverse_dot, sum(t.abs().sum() for t in terms)


@pytest.mark.parametrize("pattern", [p for _, p in PATTERNS], ids=[name for name, _ in PATTERNS])
@settings(max_examples=6, deadline=None)
@given(data=st.data())
def test_the_ops_backward_is_the_adjoint_of_forward_mode(pattern, data):
    """``<u, J t> = <J^T u, t>`` for random ``u`` and ``t`` in float64: the ops' own backward (a
    vector-Jacobian product with a dense random cotangent, the Function path) against forward
    mode (torch differentiating the references). jacrev's one-hot cotangents are exact in
    float32, so this is what catches a backward that rounds ``dy`` (as an activation reference's
    ``dy.float()`` would)."""
    _, _, f, args, tangents, cotangents, forward = _adjoint_case(pattern, data, torch.float64, "cpu")
    reverse = torch.func.vjp(f, *args)[1](cotangents)
    forward_dot, reverse_dot, _ = _dots(cotangents, forward, reverse, tangents)
    torch.testing.assert_close(reverse_dot, forward_dot, rtol=1e-11, atol=1e-11)


@pytest.mark.parametrize("device", kernel_devices())
@pytest.mark.parametrize("pattern", [p for _, p in PATTERNS], ids=[name for name, _ in PATTERNS])
@settings(max_examples=3, deadline=None)
@given(data=st.data())
def test_the_triton_backward_is_the_adjoint_of_forward_mode(pattern, device, data):
    """The same in float32 through the Triton kernels (the interpreter on the CPU, the GPU's on
    CUDA: fused forward and backward, eager, as a training step runs them) against forward mode
    of the references: a kernel's backward against the derivative of the specification, with a
    dense cotangent."""
    model, call, _, args, tangents, cotangents, forward = _adjoint_case(pattern, data, torch.float32, device)
    leaves = [a.clone().requires_grad_() for a in args[1:]]
    with interpreted_kernels() if device == "cpu" else contextlib.nullcontext():
        out = call(*leaves)
        outs = out if isinstance(out, tuple) else (out,)
        wrt = [*leaves, *model.parameters()]
        grads = torch.autograd.grad(outs, wrt, tree_flatten(cotangents)[0], allow_unused=True)
    names = [k for k, _ in model.named_parameters()]
    reverse = (dict(zip(names, grads[len(leaves):])), *grads[:len(leaves)])
    forward_dot, reverse_dot, scale = _dots(cotangents, forward, reverse, tangents)
    # float32 sums (TF32 products on CUDA) over terms of size ``scale``.
    assert abs(reverse_dot - forward_dot) <= (1e-5 if device == "cpu" else 5e-3) * scale, (
        f"{model.plan.forward} / {model.plan.backward}: {reverse_dot.item()} against {forward_dot.item()}")


# -- dense: against torch.nn -------------------------------------------------------------------

def _dense(device, fuse=True):
    torch.manual_seed(0)
    seq = fuseops.Sequential(ops.LayerNorm(8), ops.Linear(8, 16), ops.GELU(approximate="tanh"), ops.Linear(16, 8),
                             fuse=fuse)
    ref = torch.nn.Sequential(torch.nn.LayerNorm(8), torch.nn.Linear(8, 16), torch.nn.GELU(approximate="tanh"),
                              torch.nn.Linear(16, 8))
    ref.load_state_dict(seq.state_dict())
    dtype = _dtype(device)
    return seq.to(device, dtype), ref.to(device, dtype)


@pytest.mark.parametrize("device", cpu_and_cuda())
@pytest.mark.parametrize("fuse", [False, True], ids=["unfused", "fused"])
def test_jvp_jacfwd_hessian_and_grad_of_grad_match_torch_nn(fuse, device):
    seq, ref = _dense(device, fuse)
    close = _close(device)
    x = torch.randn(5, 8, device=device, dtype=_dtype(device))
    t = torch.randn_like(x)
    torch.testing.assert_close(torch.func.jvp(seq, (x,), (t,)), torch.func.jvp(ref, (x,), (t,)), **close)
    torch.testing.assert_close(torch.func.jacfwd(seq)(x[:2]), torch.func.jacfwd(ref)(x[:2]), **close)

    def hessian(model):
        return torch.func.hessian(lambda x: model(x).square().sum())(x[:2])

    def grad_of_grad(model):
        inner = torch.func.grad(lambda x: model(x).square().sum())
        return torch.func.grad(lambda x: inner(x).sin().sum())(x)

    torch.testing.assert_close(hessian(seq), hessian(ref), **close)
    torch.testing.assert_close(grad_of_grad(seq), grad_of_grad(ref), **close)
    # In the parameters too (forward over reverse, through functional_call).
    params, ref_params = dict(seq.named_parameters()), dict(ref.named_parameters())

    def param_hvp(model, params):
        loss = torch.func.grad(lambda p: torch.func.functional_call(model, p, (x,)).square().sum())
        tangents = {k: torch.ones_like(v) for k, v in params.items()}
        return torch.func.jvp(loss, (params,), (tangents,))[1]

    torch.testing.assert_close(param_hvp(seq, params), param_hvp(ref, ref_params), **close)


@pytest.mark.parametrize("device", cpu_and_cuda())
def test_forward_ad_dual_tensors_match_torch_nn(device):
    """``torch.autograd.forward_ad`` outside torch.func: on CUDA the kernels would read the dual
    tensors' primal alone; the references run instead."""
    seq, ref = _dense(device)
    x = torch.randn(5, 8, device=device, dtype=_dtype(device))
    t = torch.randn_like(x)
    with forward_ad.dual_level():
        got = forward_ad.unpack_dual(seq(forward_ad.make_dual(x, t)))
        want = forward_ad.unpack_dual(ref(forward_ad.make_dual(x, t)))
        # A parameter's tangent too.
        tangent = torch.randn_like(seq[1].weight)
        with torch.no_grad():
            seq_w, ref_w = seq[1].weight, ref[1].weight
            del seq[1].weight, ref[1].weight
            seq[1].weight = forward_ad.make_dual(seq_w, tangent)
            ref[1].weight = forward_ad.make_dual(ref_w, tangent)
        got_w = forward_ad.unpack_dual(seq(x)).tangent
        want_w = forward_ad.unpack_dual(ref(x)).tangent
    torch.testing.assert_close(got.primal, want.primal, **_close(device))
    torch.testing.assert_close(got.tangent, want.tangent, **_close(device))
    torch.testing.assert_close(got_w, want_w, **_close(device))


@pytest.mark.parametrize("device", cpu_and_cuda())
def test_a_backward_through_a_jvp_reaches_the_parameters_as_torch_nn(device):
    """Reverse over forward from the training loop (a Jacobian-norm penalty): the parameters'
    ``.grad`` are torch.nn's, and the next plain step still runs the ops' own backward."""
    seq, ref = _dense(device)
    x = torch.randn(5, 8, device=device, dtype=_dtype(device))
    t = torch.randn_like(x)
    for model in (seq, ref):
        y, jvp_out = torch.func.jvp(model, (x,), (t,))
        (y.square().mean() + jvp_out.square().mean()).backward()
    for (name, p), q in zip(seq.named_parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, q.grad, **_close(device), msg=name)
    for model in (seq, ref):
        model.zero_grad()
        model(x).square().mean().backward()
    assert seq.plan.backward, "the plain step ran no backward of its own"
    for (name, p), q in zip(seq.named_parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, q.grad, **_close(device), msg=name)


def test_jvp_under_autocast_differentiates_the_weights_cast():
    """float32 weights under CPU autocast: the weight's bfloat16 copy is made differentiably
    (the weight cache's copy carries no tangent), so a parameter tangent is torch.nn's."""
    torch.manual_seed(0)
    seq, ref = fuseops.Sequential(ops.Linear(8, 8)), torch.nn.Linear(8, 8)
    ref.load_state_dict({k.split(".", 1)[1]: v for k, v in seq.state_dict().items()})
    x = torch.randn(4, 8)
    params = {k.split(".", 1)[1]: v.detach() for k, v in seq.named_parameters()}
    tangents = {k: torch.randn_like(v) for k, v in params.items()}
    with torch.autocast("cpu", dtype=torch.bfloat16):
        seq(x)  # the weight cache holds the cast now
        got = torch.func.jvp(lambda p: torch.func.functional_call(
            seq, {f"0.{k}": v for k, v in p.items()}, (x,)), (params,), (tangents,))
        want = torch.func.jvp(lambda p: torch.func.functional_call(ref, p, (x,)), (params,), (tangents,))
    assert got[1].dtype == want[1].dtype == torch.bfloat16
    assert got[1].abs().sum() > 0
    torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_dropout_tangent_uses_the_forward_mask():
    torch.manual_seed(0)
    seq = fuseops.Sequential(ops.Linear(8, 8), ops.Dropout(0.5)).double()
    x = torch.randn(64, 8, dtype=torch.float64)
    y, tangent = torch.func.jvp(seq, (x,), (x,))
    # Linear in x but for the bias: along x, the tangent is the kept rows' x W^T, scaled by 2.
    kept = y != 0
    assert 0.3 < kept.double().mean() < 0.7
    torch.testing.assert_close(tangent[~kept], torch.zeros_like(tangent[~kept]))
    torch.testing.assert_close(tangent[kept], (x @ seq[0].weight.T * 2)[kept])


# -- grouped and MoE ---------------------------------------------------------------------------

@pytest.mark.parametrize("device", cpu_and_cuda())
@pytest.mark.parametrize("form", ["list", "tensor"])
def test_grouped_experts_jvp_and_hessian_match_plain_torch(form, device):
    torch.manual_seed(0)
    dtype = _dtype(device)
    experts = fuseops.Sequential(ops.GroupedLinear(3, 8, 12), ops.SwiGLU(), ops.GroupedLinear(3, 6, 8)).to(device, dtype)
    sizes = [2, 0, 4]
    splits = sizes if form == "list" else torch.tensor(sizes, device=device)
    reference = grouped_swiglu_reference(experts, sizes)
    x = torch.randn(6, 8, device=device, dtype=dtype)
    t = torch.randn_like(x)
    close = _close(device)
    torch.testing.assert_close(torch.func.jvp(lambda x: experts(x, splits, splits), (x,), (t,)),
                               torch.func.jvp(reference, (x,), (t,)), **close)
    torch.testing.assert_close(torch.func.hessian(lambda x: experts(x, splits, splits).sum())(x),
                               torch.func.hessian(lambda x: reference(x).sum())(x), **close)


def _moe(device, dtype, T=6):
    return routed_tokens(device, dtype, E=4, T=T)


def _routed_reference(x, ids, weights, scale):
    """``sum_k weights[t, k] * scale[ids[t, k]] * x[t]^2``: a plain-torch stand-in for experts."""
    return ((x[:, None, :] ** 2) * scale[ids] * weights[..., None]).sum(1)


@pytest.mark.parametrize("device", cpu_and_cuda())
def test_permute_and_unpermute_under_every_torch_func_transform(device):
    """``fuseops.moe.permute`` / ``unpermute`` under grad, vmap, jacrev, jvp, jacfwd, hessian and
    forward_ad equal plain torch (before, their autograd Functions refused every transform)."""
    dtype = _dtype(device)
    x, ids, weights = _moe(device, dtype)
    scale = torch.rand(4, 1, device=device, dtype=dtype) + 0.5
    E = 4

    def routed(x, weights):
        x_sorted, sizes, row_map = fuseops.moe.permute(x, ids, E)
        per_row = torch.repeat_interleave(scale, sizes, dim=0, output_size=x_sorted.shape[0])
        return fuseops.moe.unpermute(x_sorted ** 2 * per_row, row_map, weights)

    def reference(x, weights):
        return _routed_reference(x, ids, weights, scale)

    close = _close(device)
    torch.testing.assert_close(routed(x, weights), reference(x, weights), **close)
    for transform in (torch.func.jacrev, torch.func.jacfwd):
        torch.testing.assert_close(transform(routed, argnums=(0, 1))(x, weights),
                                   transform(reference, argnums=(0, 1))(x, weights), **close)
    t, tw = torch.randn_like(x), torch.randn_like(weights)
    torch.testing.assert_close(torch.func.jvp(routed, (x, weights), (t, tw)),
                               torch.func.jvp(reference, (x, weights), (t, tw)), **close)
    torch.testing.assert_close(torch.func.hessian(lambda x: routed(x, weights).sum())(x),
                               torch.func.hessian(lambda x: reference(x, weights).sum())(x), **close)
    batch = torch.randn(3, *x.shape, device=device, dtype=dtype)
    torch.testing.assert_close(torch.func.vmap(routed, in_dims=(0, None))(batch, weights),
                               torch.func.vmap(reference, in_dims=(0, None))(batch, weights), **close)
    with forward_ad.dual_level():
        got = forward_ad.unpack_dual(routed(forward_ad.make_dual(x, t), weights)).tangent
        want = forward_ad.unpack_dual(reference(forward_ad.make_dual(x, t), weights)).tangent
    torch.testing.assert_close(got, want, **close)


@pytest.mark.parametrize("device", cpu_and_cuda())
def test_the_expert_layer_under_jvp_runs_the_composition(device):
    dtype = _dtype(device)
    torch.manual_seed(0)
    experts = fuseops.Sequential(ops.GroupedLinear(4, 8, 12), ops.SwiGLU(), ops.GroupedLinear(4, 6, 8)).to(device, dtype)
    x, ids, weights = _moe(device, dtype)
    t = torch.randn_like(x)

    def composition(x):
        x_sorted, sizes, row_map = fuseops.moe.permute(x, ids, 4)
        return fuseops.moe.unpermute(experts(x_sorted, sizes, sizes), row_map, weights)

    layer = torch.func.jvp(lambda x: fuseops.moe.expert_layer(x, ids, weights, experts), (x,), (t,))
    torch.testing.assert_close(layer, torch.func.jvp(composition, (x,), (t,)), **_close(device))
    # The composition's tangent against finite differences (float64 on the CPU).
    if device == "cpu":
        h = 1e-6
        fd = (composition(x + h * t) - composition(x - h * t)) / (2 * h)
        torch.testing.assert_close(layer[1], fd, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("lean", [False, True], ids=["default", "lean"])
@pytest.mark.parametrize("act", ["SwiGLU", "GeGLU", "ClampedSwiGLU", "scaled SwiGLU"])
def test_the_expert_layers_backward_is_the_adjoint_of_forward_mode(act, lean):
    """``fuseops.moe.expert_layer``'s own Function (its fused backward, not the composition's)
    against forward mode of the composition, float64, dense random cotangents and tangents in
    x, the router weights and every parameter."""
    torch.manual_seed(0)
    gate = {"SwiGLU": ops.SwiGLU(), "GeGLU": ops.GeGLU(approximate="tanh"), "ClampedSwiGLU": ops.ClampedSwiGLU(),
            "scaled SwiGLU": ops.SwiGLU(scaled=True)}[act]
    experts = fuseops.Sequential(ops.GroupedLinear(4, 8, 12, bias=True), gate, ops.GroupedLinear(4, 6, 8)).double()
    x, ids, weights = _moe("cpu", torch.float64, T=7)
    assert fuseops.moe.expert_layer_fallback(x, ids, weights, experts, lean=lean) is None
    names = [k for k, _ in experts.named_parameters()]
    xx, ww = x.clone().requires_grad_(), weights.clone().requires_grad_()
    y = fuseops.moe.expert_layer(xx, ids, ww, experts, lean=lean)
    u = torch.randn_like(y)
    reverse = torch.autograd.grad(y, [xx, ww, *experts.parameters()], u)

    layer = _ExpertLayer(experts, ids, lean)
    params = {k: v.detach() for k, v in layer.named_parameters()}
    tangents = ({k: torch.randn_like(v) for k, v in params.items()}, torch.randn_like(x), torch.randn_like(weights))
    _, forward = torch.func.jvp(lambda p, x, w: torch.func.functional_call(layer, p, (x, w)),
                                (params, x, weights), tangents)
    reverse_dot = (reverse[0] * tangents[1]).sum() + (reverse[1] * tangents[2]).sum() + sum(
        (g * tangents[0][f"experts.{k}"]).sum() for k, g in zip(names, reverse[2:]))
    torch.testing.assert_close(reverse_dot, (u * forward).sum(), rtol=1e-11, atol=1e-11)


class _ExpertLayer(torch.nn.Module):
    def __init__(self, experts, ids, lean):
        super().__init__()
        self.experts, self.ids, self.lean = experts, ids, lean

    def forward(self, x, weights):
        return fuseops.moe.expert_layer(x, self.ids, weights, self.experts, lean=self.lean)


# -- what cannot be differentiated this way raises -------------------------------------------

def test_forward_mode_under_a_quantized_recipe_raises():
    seq = fuseops.Sequential(ops.Linear(32, 32))
    x = torch.randn(4, 32)
    with fuseops.autocast(recipe=fuseops.recipes.FP8CurrentScaling()), pytest.raises(
            RuntimeError, match="not defined under a quantized recipe"):
        torch.func.jvp(seq, (x,), (x,))


class _Talking(ops.Identity):
    """An op that says it communicates (as the collectives and a sharded Linear do)."""

    communicates = True


def test_forward_mode_through_an_op_that_communicates_raises():
    seq = fuseops.Sequential(ops.Linear(8, 8), _Talking())
    x = torch.randn(4, 8)
    with pytest.raises(RuntimeError, match=r"op 1 \(_Talking\) communicates"):
        torch.func.jvp(seq, (x,), (x,))
    # Reverse mode, its own backward, is unaffected.
    seq(x.requires_grad_()).sum().backward()
