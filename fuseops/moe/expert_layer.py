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
- Default: the layer's input ``x`` and the pre-activation ``z`` are saved (h is rebuilt from z
  in FC2's dgrad epilogue), not the permuted input ``x_sorted``: the forward frees it right
  after FC1, the backward makes it again for FC1's weight gradient alone, and writes ``dz``
  over ``z``. The GEMMs read permuted copies (``x_sorted``, ``dy_sorted``) by TMA, faster than
  the pointer loads gather rows.
- ``lean``: nothing of size T*K is saved and no permuted copy is ever made: every GEMM reads
  the rows of ``x`` and ``dy`` through the row map inside its loads (the Triton kernels'
  pointer paths), and the backward recomputes ``z`` (one more FC1 GEMM, 4*T*K*H*F FLOPs:
  about a fifth of the step).
- The backward frees ``dy_sorted``, ``h``, ``dz`` and ``x_sorted`` as soon as they are dead,
  runs FC1's and FC2's weight gradients in the order memory_model.py finds peaks lower for the
  shape, and makes the default's ``x_sorted`` in column slices, one at a time, where it finds
  the whole copy at the peak. The default mode releases its saved tensors early only when the
  backward frees the graph and no saved-tensor hooks (offloading) hold them.
- ``accumulate_into_main_grad`` on a GroupedLinear: the wgrad kernel adds that weight's gradient
  to its float32 ``main_grad`` (read at each backward, as the composition reads it) and returns
  none, eagerly and under a recipe; under ``torch.compile`` the composition runs (the layer's
  operators are functional).

Everything stays on the device: no host sync, and the step captures in a CUDA graph. Under a
recipe (``fuseops.autocast``) the layer is ``expert_layer_quantized.py``'s Function, whose GEMMs
read the permuted tokens and their gradients quantized straight from ``x`` and ``dy``.
Where neither applies (``expert_layer_fallback`` says why) the composition runs.

The forward and the backward bodies are in ``expert_layer_steps.py``; under ``torch.compile``
each is one custom operator.
"""

from __future__ import annotations

from typing import Any

import torch

from fuseops.kernels import autodiff_state
from fuseops.moe import expert_layer_steps as steps
from fuseops.moe.expert_layer_quantized import QuantizedExpertLayer
from fuseops.moe.routing import check_routing, check_weights, permute_checked, unpermute
from fuseops.ops import _checks
from fuseops.ops.executor.saved_state import graph_freed_after_backward
from fuseops.ops.executor.second_backward import input_links, once_differentiable
from fuseops.ops.gated import GatedActivation
from fuseops.ops.grouped_linear import GroupedLinear
from fuseops.quant.autocast import current_recipe


class _ExpertLayer(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weights, w1, b1, w2, expert_ids, gate: steps.Gate, lean: bool, grad_enabled: bool,
                check: str, into_main_grad: tuple[bool, bool]):
        # needs_input_grad reads requires_grad even under torch.no_grad (inference): nothing to keep.
        backward = grad_enabled and any(ctx.needs_input_grad[:5])
        keep = backward and not lean
        y, row_map, z, probs, offsets = steps.forward(x, weights, w1, b1, w2, expert_ids, gate, keep, lean, check)
        if backward:
            ctx.save_for_backward(x, z, probs, row_map, offsets, w1, b1, w2)
            ctx.input_links = input_links((x, weights))
            ctx.gate, ctx.lean = gate, lean
            ctx.main_grad_of = _main_grad_owners((w1, w2), into_main_grad)
            # Saved-tensor hooks (offloading) may hand back tensors that are not ours to free;
            # a compiled backward never frees early (graph_freed_after_backward), so no probe.
            ctx.hooked = torch.compiler.is_compiling() or (
                torch._C._autograd._top_saved_tensors_default_hooks(False) is not None)
        return y

    @staticmethod
    @once_differentiable
    def backward(ctx, dy):
        if autodiff_state.batched_cotangents(dy):
            into_main_grad = [name for name, w in zip(("FC1", "FC2"), ctx.main_grad_of) if w is not None]
            autodiff_state.refuse_batched_cotangents(False, [], into_main_grad)
            return *steps.backward_batched(dy, *ctx.saved_tensors, gate=ctx.gate, lean=ctx.lean,
                                           needs=tuple(ctx.needs_input_grad[:5])), None, None, None, None, None, None
        # dz goes over z when nothing reads z again; dead saved tensors are freed early.
        freed = graph_freed_after_backward()
        grads = steps.backward(dy, *ctx.saved_tensors, gate=ctx.gate, lean=ctx.lean,
                               needs=tuple(ctx.needs_input_grad[:5]), overwrite=ctx.lean or freed,
                               may_release=freed and not ctx.hooked,
                               main_grads=_main_grads(ctx.main_grad_of, ctx.needs_input_grad))
        return *grads, None, None, None, None, None, None


def _main_grad_owners(weights: tuple[torch.Tensor, torch.Tensor], into_main_grad: tuple[bool, bool]) -> tuple:
    """FC1's and FC2's weight where its gradient goes into its ``main_grad`` (else None): the
    parameters themselves, whose ``main_grad`` the backward reads when it runs, as the
    composition's GroupedLinear does (a buffer swapped between the steps is the one added to)."""
    return tuple(w if into else None for w, into in zip(weights, into_main_grad, strict=True))


def _main_grads(owners: tuple, needs: tuple[bool, ...]) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """``_main_grad_owners``' buffers where their weight's gradient is needed (``needs``: the
    Function's ``needs_input_grad``, w1 and w2 its inputs 2 and 4), checked: a ValueError names
    one missing or malformed."""
    return tuple(_checks.main_grad(w) if w is not None and need else None
                 for w, need in zip(owners, (needs[2], needs[4]), strict=True))


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


def expert_layer_fallback(
    x: torch.Tensor,
    expert_ids: torch.Tensor,
    weights: torch.Tensor | None,
    experts: Any,
    *,
    lean: bool = False,
) -> str | None:
    """Why ``expert_layer`` with these arguments runs ``permute -> experts -> unpermute``
    instead of its fused Function, or None when it fuses (under a recipe: its quantized
    Function, ``expert_layer_quantized.py``).

    Args:
        x, expert_ids, weights, experts, lean: as ``expert_layer`` takes them, checked as it
            checks them (the same TypeError / ValueError for invalid ones).
    Returns:
        The first reason that applies, or None.
    """
    x, _, _, _, parts, lean = _checked(x, expert_ids, weights, experts, lean)
    return _fallback(x, experts, parts, lean, current_recipe())


def _checked(x: object, expert_ids: object, weights: object, experts: Any, lean: object) -> tuple:
    """``expert_layer``'s arguments checked: ``(x, expert_ids, weights, check, parts, lean)``,
    the tensors contiguous, ``check`` the routing's range check (``check_routing``)."""
    lean = _checks.flag("lean", lean)
    parts = _parts(experts)
    fc1 = parts[0]
    x, expert_ids, check = check_routing(x, expert_ids, fc1.num_groups)
    if x.shape[1] != fc1.in_features:
        raise ValueError(f"x: expected {fc1.in_features} features (the experts' in_features), "
                         f"got {_checks.shown(x.shape[1])}")
    weights = check_weights(weights, expert_ids.shape, "expert_ids'", x, "x")
    return x, expert_ids, weights, check, parts, lean


def _fallback(x: torch.Tensor, experts: Any, parts: tuple[GroupedLinear, Any, GroupedLinear],
              lean: bool, recipe: Any) -> str | None:
    """``expert_layer_fallback`` for ``experts`` split into ``parts`` under ``recipe`` (the
    ``fuseops.autocast`` recipe in effect, read once by the caller): the first reason that
    applies, checked in order and no further (every call of the layer asks)."""
    fc1, act, fc2 = parts
    if not getattr(experts, "fuse", True):
        return "experts built with fuse=False"
    for op in parts:
        # A user's subclass with its own math (``BasicOp.computes_as_parent``) runs its own code.
        unknown = type(op).unfusible_reason()
        if unknown is not None:
            return unknown
    if not isinstance(act, GatedActivation):
        return f"{type(act).__name__} is not a gated activation"
    if fc2.bias is not None:
        return "FC2 has a bias: the router weights cannot scale FC1's output instead"
    # Mismatched widths: the composition's Sequential reports them.
    if fc1.out_features != 2 * fc2.in_features:
        return "FC1's out_features is not twice FC2's in_features"
    if (fc1.accumulate_into_main_grad or fc2.accumulate_into_main_grad) and torch.compiler.is_compiling():
        # The compiled layer's operators are functional: the composition's GroupedLinear adds
        # into main_grad under torch.compile.
        return "accumulate_into_main_grad under torch.compile"
    if _hooked(experts) or _hooked(fc1) or _hooked(act) or _hooked(fc2):
        return "module hooks on the experts"
    if recipe is not None:
        if lean:
            return "lean under a recipe: the quantized layer keeps FC1's pre-activation"
        if x.dtype == torch.float64:
            return "float64 x: the quantized GEMMs take float32, float16 or bfloat16"
    device = x.device
    if torch.is_autocast_enabled(device.type):
        return "torch.autocast is active"
    # (``forward_ad``'s level is not read while dynamo traces: it would be one more guard.)
    dual = not torch.compiler.is_compiling() and autodiff_state.dual_level_active()
    if torch._C._are_functorch_transforms_active() or dual:
        # The composition's permute, experts and unpermute run as plain torch there.
        return "a torch.func transform or torch.autograd.forward_ad is active"
    for p in (fc1.weight, fc1.bias, fc2.weight):
        if p is not None and (p.dtype != x.dtype or p.device != device):
            return "parameters' dtype or device differ from x's"
    return None


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
    for the backward: by default ``x`` and FC1's pre-activation; with ``lean`` nothing beyond
    the inputs (one more FC1 GEMM in the backward).

    Args:
        x: [T, H] float32, float16 or bfloat16 (float64 on CPU).
        expert_ids: [T, K] integer, on ``x``'s device: each token's K experts.
        weights: [T, K] float32 or ``x``'s dtype (router probabilities), or None for a plain sum.
        experts: ``fuseops.Sequential(GroupedLinear(E, H, 2F), gated activation,
            GroupedLinear(E, F, H))``; a scaled gated activation gets the weights as its probs.
            Other activations (``GroupedLinear(E, H, F)``, then e.g. GELU) run the composition.
        lean: also recompute FC1's pre-activation in the backward instead of keeping it (not
            under a recipe: the composition runs).
    Under ``fuseops.autocast(recipe=...)`` the GEMMs are quantized (``expert_layer_quantized.py``;
    the composition's results, bit for bit).

    Returns:
        ``y`` [T, H] in ``x``'s dtype; differentiable in ``x``, ``weights`` and the experts'
        parameters.
    """
    try:
        x, expert_ids, weights, check, parts, lean = _checked(x, expert_ids, weights, experts, lean)
    except (ValueError, TypeError) as error:
        # Eagerly raised at once; while tracing, by the compiled graph (the output would be x's shape).
        return _checks.refused_while_tracing(error, x if isinstance(x, torch.Tensor) else torch.empty(0))
    fc1, act, fc2 = parts
    recipe = current_recipe()
    if _fallback(x, experts, parts, lean, recipe) is None:
        gate = steps.Gate(act.act, act.kernel_args)
        into_main_grad = (fc1.accumulate_into_main_grad, fc2.accumulate_into_main_grad)
        if recipe is not None:
            return QuantizedExpertLayer.apply(x, weights, fc1.weight, fc1.bias, fc2.weight, expert_ids, gate, recipe,
                                              torch.is_grad_enabled(), check, into_main_grad)
        return _ExpertLayer.apply(x, weights, fc1.weight, fc1.bias, fc2.weight, expert_ids, gate, lean,
                                  torch.is_grad_enabled(), check, into_main_grad)
    x_sorted, split_sizes, row_map = permute_checked(x, expert_ids, fc1.num_groups, check)
    if getattr(act, "scaled", False):
        w = weights if weights is not None else x.new_ones(expert_ids.shape)
        probs = w.new_empty(row_map.numel()).scatter(0, row_map.reshape(-1), w.reshape(-1))
        return unpermute(experts(x_sorted, split_sizes, probs, split_sizes), row_map, None)
    return unpermute(experts(x_sorted, split_sizes, split_sizes), row_map, weights)
