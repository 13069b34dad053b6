"""Every basic op alone, compiled with ``fullgraph=True`` (aot_eager), gives its eager output and
gradients. One op per Sequential, so that each op's reference is the last thing the plan's
autograd.Function returns: on torch 2.11 a Function whose forward returned a no-op ``to`` got a
zero gradient under compile (``fuseops/kernels/dtypes.py``), which only a model ending in such an
op showed. Run on the device's torch as well (the GPU parts of ``benchmarks/run_gpu.sh``)."""

from __future__ import annotations

import pytest
import torch
import torch._dynamo

import fuseops
from fuseops import ops

ROWS, H = 6, 8

# (id, op factory, extra inputs factory of the row count)
CASES = [
    ("Identity", lambda: ops.Identity(), None),
    ("Reshape", lambda: ops.Reshape((-1, 2, H // 2)), None),
    ("Bias", lambda: ops.Bias(H), None),
    ("Linear", lambda: ops.Linear(H, 12), None),
    ("Linear-nobias", lambda: ops.Linear(H, 12, bias=False), None),
    ("LayerNorm", lambda: ops.LayerNorm(H), None),
    ("RMSNorm", lambda: ops.RMSNorm(H), None),
    ("GELU-tanh", lambda: ops.GELU(approximate="tanh"), None),
    ("GELU", lambda: ops.GELU(), None),
    ("ReLU", lambda: ops.ReLU(), None),
    ("SiLU", lambda: ops.SiLU(), None),
    ("Sigmoid", lambda: ops.Sigmoid(), None),
    ("SReLU", lambda: ops.SReLU(), None),
    ("SwiGLU", lambda: ops.SwiGLU(), None),
    ("SwiGLU-scaled", lambda: ops.SwiGLU(scaled=True), lambda r: (torch.rand(r),)),
    ("GeGLU", lambda: ops.GeGLU(), None),
    ("ReGLU", lambda: ops.ReGLU(), None),
    ("SReGLU", lambda: ops.SReGLU(), None),
    ("ClampedSwiGLU", lambda: ops.ClampedSwiGLU(limit=3.0), None),
    ("AddExtraInput", lambda: ops.AddExtraInput(), lambda r: (torch.randn(r, H),)),
    ("GroupedLinear", lambda: ops.GroupedLinear(3, H, 12),
     lambda r: (torch.tensor([r // 2, 0, r - r // 2]),)),
    ("Dropout-eval", lambda: ops.Dropout(0.5).eval(), None),
]


def _step(model, fn, x, extras):
    x = x.detach().requires_grad_()
    extras = tuple(e.detach().requires_grad_(e.is_floating_point()) for e in extras)
    model.zero_grad(set_to_none=True)
    out = fn(x, *extras)
    y = out[0] if isinstance(out, tuple) else out
    y.backward(torch.cos(torch.arange(y.numel(), dtype=y.dtype, device=y.device)).view_as(y))
    grads = [x.grad] + [e.grad for e in extras if e.is_floating_point()] + [p.grad for p in model.parameters()]
    return y.detach(), grads


TARGETS = [pytest.param("cpu", "aot_eager", id="cpu-aot_eager"),
           pytest.param("cuda", "inductor", id="cuda-inductor", marks=pytest.mark.gpu)]


@pytest.mark.parametrize("device, backend", TARGETS)
@pytest.mark.parametrize("name, make_op, make_extras", CASES, ids=[c[0] for c in CASES])
def test_one_op_compiled_fullgraph_equals_eager_over_two_row_counts(name, make_op, make_extras, device, backend):
    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = fuseops.Sequential(make_op()).to(device)
    compiled = torch.compile(lambda *a: model(*a), backend=backend, fullgraph=True)
    for rows in (ROWS, ROWS + 3):
        x = torch.randn(rows, H).to(device)
        extras = tuple(e.to(device) for e in make_extras(rows)) if make_extras else ()
        y, grads = _step(model, compiled, x, extras)
        y_ref, grads_ref = _step(model, model, x, extras)
        # CUDA: Triton eager against inductor's code, both float32 (TF32 off by default).
        tol = 1e-6 if device == "cpu" else 1e-4
        torch.testing.assert_close(y, y_ref, rtol=tol, atol=tol)
        assert len(grads) == len(grads_ref)
        for g, g_ref in zip(grads, grads_ref):
            assert g is not None and g_ref is not None, name
            # A zero gradient where eager's is not is the failure this file exists for.
            assert g_ref.abs().sum() == 0 or g.abs().sum() > 0, f"{name}: compiled gradient is zero"
            torch.testing.assert_close(g, g_ref, rtol=tol, atol=tol)
