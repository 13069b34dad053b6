"""``expert_layer`` under a recipe (``fuseops.autocast(recipe=...)``, each of the four): the whole
layer as one autograd Function whose grouped GEMMs read their token-side operands quantized
straight from the tokens.

The composition (``permute -> experts -> unpermute``) writes the permuted tokens ``x_sorted``
[T*K, H] in high precision, and FC1's quantize reads them back: twice under current scaling (the
groups' amax pass, then the cast writing the row-wise and column-wise copies). The backward does
the same with unpermute's gradient ``dy_sorted``. Here neither is written:
``quantize(x, rows=token_of_row)`` reads each sorted row where it lies in ``x`` (or ``dy``), so
the amax pass and the cast each read the tokens' rows K times and nothing of size T*K x H is
written in high precision. At the Qwen3-30B-A3B shape (T=32768, top-8, H=2048, bf16) that is a
write and a read of 1.07 GB less per tensor and direction, about 2.1 GB a step for x and as much
for dy (by arithmetic, not measured).

Between the GEMMs everything is what the composition's plan runs under the same recipe (the
fusions that measured faster there). Forward, FP8 current scaling and blockwise: FC1's quantized
GEMM writes the pre-activation ``z``; the gated activation, scaled by the router weights, writes
FC2's input quantized (``GATED_QUANTIZE_FWD``: ``fuseops.fusions.forward_act_quantize_linear``).
MXFP8 and NVFP4: FC1's quantized GEMM applies the scaled gate in its epilogue and writes FC2's
input quantized (as ``fuseops.fusions.forward_quantized_grouped_mlp``; which formats measured
faster which way: ``fuseops.kernels.gemm.grouped_scaled_act.UNFUSED_FASTER``). Then FC2's
quantized GEMM; the combine sums each token's K rows (unweighted: the weights scaled FC1's
activation). Backward: FC2's dgrad and wgrad on the
gathered ``dy``; the gated backward, which under a per-tensor gradient format (FP8 current
scaling, NVFP4) also emits each row's amax of ``dz`` so FC1's gradient quantize skips its amax
pass (as ``fuseops.fusions.backward_gated_amax_linear``); FC1's dgrad, summed per token, and
wgrad. So its results equal the composition's with a scaled gated activation bit for bit (tests).

Saved for backward: FC1's and FC2's inputs as their column-wise FP8 copies (for the weight
gradients), ``z`` and the routing; the weights' quantized copies come from the weight cache
(``fuseops.quant.weight_cache``). It runs eagerly: no CUDA graph (the cache's weight versions
are read on the host at every call, and FP8 pays where the GPU work is large).
"""

from __future__ import annotations

import torch

from fuseops.kernels import library
from fuseops.kernels.autodiff_state import batched_cotangents, refuse_batched_cotangents
from fuseops.kernels.dispatch import Kernel, launcher
from fuseops.kernels.gemm import grouped_scaled_act
from fuseops.kernels.quantization.epilogue import Emitted
from fuseops.kernels.quantization.formats import Scaling
from fuseops.kernels.quantized_ops import quantized_launcher
from fuseops.moe.expert_layer_steps import Gate, sum_token_rows, token_of_rows
from fuseops.moe.routing import permute_rows
from fuseops.ops import _checks
from fuseops.ops._quantized import QuantizedLinearSaved, quantized_forward, quantized_operands, quantized_wgrad
from fuseops.ops.executor.second_backward import input_links, once_differentiable
from fuseops.quant import linear_dgrad
from fuseops.quant.emit import EmitPlan, emitted_storage
from fuseops.quant.quantize import quantize_derived
from fuseops.quant.recipes import Recipe, TensorRole
from fuseops.quant.storage import QuantizedTensor

# Gradient formats whose quantize starts with an amax pass: the gated backward emits dz's row amaxes.
_PER_TENSOR = (Scaling.TENSOR, Scaling.NVFP4)


class _Saved:
    """A quantized GEMM's saved state split into tensors (saved through the autograd context, so
    saved-tensor hooks see them) and the rest (``restore`` joins them again)."""

    def __init__(self, saved: QuantizedLinearSaved | None) -> None:
        self.saved = saved
        self.x_count = len(saved.x.data_tensors()) if saved is not None and saved.x is not None else 0

    def tensors(self) -> tuple[torch.Tensor, ...]:
        return self.saved.x.data_tensors() if self.x_count else ()

    def restore(self, tensors: tuple[torch.Tensor, ...]) -> QuantizedLinearSaved | None:
        if not self.x_count:
            return self.saved
        x: QuantizedTensor = self.saved.x.with_data_tensors(tensors)
        return QuantizedLinearSaved(x=x, weight=self.saved.weight, recipe=self.saved.recipe,
                                    offsets=self.saved.offsets)


class QuantizedExpertLayer(torch.autograd.Function):
    """``expert_layer``'s Function under a recipe (module docstring)."""

    @staticmethod
    def forward(ctx, x, weights, w1, b1, w2, expert_ids, gate: Gate, recipe: Recipe, grad_enabled: bool,
                check: str, into_main_grad: tuple[bool, bool]):
        need_x, need_weights, need_w1, need_b1, need_w2 = (grad_enabled and n for n in ctx.needs_input_grad[:5])
        # dh is needed by everything before FC2.
        need_dh = need_x or need_weights or need_w1 or need_b1
        # The routing alone: a permute of no columns writes no rows.
        _, split_sizes, row_map = permute_rows(x[:, :0], expert_ids, w1.shape[0], check)
        offsets = launcher(Kernel.GROUP_OFFSETS, split_sizes)(split_sizes)
        tokens = token_of_rows(row_map)
        probs = None
        if weights is not None:
            # The weights in the sorted rows' order: the activation's row scale.
            probs = weights.new_empty(row_map.numel()).scatter_(0, row_map.reshape(-1), weights.reshape(-1))

        # The routing's offsets and tokens are in range by construction: no range checks.
        qx = quantize_derived(x, recipe, role=TensorRole.INPUT, rowwise=True,
                              columnwise=need_w1, offsets=offsets, rows=tokens)
        z, fc1, qh = _fc1_and_gate(qx, w1, b1, probs, offsets, gate, recipe, need_x=need_x, need_w1=need_w1,
                                   need_dh=need_dh, need_w2=need_w2)
        del qx
        y_sorted, fc2 = quantized_forward(recipe, qh, w2, None, need_dgrad=need_dh, need_wgrad=need_w2,
                                          offsets=offsets)
        del qh
        y = sum_token_rows(y_sorted, row_map)
        if any((need_x, need_weights, need_w1, need_b1, need_w2)):
            ctx.fc1, ctx.fc2 = _Saved(fc1), _Saved(fc2)
            ctx.save_for_backward(z if need_dh else None, probs, row_map, tokens, offsets, w1, b1, w2,
                                  *ctx.fc1.tensors(), *ctx.fc2.tensors())
            ctx.input_links = input_links((x, weights))
            ctx.gate, ctx.recipe = gate, recipe
            ctx.needs = (need_x, need_weights, need_w1, need_b1, need_w2)
            # The parameters whose main_grad the backward adds to (read then, as GroupedLinear does).
            ctx.main_grad_of = tuple(w if into else None for w, into in zip((w1, w2), into_main_grad, strict=True))
        return y

    @staticmethod
    @once_differentiable
    def backward(ctx, dy):
        if batched_cotangents(dy):
            refuse_batched_cotangents(quantized=True, communicating=[])
        z, probs, row_map, tokens, offsets, w1, b1, w2, *rest = ctx.saved_tensors
        fc1 = ctx.fc1.restore(tuple(rest[:ctx.fc1.x_count]))
        fc2 = ctx.fc2.restore(tuple(rest[ctx.fc1.x_count:]))
        need_x, need_weights, need_w1, need_b1, need_w2 = ctx.needs
        need_dh = need_x or need_weights or need_w1 or need_b1
        gate, recipe = ctx.gate, ctx.recipe
        dy = dy.contiguous()
        main_grad1, main_grad2 = (_checks.main_grad(w) if w is not None and need else None
                                  for w, need in zip(ctx.main_grad_of, (need_w1, need_w2), strict=True))
        # unpermute's gradient, each sorted row its token's dy, quantized where dy lies.
        qdy = quantize_derived(dy, recipe, role=TensorRole.GRAD, rowwise=need_dh,
                               columnwise=need_w2, offsets=offsets, rows=tokens)
        dw2 = quantized_wgrad(fc2, qdy, out_dtype=w2.dtype, main_grad=main_grad2) if need_w2 else None
        dx = dweights = dw1 = db1 = None
        if need_dh:
            dh = linear_dgrad(qdy, fc2.weight)
            del qdy
            dz, dprobs, qdz = _gated_backward(z, dh, probs, gate, recipe, offsets, need_x=need_x, need_w1=need_w1)
            del dh
            if need_x:
                dx = sum_token_rows(linear_dgrad(qdz, fc1.weight), row_map)
            if need_w1:
                dw1 = quantized_wgrad(fc1, qdz, out_dtype=w1.dtype, main_grad=main_grad1)
            if need_b1:
                db1 = library.grouped_bias_grad(dz, offsets)
            if need_weights:
                dweights = dprobs.index_select(0, row_map.reshape(-1)).view(row_map.shape)
        return dx, dweights, dw1, db1, dw2, None, None, None, None, None, None


def _fc1_and_gate(qx, w1, b1, probs, offsets, gate: Gate, recipe: Recipe, *, need_x: bool, need_w1: bool,
                  need_dh: bool, need_w2: bool) -> tuple:
    """``(z, FC1's saved state, FC2's quantized input)``: FC1's quantized GEMM and the scaled gate,
    fused in FC1's epilogue where that measured faster (``UNFUSED_FASTER`` names the formats where it
    did not); ``z`` None unless the backward needs it (``need_dh``)."""
    plan = EmitPlan(recipe, columnwise=need_w2)
    if recipe.format(TensorRole.INPUT).scaling in grouped_scaled_act.UNFUSED_FASTER:
        z, fc1 = quantized_forward(recipe, qx, w1, b1, need_dgrad=need_x, need_wgrad=need_w1, offsets=offsets)
        emitted = quantized_launcher(Kernel.GATED_QUANTIZE_FWD, z)(z, gate.act, probs=probs, **gate.kernel_args,
                                                                   **plan.kernel_args)
        return z, fc1, emitted_storage(plan, emitted, dtype=z.dtype, offsets=offsets)
    qx, qw1, fc1 = quantized_operands(recipe, qx, w1, need_dgrad=need_x, need_wgrad=need_w1, offsets=offsets)
    a = qx.rowwise_operand()
    emitted, z = quantized_launcher(Kernel.GROUPED_GEMM_SCALED_ACT, a.data)(
        a, qw1.rowwise_operand(), offsets, act=gate.act, bias=b1, save_preact=need_dh, out_dtype=w1.dtype,
        gated=True, probs=probs, **gate.kernel_args, **plan.kernel_args)
    return z, fc1, emitted_storage(plan, emitted, dtype=w1.dtype, offsets=offsets)


def _gated_backward(z, dh, probs, gate: Gate, recipe: Recipe, offsets, *, need_x: bool, need_w1: bool):
    """``(dz, dprobs, qdz)``: the gate's backward and FC1's output gradient quantized (row-wise for
    its dgrad, column-wise for its wgrad). Under a per-tensor gradient format with the dgrad
    needed, the gate's kernel emits each row's amax of ``dz`` and the cast reads the group amaxes
    from them (no amax pass over ``dz``); ``qdz`` is None when FC1 needs no gradient."""
    launch = launcher(Kernel.GATED_BWD, z)
    emit_amax = need_x and recipe.format(TensorRole.GRAD).scaling in _PER_TENSOR
    row_amax = torch.zeros(z.shape[0], dtype=torch.float32, device=z.device) if emit_amax else None
    dz, dprobs = launch(z, dh, gate.act, probs=probs, row_amax=row_amax, **gate.kernel_args)
    if not (need_x or need_w1):
        return dz, dprobs, None
    if emit_amax:
        plan = EmitPlan(recipe, columnwise=need_w1, role=TensorRole.GRAD)
        return dz, dprobs, emitted_storage(plan, Emitted(dz, None, None, row_amax), dtype=dz.dtype, offsets=offsets)
    qdz = quantize_derived(dz, recipe, role=TensorRole.GRAD, rowwise=need_x,
                           columnwise=need_w1, offsets=offsets)
    return dz, dprobs, qdz
