"""``benchmarks/fp8_moe.py``'s optimizer step on CPU: the weights stay near where they started when a
step's gradient keeps pointing the same way (the benchmark's tokens, routing and ``dy`` never
change), so that no row times diverged weights (plain descent made them infinite after ~20 steps
at Mixtral's shape, then NaN)."""

import pytest
import torch

from benchmarks import fp8_moe
from benchmarks._moe_impls import make_case


class _FixedGradient(torch.autograd.Function):
    """A layer whose weight gradients are the same at every call, whatever the weights (the
    benchmark's worst case), into ``.grad`` or added to ``main_grad``."""

    @staticmethod
    def forward(ctx, y, w1, w2, gradients, into_main_grad):
        ctx.weights, ctx.gradients, ctx.into_main_grad = (w1, w2), gradients, into_main_grad
        return y.clone()

    @staticmethod
    def backward(ctx, dy):
        if ctx.into_main_grad:
            for w, g in zip(ctx.weights, ctx.gradients, strict=True):
                w.main_grad += g
            return None, None, None, None, None
        return None, *ctx.gradients, None, None


@pytest.mark.parametrize("main_grad", [False, True], ids=["grad", "main_grad"])
def test_steps_under_a_fixed_gradient_stay_bounded(main_grad):
    case = make_case(E=2, T=8, H=16, I=8, K=1, device="cpu", dtype=torch.float32, main_grad=main_grad)
    if main_grad:
        for w in (case.w1, case.w2):
            w.main_grad = torch.zeros_like(w)
    gradients = (torch.full_like(case.w1, 4.0), torch.full_like(case.w2, -2.0))
    start = (case.w1.detach().clone(), case.w2.detach().clone())
    micro_batches = 2
    step = fp8_moe.optimizer_step(case, lambda: _FixedGradient.apply(case.dy, case.w1, case.w2, gradients, main_grad),
                                  micro_batches)
    for _ in range(50):
        step()
    for w, w0, g in zip((case.w1, case.w2), start, gradients, strict=True):
        # One step moves a weight by micro_batches * LR * g; fifty the same way, fifty times as far.
        assert (w.detach() - w0).abs().max() <= micro_batches * fp8_moe.LR * g.abs().max() * 1.01
        assert torch.isfinite(w).all()
