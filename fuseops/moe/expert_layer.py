"""The whole MoE expert layer, routing to combine, as one autograd Function::

    y = fuseops.moe.expert_layer(x, expert_ids, weights, experts)              # default
    y = fuseops.moe.expert_layer(x, expert_ids, weights, experts, lean=True)   # keeps no [T*K, ...] tensor

It computes what ``permute -> experts -> unpermute`` computes, and owns every intermediate's
lifetime, which the composition cannot: there, unpermute's gradient ``dy_sorted`` [T*K, H] is
an input of the experts' backward and lives through all of it, and FC1's input gradient is
summed per token only after FC1's weight gradient. memory_model.py has the accounting.

- The router weights scale FC1's activation in its epilogue (``h = gated(z) * p``; exact
  because FC2 has no bias), so the combine is an unweighted sum of each token's K rows:
  one gather-side reduction (kernels/moe/permute.py), in a fixed order, no atomics, the same
  bits every run. Its input is never kept: the weights' gradient comes from FC2's dgrad
  epilogue (``dprobs``), which reads the pre-activation it already loads.
- Default: the permuted input ``x_sorted`` and the pre-activation ``z`` are saved (h is
  rebuilt from z in FC2's dgrad epilogue); the backward writes ``dz`` over ``z``.
- ``lean``: nothing of size T*K is saved; the backward gathers ``x_sorted`` from ``x`` again to
  recompute ``z`` with one more FC1 GEMM (4*T*K*H*F FLOPs: about a fifth of the step), drops it,
  and FC1's weight gradient reads ``x``'s rows through the row map inside its loads (the
  Triton wgrad's pointer path: on sm_90 not the Gluon kernel, which loads by TMA).
- The backward frees ``dy_sorted``, ``h``, ``dz`` and ``x_sorted`` as soon as they are dead and
  runs FC1's and FC2's weight gradients in the order memory_model.py finds peaks lower for the
  shape. The default mode releases its saved tensors early only when the backward frees the
  graph and no saved-tensor hooks (offloading) hold them.

Everything stays on the device: no host sync, and the step captures in a CUDA graph. Where
the fused path does not apply (``expert_layer_fallback`` says why) the composition runs.

The forward and the backward each go through a graph state of ``routing_graphs`` (one per
layer, decided by measurement as the routing's calls are): where the host path outlasts the GPU
work (small token counts) each replays as one CUDA graph. The backward is graphed only where
the forward was (its saved tensors lie in graph memory, which it never frees early: the forward's
graph keeps that memory for its next replay); where the forward ran eagerly (GPU-bound token
counts) the backward runs eagerly and frees as above.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Any

import torch
from torch.autograd.function import once_differentiable

from fuseops.kernels import library
from fuseops.kernels.dispatch import Kernel, launcher
from fuseops.kernels.elementwise.activation_math import Activation
from fuseops.moe import memory_model, routing_graphs
from fuseops.moe.routing import check_routing, check_weights, permute_checked, permute_rows, unpermute
from fuseops.ops import _checks
from fuseops.ops.executor import graphed
from fuseops.ops.executor.saved_state import graph_freed_after_backward
from fuseops.ops.gated import GatedActivation
from fuseops.ops.grouped_linear import GroupedLinear
from fuseops.quant.autocast import current_recipe


@dataclass(frozen=True)
class _Gate:
    act: Activation
    kernel_args: dict[str, Any]

    @property
    def key(self) -> tuple:
        """What tells two gates apart, hashable (a graph state's signature)."""
        return self.act, tuple(sorted(self.kernel_args.items()))


def _gather_rows(x: torch.Tensor, row_map: torch.Tensor) -> torch.Tensor:
    """``x_sorted[row_map[t, k]] = x[t]``: permute's copy, for a known routing."""
    x_sorted, _ = launcher(Kernel.UNPERMUTE_BWD, x)(x, row_map, None, None)
    return x_sorted


def _sum_rows(rows: torch.Tensor, row_map: torch.Tensor) -> torch.Tensor:
    """``out[t] = sum_k rows[row_map[t, k]]``, in float32, k in order (deterministic)."""
    return launcher(Kernel.UNPERMUTE, rows)(rows, row_map, None)


def _token_of_rows(row_map: torch.Tensor) -> torch.Tensor:
    """[T*K] int64: the token whose row each sorted row is (``row_map``'s inverse, // K)."""
    flat = row_map.reshape(-1)
    tokens = torch.arange(flat.numel(), device=flat.device) // row_map.shape[1]
    return torch.empty_like(flat).scatter_(0, flat, tokens)


def _release(*tensors: torch.Tensor | None) -> None:
    """Free the memory of saved tensors that are dead: the autograd node would hold them to
    the end of the backward. Only for tensors this Function made, when nothing reads them again
    (the graph is freed after this backward and no saved-tensor hook holds them)."""
    for t in tensors:
        if t is not None:
            t.untyped_storage().resize_(0)


def _forward(x, weights, w1, b1, w2, expert_ids, *, gate: _Gate, keep: bool, check: str) -> tuple:
    """``(y, x_sorted, row_map, z, probs, offsets)``, x_sorted and z None unless ``keep``."""
    x_sorted, split_sizes, row_map = permute_rows(x, expert_ids, w1.shape[0], check)
    offsets = launcher(Kernel.GROUP_OFFSETS, split_sizes)(split_sizes)
    probs = None
    if weights is not None:
        # The weights in x_sorted's row order: FC1's epilogue row scale.
        probs = weights.new_empty(row_map.numel()).scatter_(0, row_map.reshape(-1), weights.reshape(-1))
    h, z = library.grouped_gemm_gated(x_sorted, w1.transpose(1, 2), offsets, bias=b1, act=gate.act,
                                      probs=probs, save_preact=keep, **gate.kernel_args)
    y_sorted, _ = library.grouped_gemm(h, w2.transpose(1, 2), offsets)
    del h
    return _sum_rows(y_sorted, row_map), x_sorted if keep else None, row_map, z, probs, offsets


class _ExpertLayer(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weights, w1, b1, w2, expert_ids, gate: _Gate, lean: bool, grad_enabled: bool, check: str):
        E = w1.shape[0]
        # needs_input_grad reads requires_grad even under torch.no_grad (inference): nothing to keep.
        backward = grad_enabled and any(ctx.needs_input_grad[:5])
        keep = backward and not lean
        # Through a graph state (routing_graphs: host-bound token counts replay one CUDA graph
        # for the whole forward); its row map (result 2) keys the backward's state.
        y, x_sorted, row_map, z, probs, offsets = routing_graphs.call(
            "expert_layer", partial(_forward, gate=gate, keep=keep, check=check),
            (x, weights, w1, b1, w2, expert_ids), (gate.key, keep, check))
        if backward:
            ctx.save_for_backward(x if lean else None, x_sorted, z, probs, row_map, offsets, w1, b1, w2)
            ctx.gate, ctx.lean = gate, lean
            ctx.shape = memory_model.LayerShape(x.shape[0], expert_ids.shape[1], x.shape[1], w2.shape[2], E,
                                                x.element_size())
            # Saved-tensor hooks (offloading) may hand back tensors that are not ours to free;
            # a compiled backward never frees early (graph_freed_after_backward), so no probe.
            ctx.hooked = torch.compiler.is_compiling() or (
                torch._C._autograd._top_saved_tensors_default_hooks(False) is not None)
        return y

    @staticmethod
    @once_differentiable
    def backward(ctx, dy):
        x, x_sorted, z, probs, row_map, offsets, w1, b1, w2 = ctx.saved_tensors
        freed = graph_freed_after_backward()
        # dz goes over z when nothing reads z again; dead saved tensors are freed early, but
        # never in graph memory (the forward's graph keeps its results: nothing to free, and
        # its next replay writes there). The backward is graphed where the forward was.
        graphs = graphed.in_graph_memory(row_map)
        overwrite = ctx.lean or freed
        releasable = ctx.lean or (freed and not ctx.hooked and not graphs)
        static = (ctx.gate, ctx.lean, tuple(ctx.needs_input_grad[:5]), overwrite,
                  releasable and memory_model.fc1_weight_grad_first(ctx.shape, ctx.lean))
        run = partial(_backward, static=static)
        inputs = (dy, x, x_sorted, z, probs, row_map, offsets, w1, b1, w2)
        if graphs:
            grads = routing_graphs.call("expert_layer_backward", run, inputs, (ctx.gate.key, *static[1:]),
                                        row_map=row_map)
        else:
            grads = run(*inputs)
        return *grads, None, None, None, None, None


def _backward(dy, x, x_sorted, z, probs, row_map, offsets, w1, b1, w2, *, static: tuple) -> tuple:
    """``(dx, dweights, dw1, db1, dw2)`` of ``_ExpertLayer``; ``static`` as its backward makes it."""
    gate, lean, needs, overwrite, fc1_first = static
    need_x, need_weights, need_w1, need_b1, need_w2 = needs
    # Made contiguous here, inside a graph: ``loss.sum()``'s gradient is one element expanded,
    # which a graph copies in as that one element.
    dy = dy.contiguous()
    if lean:
        x_sorted = _gather_rows(x, row_map)
        z, _ = library.grouped_gemm(x_sorted, w1.transpose(1, 2), offsets, bias=b1)
        x_sorted = None
    dy_sorted = _gather_rows(dy, row_map)
    dz = dprobs = h = None
    if need_x or need_w1 or need_b1 or need_weights:
        dz, dprobs, h = library.grouped_gemm_dgrad_gated(
            dy_sorted, w2, offsets, z, act=gate.act, probs=probs, want_h=need_w2,
            out=z if overwrite else None, **gate.kernel_args)
    elif need_w2:
        h = launcher(Kernel.GATED_FWD, z)(z, gate.act, probs=probs, **gate.kernel_args)
    dw2 = None
    if need_w2 and not fc1_first:
        dw2 = library.grouped_gemm_wgrad(dy_sorted, h, offsets)
    if not fc1_first:
        h = dy_sorted = None

    dx = dw1 = db1 = None
    if need_x:
        dx_sorted, _ = library.grouped_gemm(dz, w1, offsets)
        dx = _sum_rows(dx_sorted, row_map)
        del dx_sorted
    if need_w1 and lean:
        # x's rows gathered inside the wgrad's loads: no x_sorted at this, lean's peak stage.
        dw1 = library.grouped_gemm_wgrad(dz, x, offsets, x_rows=_token_of_rows(row_map))
    elif need_w1:
        dw1 = library.grouped_gemm_wgrad(dz, x_sorted, offsets)
    if need_b1:
        db1 = library.grouped_bias_grad(dz, offsets)
    if fc1_first:
        if lean:
            z = dz = None
        else:
            _release(z, x_sorted)
        if need_w2:
            dw2 = library.grouped_gemm_wgrad(dy_sorted, h, offsets)
    dweights = None
    if need_weights:
        dweights = dprobs.index_select(0, row_map.reshape(-1)).view(row_map.shape)
    return dx, dweights, dw1, db1, dw2


def _parts(experts: Any) -> tuple[GroupedLinear, Any, GroupedLinear]:
    """FC1, the activation and FC2 of ``experts``, or a TypeError / ValueError saying what
    ``expert_layer`` expects."""
    ops = list(experts) if isinstance(experts, torch.nn.Module) and hasattr(experts, "__iter__") else None
    expected = "a fuseops.Sequential(GroupedLinear(E, H, 2F or F), activation, GroupedLinear(E, F, H))"
    if ops is None or len(ops) != 3 or not isinstance(ops[0], GroupedLinear) or not isinstance(ops[2], GroupedLinear):
        got = f" of {[type(op).__name__ for op in ops]}" if ops is not None else ""
        raise TypeError(f"experts: expected {expected}, got {type(experts).__name__}{got}")
    fc1, act, fc2 = ops
    if fc1.num_groups != fc2.num_groups:
        raise ValueError(f"experts: expected both GroupedLinears to have the same number of experts, got "
                         f"{fc1.num_groups} and {fc2.num_groups}")
    if act.num_extra_inputs > (1 if getattr(act, "scaled", False) else 0):
        raise TypeError(f"experts: expected an activation without extra inputs (or a scaled gated one), "
                        f"got {type(act).__name__}")
    return fc1, act, fc2


def _hooked(module: torch.nn.Module) -> bool:
    return bool(module._forward_hooks or module._forward_pre_hooks or module._backward_hooks
                or module._backward_pre_hooks)


def expert_layer_fallback(x: torch.Tensor, weights: torch.Tensor | None, experts: Any) -> str | None:
    """Why ``expert_layer`` runs ``permute -> experts -> unpermute`` instead of its fused
    Function for these arguments, or None when it fuses."""
    fc1, act, fc2 = _parts(experts)
    reasons = (
        (not getattr(experts, "fuse", True), "experts built with fuse=False"),
        (not isinstance(act, GatedActivation), f"{type(act).__name__} is not a gated activation"),
        (fc2.bias is not None, "FC2 has a bias: the router weights cannot scale FC1's output instead"),
        # Mismatched widths: the composition's Sequential reports them.
        (fc1.out_features != 2 * fc2.in_features, "FC1's out_features is not twice FC2's in_features"),
        (fc1.accumulate_into_main_grad or fc2.accumulate_into_main_grad, "accumulate_into_main_grad"),
        (any(_hooked(m) for m in (experts, fc1, act, fc2)), "module hooks on the experts"),
        (current_recipe() is not None, "a fuseops.autocast recipe is active"),
        (torch.is_autocast_enabled(x.device.type), "torch.autocast is active"),
        (torch._C._are_functorch_transforms_active(), "a torch.func transform is active"),
        (any(p is not None and (p.dtype != x.dtype or p.device != x.device)
             for p in (fc1.weight, fc1.bias, fc2.weight)), "parameters' dtype or device differ from x's"),
    )
    return next((why for applies, why in reasons if applies), None)


def expert_layer(
    x: torch.Tensor,
    expert_ids: torch.Tensor,
    weights: torch.Tensor | None,
    experts: Any,
    *,
    lean: bool = False,
) -> torch.Tensor:
    """The MoE expert layer: ``y[t] = sum_k weights[t, k] * experts_{ids[t, k]}(x[t])``.

    The same result as ``permute -> experts -> unpermute`` (module docstring), keeping less
    for the backward: by default the permuted input and FC1's pre-activation; with ``lean``
    nothing beyond the inputs (one more FC1 GEMM in the backward).

    Args:
        x: [T, H] float32, float16 or bfloat16 (float64 on CPU).
        expert_ids: [T, K] integer, on ``x``'s device: each token's K experts.
        weights: [T, K] float32 or ``x``'s dtype (router probabilities), or None for a plain sum.
        experts: ``fuseops.Sequential(GroupedLinear(E, H, 2F), gated activation,
            GroupedLinear(E, F, H))``; a scaled gated activation gets the weights as its probs.
            Other activations (``GroupedLinear(E, H, F)``, then e.g. GELU) run the composition.
        lean: also recompute FC1's pre-activation in the backward instead of keeping it.
    Returns:
        ``y`` [T, H] in ``x``'s dtype; differentiable in ``x``, ``weights`` and the experts'
        parameters.
    """
    lean = _checks.flag("lean", lean)
    fc1, act, fc2 = _parts(experts)
    x, expert_ids, check = check_routing(x, expert_ids, fc1.num_groups)
    if x.shape[1] != fc1.in_features:
        raise ValueError(f"x: expected {fc1.in_features} features (the experts' in_features), got {x.shape[1]}")
    weights = check_weights(weights, expert_ids.shape, "expert_ids'", x, "x")
    if expert_layer_fallback(x, weights, experts) is None:
        gate = _Gate(act.act, act.kernel_args)
        return _ExpertLayer.apply(x, weights, fc1.weight, fc1.bias, fc2.weight, expert_ids, gate, lean,
                                  torch.is_grad_enabled(), check)
    x_sorted, split_sizes, row_map = permute_checked(x, expert_ids, fc1.num_groups, check)
    if getattr(act, "scaled", False):
        w = weights if weights is not None else x.new_ones(expert_ids.shape)
        probs = w.new_empty(row_map.numel()).scatter(0, row_map.reshape(-1), w.reshape(-1))
        return unpermute(experts(x_sorted, split_sizes, probs, split_sizes), row_map, None)
    return unpermute(experts(x_sorted, split_sizes, split_sizes), row_map, weights)
