"""What a compiled fuseops model's guards must still catch now that the fuser's registry reaches
the trace as a constant (``fuser._registry_view``) and records' field names too
(``contract._traced_field_names``): a change to the registry, to a parameter, to train/eval,
autocast or requires_grad either recompiles or gives the eager result; and blocks compiled one
by one still share one graph (nothing in the trace is pinned to one module's identity)."""

from __future__ import annotations

import copy

import torch
import torch._dynamo

import fuseops
from fuseops import ops
from fuseops.fusions import REGISTRY, Fusion, Stage, match


def _block() -> fuseops.Sequential:
    return fuseops.Sequential(
        ops.RMSNorm(16), ops.Linear(16, 32), ops.GELU(approximate="tanh"), ops.Linear(32, 16), ops.AddExtraInput()
    )


def _step(model, fn, x: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor | None]]:
    """Output and the gradients of x and every parameter after a backward of ``fn(x)``."""
    x = x.detach().requires_grad_()
    model.zero_grad(set_to_none=True)
    y = fn(x)
    y.backward(torch.cos(torch.arange(y.numel(), dtype=y.dtype)).view_as(y))
    return y.detach(), [x.grad] + [p.grad for p in model.parameters()]


def _assert_same(a, b, rtol: float = 1e-5, atol: float = 1e-5) -> None:
    (y, grads), (y_ref, grads_ref) = a, b
    torch.testing.assert_close(y, y_ref, rtol=rtol, atol=atol)
    assert len(grads) == len(grads_ref)
    for g, g_ref in zip(grads, grads_ref):
        assert (g is None) == (g_ref is None)
        if g is not None:
            torch.testing.assert_close(g, g_ref, rtol=rtol, atol=atol)


class _DoublingIdentities(Fusion):
    """Two Identity ops fused into x * 2: deliberately not their result, so that the output
    tells which plan the compiled graph runs."""

    pattern = (match(ops.Identity), match(ops.Identity))
    stage = Stage.FORWARD

    def fused_forward(self, ops_, ctxs, x, extra_inputs):
        return x * 2, [(), ()]


def _compiled_identities() -> tuple:
    """Two Identity ops compiled (fullgraph), an input, and the first call's check: x back."""
    torch._dynamo.reset()
    compiled = torch.compile(fuseops.Sequential(ops.Identity(), ops.Identity()), backend="aot_eager", fullgraph=True)
    x = torch.randn(4, 8)
    torch.testing.assert_close(compiled(x), x)
    return compiled, x


def test_a_fusion_added_to_the_registry_after_compiling_is_planned() -> None:
    compiled, x = _compiled_identities()
    REGISTRY.append(_DoublingIdentities())
    try:
        torch.testing.assert_close(compiled(x), 2 * x)
    finally:
        REGISTRY.pop()
    torch.testing.assert_close(compiled(x), x)


def test_a_registry_entry_replaced_by_another_fusion_is_planned() -> None:
    compiled, x = _compiled_identities()
    # Same length, another fusion at one position: the registry's entry types are guarded.
    first = REGISTRY[0]
    REGISTRY[0] = _DoublingIdentities()
    try:
        torch.testing.assert_close(compiled(x), 2 * x)
    finally:
        REGISTRY[0] = first
    torch.testing.assert_close(compiled(x), x)


def test_train_eval_autocast_requires_grad_and_param_swaps_match_eager() -> None:
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = _block()
    eager = copy.deepcopy(model)
    compiled = torch.compile(lambda x: model(x, x), backend="aot_eager", fullgraph=True)
    x = torch.randn(6, 16)
    _assert_same(_step(model, compiled, x), _step(eager, lambda x: eager(x, x), x))

    # The bias of FC1 without grad: the dbias fusion declines (a guard reads requires_grad).
    for m in (model, eager):
        m[1].bias.requires_grad_(False)
    _assert_same(_step(model, compiled, x), _step(eager, lambda x: eager(x, x), x))
    assert model[1].bias.grad is None

    # A parameter swapped for another object of the same shape.
    new = torch.randn(32, 16)
    for m in (model, eager):
        m[1].weight = torch.nn.Parameter(new.clone())
    _assert_same(_step(model, compiled, x), _step(eager, lambda x: eager(x, x), x))

    for m in (model, eager):
        m.eval()
    full = _step(model, compiled, x)
    _assert_same(full, _step(eager, lambda x: eager(x, x), x))

    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = _step(model, compiled, x)
        want = _step(eager, lambda x: eager(x, x), x)
    # bfloat16 GEMMs, rounded in another order by the compiled graph (as in test_compile.py).
    _assert_same(got, want, rtol=2e-2, atol=5e-2)
    # The GEMMs ran in bfloat16 (the residual keeps the output float32): not the float32 graph.
    assert not torch.allclose(got[0], full[0], rtol=1e-5, atol=1e-5)


def test_a_gated_activation_scaled_after_compiling_is_not_fused_with_its_linear() -> None:
    # ``_no_scaled_probs`` (a pattern predicate) reads ``scaled``: with probs, the activation
    # takes an extra input and runs on its own; the compiled call gives the eager result.
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = fuseops.Sequential(ops.Linear(16, 32), ops.SwiGLU(scaled=True))
    eager = copy.deepcopy(model)
    probs = torch.rand(6)
    compiled = torch.compile(lambda x: model(x, probs), backend="aot_eager", fullgraph=True)
    x = torch.randn(6, 16)
    _assert_same(_step(model, compiled, x), _step(eager, lambda x: eager(x, probs), x))
    eager(x, probs)
    assert ("ForwardLinearBiasActivation", (0, 1)) not in eager.plan.forward


def test_blocks_compiled_one_by_one_share_one_graph() -> None:
    torch._dynamo.reset()
    torch.manual_seed(0)
    blocks = [_block() for _ in range(3)]
    eager = copy.deepcopy(blocks)
    for b in blocks:
        b.compile(backend="aot_eager", fullgraph=True)
    counters = torch._dynamo.utils.counters
    counters.clear()
    # Requiring grad as the blocks' outputs do: every block gets the same input signature.
    x = torch.randn(6, 16, requires_grad=True)
    y, y_ref = x, x
    for b, e in zip(blocks, eager):
        y, y_ref = b(y, y), e(y_ref, y_ref)
    torch.testing.assert_close(y, y_ref, rtol=1e-5, atol=1e-5)
    assert counters["stats"]["unique_graphs"] == 1, dict(counters["stats"])
