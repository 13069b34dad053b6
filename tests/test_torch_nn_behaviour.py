"""A model built from fuseops ops behaves as the same model built from torch.nn: hooks on an
op inside a Sequential, in-place ops on outputs, double backward, in-place parameter changes
before backward, torch.func, package conventions."""

from __future__ import annotations

import contextlib
import copy
import io
import logging

import pytest
import torch
from torch.func import vmap
from torch.utils.checkpoint import checkpoint

import fuseops
from fuseops import ops
from fuseops.kernels._triton import INTERPRET, interpreted_kernels
from tests.helpers import assert_bitwise, cpu_and_cuda

INPLACE = "modified by an inplace operation"


def _cpu_cuda_and_kernels():
    """``cpu_and_cuda()`` and ``cpu-kernels``: the CPU with the Triton kernels through the interpreter
    (``_on``), as CUDA runs them, where the references would hide a kernel-only failure."""
    return [*cpu_and_cuda(), pytest.param("cpu-kernels", marks=pytest.mark.skipif(
        not INTERPRET, reason="the interpreter runs on CPU-only machines"))]


def _on(device):
    """``(torch device, context)`` of a ``_cpu_cuda_and_kernels`` entry."""
    if device == "cpu-kernels":
        return "cpu", interpreted_kernels()
    return device, contextlib.nullcontext()


def _close(device):
    """Tolerances of a comparison with torch.nn: float32 on CUDA multiplies in TF32 (our
    kernels and, for the GEMMs, cuBLAS under torch's defaults may differ)."""
    return {} if device == "cpu" else dict(rtol=2e-2, atol=2e-2)


def _mlp(fuse=True, device="cpu"):
    torch.manual_seed(0)
    seq = fuseops.Sequential(ops.Linear(6, 10), ops.GELU(), ops.Linear(10, 4), fuse=fuse).to(device)
    ref = torch.nn.Sequential(torch.nn.Linear(6, 10), torch.nn.GELU(), torch.nn.Linear(10, 4)).to(device)
    ref.load_state_dict({k.replace("0.", "0.", 1): v for k, v in seq.state_dict().items()}, strict=False)
    with torch.no_grad():
        ref[0].weight.copy_(seq[0].weight), ref[0].bias.copy_(seq[0].bias)
        ref[2].weight.copy_(seq[2].weight), ref[2].bias.copy_(seq[2].bias)
    return seq, ref


# -- copies ----------------------------------------------------------------------------------

@pytest.mark.parametrize("device", cpu_and_cuda())
def test_a_model_that_has_run_deep_copies_and_saves_like_torch_nn(device):
    """``copy.deepcopy`` and ``torch.save`` of a model after training steps (its calls
    prepared and kept per signature): the copy and the loaded model run with their own
    parameters, equal to a model freshly built from the same state dict, and leave the
    original as it was."""
    seq, _ = _mlp(device=device)
    x = torch.randn(5, 6, device=device, requires_grad=True)
    opt = torch.optim.SGD(seq.parameters(), lr=0.1)
    for _ in range(16):
        seq(x).square().sum().backward()
        opt.step()
        opt.zero_grad()
    before = seq(x).detach().clone()
    buffer = io.BytesIO()
    torch.save(seq, buffer)
    buffer.seek(0)
    copies = [copy.deepcopy(seq), torch.load(buffer, weights_only=False)]
    for other in copies:
        with torch.no_grad():
            other[0].weight.mul_(0.5)
        fresh, _ = _mlp(device=device)
        fresh.load_state_dict(other.state_dict())
        for model in (other, fresh):
            x.grad = None
            model(x).square().sum().backward()
        got, want = other(x), fresh(x)
        assert_bitwise(got, want, "output")
        for (name, p), q in zip(other.named_parameters(), fresh.parameters()):
            assert_bitwise(p.grad, q.grad, name)
        assert not torch.equal(got, before)
    assert_bitwise(seq(x), before, "the original's output")


# -- meta-device initialization -------------------------------------------------------------

def _every_parametrized_op():
    dense = fuseops.Sequential(ops.LayerNorm(16), ops.Linear(16, 24), ops.Bias(24), ops.GELU(),
                               ops.RMSNorm(24, zero_centered_gamma=True), ops.Linear(24, 16), ops.RMSNorm(16))
    experts = fuseops.Sequential(ops.GroupedLinear(3, 16, 24, bias=True), ops.SwiGLU(), ops.GroupedLinear(3, 12, 16))
    return dense, experts


def test_a_model_built_on_the_meta_device_initializes_like_an_eager_one():
    """Built on the meta device, moved with ``to_empty`` and each module's ``reset_parameters``
    called (FSDP2's and torchtitan's initialization): every parameter equals the eagerly built
    model's, bit for bit (a norm or Bias without ``reset_parameters`` would keep its parameters
    as uninitialized memory)."""
    torch.manual_seed(0)
    eager = _every_parametrized_op()
    with torch.device("meta"):
        meta = _every_parametrized_op()
    torch.manual_seed(0)
    for model in meta:
        model.to_empty(device="cpu")
        for module in model.modules():
            if hasattr(module, "reset_parameters"):
                module.reset_parameters()
    for built, want in zip(meta, eager):
        for (name, p), q in zip(built.named_parameters(), want.parameters()):
            assert_bitwise(p.detach(), q.detach(), name)
    x = torch.randn(5, 16)
    torch.testing.assert_close(meta[1](meta[0](x), [2, 0, 3], [2, 0, 3]), eager[1](eager[0](x), [2, 0, 3], [2, 0, 3]))


def test_torchscript_raises_a_type_error_that_names_the_ways_that_work():
    """``torch.jit.script`` of a fuseops Sequential, of one op, or of a torch model holding one
    (torch.nn's script): TorchScript compiles neither the executor nor the Triton kernels, so a
    TypeError naming torch.compile and torch.export, rather than TorchScript's frontend failing
    inside fuseops' annotations ("Unknown type annotation: 'torch.Tensor'")."""
    dense, _ = _every_parametrized_op()

    class Outer(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.head, self.body = torch.nn.Linear(16, 16), dense

        def forward(self, x):
            return self.body(self.head(x))

    torch.jit.script(torch.nn.Sequential(torch.nn.Linear(16, 16)))  # torch.nn's own scripts
    for module in (dense, dense[1], Outer()):
        with pytest.raises(TypeError, match=r"cannot be scripted.*torch\.compile.*torch\.export"):
            torch.jit.script(module)


# -- hooks ---------------------------------------------------------------------------------

@pytest.mark.parametrize("device", cpu_and_cuda())
def test_hooks_on_an_inner_op_fire_like_torch_nn(device):
    seq, ref = _mlp(device=device)
    calls = {"mine": [], "theirs": []}

    def register(module, who):
        module.register_forward_pre_hook(lambda m, args: calls[who].append(("pre", args[0].detach().clone())))
        module.register_forward_hook(lambda m, args, out: calls[who].append(("post", out.detach().clone())))
        module.register_full_backward_hook(lambda m, gin, gout: calls[who].append(("bwd", gout[0].detach().clone())))

    register(seq[1], "mine")
    register(ref[1], "theirs")
    x = torch.randn(3, 6, device=device, requires_grad=True)
    seq(x).sum().backward()
    ref(x).sum().backward()
    assert [c[0] for c in calls["mine"]] == [c[0] for c in calls["theirs"]] == ["pre", "post", "bwd"]
    for (_, a), (_, b) in zip(calls["mine"], calls["theirs"]):
        torch.testing.assert_close(a, b)
    reasons = [r for name, idx, r in seq.plan.declined if 1 in idx]
    assert any("has module hooks" in r for r in reasons), seq.plan.declined
    assert all(1 not in idx or len(idx) == 1 for _, idx in seq.plan.forward)


def test_a_hook_replacing_the_output_is_differentiated():
    seq, ref = _mlp()
    seq[1].register_forward_hook(lambda m, args, out: out * 3)
    ref[1].register_forward_hook(lambda m, args, out: out * 3)
    x = torch.randn(3, 6, requires_grad=True)
    xr = x.detach().clone().requires_grad_()
    y, yr = seq(x), ref(xr)
    torch.testing.assert_close(y, yr)
    y.sum().backward()
    yr.sum().backward()
    torch.testing.assert_close(x.grad, xr.grad)
    torch.testing.assert_close(seq[0].weight.grad, ref[0].weight.grad)


def test_hook_fallback_logged_once_at_warning(caplog, monkeypatch):
    monkeypatch.setattr(fuseops.fuser, "_warned", set())
    seq, _ = _mlp()
    seq[1].register_forward_pre_hook(lambda m, args: None)
    x = torch.randn(2, 6)
    with caplog.at_level(logging.DEBUG, logger="fuseops"):
        seq(x)
        seq.fuse = True
        seq._plans.clear()
        seq(x)
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING and "module hooks" in r.message]
    assert len({r.message for r in warnings}) == len(warnings) >= 1
    assert any(r.levelno == logging.DEBUG and "plan for" in r.message for r in caplog.records)


# -- outputs are not views ----------------------------------------------------------------

def _inplace_cases():
    G, H = 2, 8
    sizes = [3, 3]
    return {
        "LayerNorm": (lambda: [ops.LayerNorm(H)], lambda: [torch.nn.LayerNorm(H)], ()),
        "GroupedLinear": (lambda: [ops.GroupedLinear(G, H, 4)], None, (sizes,)),
        "Linear-SwiGLU": (lambda: [ops.Linear(H, 8), ops.SwiGLU()], None, ()),
        "Linear-Reshape": (lambda: [ops.Linear(H, 8), ops.Reshape((-1, 2, 4))], None, ()),
        "RMSNorm-Linear-GELU-Linear": (
            lambda: [ops.RMSNorm(H), ops.Linear(H, 12), ops.GELU(), ops.Linear(12, H)],
            lambda: [torch.nn.RMSNorm(H, eps=1e-5), torch.nn.Linear(H, 12), torch.nn.GELU(), torch.nn.Linear(12, H)],
            (),
        ),
        "Linear-AddExtraInput": (lambda: [ops.Linear(H, H), ops.AddExtraInput()], None, ("residual",)),
    }


@pytest.mark.parametrize("device", cpu_and_cuda())
@pytest.mark.parametrize("fuse", [False, True])
@pytest.mark.parametrize("case", list(_inplace_cases()))
def test_inplace_on_output_works_and_grads_match_unmodified_math(case, fuse, device):
    torch.manual_seed(0)
    make, _, extras = _inplace_cases()[case]
    seq = fuseops.Sequential(*make(), fuse=fuse).to(device)
    x = torch.randn(6, 8, device=device, requires_grad=True)
    extra = [torch.randn(6, 8, device=device, requires_grad=True) if e == "residual" else e for e in extras]
    # The reference: the same ops, output multiplied out of place.
    y_ref = seq(x, *extra) * 2
    g = torch.randn_like(y_ref)
    ref_grads = torch.autograd.grad(y_ref, [x, *seq.parameters()], g)
    y = seq(x, *extra)
    y.mul_(2)  # torch.nn allows this: no op's backward needs its output
    got = torch.autograd.grad(y, [x, *seq.parameters()], g)
    for a, b in zip(got, ref_grads):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize("device", cpu_and_cuda())
def test_inplace_on_an_output_backward_needs_raises_torch_error(device):
    seq = fuseops.Sequential(ops.Linear(4, 4), ops.MakeExtraOutput(), ops.GELU()).to(device)
    x = torch.randn(2, 4, device=device, requires_grad=True)
    y, branch = seq(x)
    branch.add_(1)  # GELU saved this tensor (its input) for backward
    with pytest.raises(RuntimeError, match=INPLACE):
        y.sum().backward()


# -- double backward, version checks -------------------------------------------------------

@pytest.mark.parametrize("device", cpu_and_cuda())
@pytest.mark.parametrize("fuse", [False, True])
def test_double_backward_raises_instead_of_wrong_grads(fuse, device):
    seq, _ = _mlp(fuse, device)
    x = torch.randn(3, 6, device=device, requires_grad=True)
    (gx,) = torch.autograd.grad(seq(x).sum(), x, create_graph=True)
    with pytest.raises(RuntimeError, match="double backward"):
        gx.pow(2).sum().backward()


@pytest.mark.parametrize("device", _cpu_cuda_and_kernels())
@pytest.mark.parametrize("frozen", [False, True], ids=["parameterless", "frozen"])
def test_create_graph_with_one_gradient_is_right_then_raises(frozen, device):
    """One gradient needed (x's: a parameterless op, or the parameters frozen) under
    ``create_graph=True``, as a gradient penalty or ``torch.func.vjp`` asks: torch.nn's gradient,
    and the second backward raises (guards against the one gradient coming back as its first row).
    ``cpu-kernels``: the Triton kernels through the interpreter, as on CUDA (guards against vjp_fn
    running the kernels on the transform's dead wrappers, which have no storage)."""
    device, kernels = _on(device)
    with kernels:
        _one_gradient_under_create_graph(frozen, device)


def _one_gradient_under_create_graph(frozen, device):
    seq, ref = _mlp(device=device)
    if frozen:
        seq.requires_grad_(False)
        ref.requires_grad_(False)
    else:
        seq, ref = fuseops.Sequential(ops.GELU()).to(device), torch.nn.GELU()
    x = torch.randn(3, 6, device=device, requires_grad=True)
    (gx,) = torch.autograd.grad(seq(x).square().sum(), x, create_graph=True)
    (want,) = torch.autograd.grad(ref(x).square().sum(), x)
    torch.testing.assert_close(gx, want, **_close(device))
    with pytest.raises(RuntimeError, match="double backward"):
        gx.pow(2).sum().backward()
    u = torch.randn(3, seq(x).shape[-1], device=device)
    got = torch.func.vjp(seq, x.detach())[1](u)
    torch.testing.assert_close(got, torch.func.vjp(ref, x.detach())[1](u), **_close(device))


@pytest.mark.parametrize("fuse", [False, True])
@pytest.mark.parametrize("device", cpu_and_cuda())
def test_parameter_changed_in_place_before_backward_raises(fuse, device):
    seq, ref = _mlp(fuse, device)
    x = torch.randn(3, 6, device=device, requires_grad=True)
    for model in (ref, seq):
        y = model(x)
        with torch.no_grad():
            model[2].weight.add_(1.0)
        with pytest.raises(RuntimeError, match=INPLACE):
            y.sum().backward()


@pytest.mark.parametrize("device", cpu_and_cuda())
def test_saved_input_changed_in_place_before_backward_raises(device):
    seq = fuseops.Sequential(ops.Linear(6, 4)).to(device)
    x = torch.randn(3, 6, device=device)
    y = seq(x.requires_grad_(False))  # x saved for the weight gradient
    x.add_(1.0)
    with pytest.raises(RuntimeError, match=INPLACE):
        y.sum().backward()


# -- torch.func ----------------------------------------------------------------------------

@pytest.mark.parametrize("device", cpu_and_cuda())
@pytest.mark.parametrize("fuse", [False, True], ids=["unfused", "fused"])
def test_torch_func_vmap_grad_jacrev_match_torch_nn(fuse, device):
    seq, ref = _mlp(fuse=fuse, device=device)
    x = torch.randn(5, 3, 6, device=device)
    close = _close(device)
    torch.testing.assert_close(vmap(seq)(x), vmap(ref)(x), **close)
    params, ref_params = dict(seq.named_parameters()), dict(ref.named_parameters())
    assert params.keys() == ref_params.keys()

    def loss(model, p, x):
        return torch.func.functional_call(model, p, (x,)).square().sum()

    for argnums in (0, 1):
        got = torch.func.grad(lambda p, x: loss(seq, p, x), argnums=argnums)(params, x)
        want = torch.func.grad(lambda p, x: loss(ref, p, x), argnums=argnums)(ref_params, x)
        torch.testing.assert_close(got, want, **close)
    torch.testing.assert_close(torch.func.jacrev(seq)(x[0]), torch.func.jacrev(ref)(x[0]), **close)


@pytest.mark.parametrize("device", cpu_and_cuda())
def test_per_sample_gradients_vmap_of_grad(device):
    """``vmap(grad(loss))`` over a batch (per-sample gradients, as Opacus-style training asks):
    torch.nn's for a dense model, a loop of ``grad`` calls for a grouped one (the grouped
    references must not use ``mm(out=)``, which has no batching rule)."""
    seq, ref = _mlp(device=device)
    x = torch.randn(4, 3, 6, device=device)

    def per_sample(model, loss_of):
        params = {k: v.detach() for k, v in model.named_parameters()}
        return params, torch.func.vmap(torch.func.grad(loss_of), in_dims=(None, 0))(params, x)

    def loss(model):
        return lambda p, xi: torch.func.functional_call(model, p, (xi,)).square().sum()

    _, got = per_sample(seq, loss(seq))
    _, want = per_sample(ref, loss(ref))
    torch.testing.assert_close(got, want, **_close(device))

    torch.manual_seed(0)
    experts = fuseops.Sequential(ops.GroupedLinear(2, 6, 8), ops.SwiGLU(), ops.GroupedLinear(2, 4, 6)).to(device)

    def grouped_loss(p, xi):
        return torch.func.functional_call(experts, p, (xi, [1, 2], [1, 2])).square().sum()

    params, got = per_sample(experts, grouped_loss)
    for i in range(x.shape[0]):
        one = torch.func.grad(grouped_loss)(params, x[i])
        torch.testing.assert_close({k: v[i] for k, v in got.items()}, one, **_close(device))


@pytest.mark.parametrize("device", cpu_and_cuda())
def test_torch_func_higher_order_matches_torch_nn(device):
    """Grad of grad runs the ops as plain torch, which torch
    differentiates again (``fuseops/ops/executor/plain_autograd.py``, where jvp, jacfwd and
    hessian are tested too); a second backward of ``create_graph=True`` still raises."""
    seq, ref = _mlp(fuse=False, device=device)
    x = torch.randn(3, 6, device=device)

    def grad_of_grad(model):
        return torch.func.grad(lambda x: torch.func.grad(lambda x: model(x).square().sum())(x).sum())(x)

    torch.testing.assert_close(grad_of_grad(seq), grad_of_grad(ref), **_close(device))


# -- activation checkpointing ----------------------------------------------------------------

def _checkpointed_models(device):
    """``(build, call)`` per model: dense, grouped (split sizes as a tensor), the MoE
    composition and ``expert_layer``."""
    ids = torch.tensor([[0, 1], [1, 2], [2, 0], [0, 2], [1, 0], [2, 1]], device=device)
    weights = torch.rand(6, 2, device=device, generator=torch.Generator(device).manual_seed(3))
    sizes = torch.tensor([2, 1, 3], device=device)

    def dense():
        torch.manual_seed(0)
        return fuseops.Sequential(ops.RMSNorm(16), ops.Linear(16, 32), ops.GELU("tanh"), ops.Linear(32, 16)).to(device)

    def experts():
        torch.manual_seed(0)
        return fuseops.Sequential(ops.GroupedLinear(3, 16, 24), ops.SwiGLU(), ops.GroupedLinear(3, 12, 16)).to(device)

    def composition(m, x):
        x_sorted, splits, row_map = fuseops.moe.permute(x, ids, 3)
        return fuseops.moe.unpermute(m(x_sorted, splits, splits), row_map, weights)

    return {"dense": (dense, lambda m, x: m(x)), "grouped": (experts, lambda m, x: m(x, sizes, sizes)),
            "composition": (experts, composition),
            "expert_layer": (experts, lambda m, x: fuseops.moe.expert_layer(x, ids, weights, m))}


@pytest.mark.parametrize("device", _cpu_cuda_and_kernels())
@pytest.mark.parametrize("reentrant", [False, True], ids=["non_reentrant", "reentrant"])
@pytest.mark.parametrize("model", ["dense", "grouped", "composition", "expert_layer"])
def test_activation_checkpointing_equals_no_checkpoint(model, reentrant, device):
    """``torch.utils.checkpoint`` around a fuseops model (its forward run again in the backward):
    the same gradients, bit for bit, as the model without it, three steps in a row (the first
    prepares the call's run, the later ones reuse it)."""
    device, kernels = _on(device)
    build, call = _checkpointed_models(device)[model]
    plain, checkpointed = build(), build()
    with kernels:
        for step in range(3):
            x = torch.randn(6, 16, device=device, generator=torch.Generator(device).manual_seed(step))
            grads = []
            for m, wrap in ((plain, False), (checkpointed, True)):
                xx = x.clone().requires_grad_()
                y = checkpoint(lambda t, m=m: call(m, t), xx, use_reentrant=reentrant) if wrap else call(m, xx)
                y.square().sum().backward()
                grads.append([xx.grad, *(p.grad.clone() for p in m.parameters())])
                m.zero_grad()
            for got, want in zip(*grads):
                assert_bitwise(got, want)


# -- parametrizations --------------------------------------------------------------------------

class _Doubled(torch.nn.Module):
    def forward(self, w):
        return w * 2.0


def _parametrize(module, kind):
    if kind == "weight_norm":
        torch.nn.utils.parametrizations.weight_norm(module)
    else:
        torch.nn.utils.parametrize.register_parametrization(module, "weight", _Doubled())


@pytest.mark.parametrize("device", _cpu_cuda_and_kernels())
@pytest.mark.parametrize("run", ["eager", "compiled"])
@pytest.mark.parametrize("kind", ["doubled", "weight_norm"])
def test_parametrized_weights_train_like_torch_nn(kind, run, device):
    """``torch.nn.utils.parametrize`` on a Linear's weight (weight_norm, a custom one): the
    same outputs and gradients (the parametrization's own parameters included) as torch.nn,
    also when only that weight needs a gradient (guards against the backward raising KeyError,
    and against a model whose only trainable tensor is parametrized running no backward at all)."""
    device, kernels = _on(device)
    seq, ref = _mlp(device=device)
    seq, ref = seq.double(), ref.double()
    for m in (seq[0], ref[0]):
        _parametrize(m, kind)
    assert [n for n, _ in seq.named_parameters()] == [n for n, _ in ref.named_parameters()]
    call = torch.compile(seq, backend="aot_eager") if run == "compiled" else seq
    with kernels:
        for only_parametrized in (False, True):
            if only_parametrized:
                for m in (seq, ref):
                    for name, p in m.named_parameters():
                        p.requires_grad_("parametrizations" in name)
            x = torch.randn(5, 6, device=device, dtype=torch.float64, requires_grad=not only_parametrized)
            got, want = call(x), ref(x)
            torch.testing.assert_close(got, want)
            got.square().sum().backward()
            want.square().sum().backward()
            for (name, p), q in zip(seq.named_parameters(), ref.parameters()):
                torch.testing.assert_close(p.grad, q.grad, msg=name)
            seq.zero_grad(), ref.zero_grad()


@pytest.mark.parametrize("model", ["grouped", "composition", "expert_layer"])
def test_parametrized_expert_weights_train_like_the_plain_weights(model):
    """FC1's weight of a grouped / MoE model parametrized as ``2 w`` against the same model with
    ``2 w`` as its plain weight (float64): outputs, and the gradients (the original's twice)."""
    build, call = _checkpointed_models("cpu")[model]
    parametrized, plain = build().double(), build().double()
    _parametrize(parametrized[0], "doubled")
    with torch.no_grad():
        plain[0].weight.mul_(2)
    x = torch.randn(6, 16, dtype=torch.float64)
    got, want = call(parametrized, x), call(plain, x)
    torch.testing.assert_close(got, want)
    got.square().sum().backward()
    want.square().sum().backward()
    torch.testing.assert_close(parametrized[0].parametrizations.weight.original.grad, 2 * plain[0].weight.grad)
    torch.testing.assert_close(parametrized[2].weight.grad, plain[2].weight.grad)


def test_parametrized_weights_under_a_quantized_recipe_raise():
    seq, _ = _mlp()
    _parametrize(seq[0], "doubled")
    x = torch.randn(4, 6, requires_grad=True)
    with fuseops.autocast(recipe=fuseops.recipes.FP8CurrentScaling()), pytest.raises(
            RuntimeError, match="parametrize.*quantized recipe"):
        seq(x)


# -- package conventions -------------------------------------------------------------------

def test_version_py_typed_and_logger():
    from importlib import resources

    assert isinstance(fuseops.__version__, str) and fuseops.__version__[0].isdigit()
    assert resources.files("fuseops").joinpath("py.typed").is_file()
    assert logging.getLogger("fuseops").handlers or logging.getLogger("fuseops").propagate
