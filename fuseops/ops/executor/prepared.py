"""What running a plan needs besides the call's tensors, decided once per call signature.

A ``Prepared`` run holds the plan, the op contexts as templates, where each parameter and
extra input sits among the autograd Function's inputs, and the bookkeeping backward reads.
Everything in it follows from what ``fuseops.call_cache`` puts in a call's signature (shapes,
dtypes, devices, which tensors need grad, which extra inputs are the same object, recipe,
autocast, training flags), so ``Sequential`` keeps one per signature and a call that hits
only gathers its tensors and runs (``run_prepared``). It holds no tensor and no value of an
extra input: those come from each call, so a kept run keeps no memory alive.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from fuseops.kernels import autodiff_state
from fuseops.ops.contract import OpContext, fresh_contexts
from fuseops.ops.executor import plain_autograd
from fuseops.ops.executor.function import (
    Arg,
    PlanFunction,
    PlanFunctionForTransforms,
    RunState,
    apply_eagerly,
    autocast_off,
    per_op_extras,
    run_forward,
)


@dataclass(frozen=True)
class Prepared:
    plan: Any
    # Templates: every call runs on fresh copies (``OpContext.with_saved``).
    ctxs: tuple[OpContext, ...]
    needs_backward: bool
    device_type: str
    # Whether any op runs under torch.autocast (backward then casts each gradient back).
    autocast: bool
    # Per op, the slice of the call's flat extra inputs it takes, and of the Function's flat
    # extra-output gradients its backward reads.
    extra_spans: tuple[tuple[int, int], ...]
    extra_output_spans: tuple[tuple[int, int], ...]
    num_extra_outputs: int
    # The ops that take extra inputs; a ``()`` per op (no extra inputs, no extra-output gradients).
    extra_takers: tuple[int, ...]
    empty_per_op: tuple[tuple[()], ...]
    # Per flat extra input: the Function input it is passed as (``Arg``), or None for a value
    # that is not a tensor (each call hands its own).
    extra_args: tuple[Arg | None, ...]
    # Positions in the flat extra inputs of the tensors passed after x, each object once.
    input_picks: tuple[int, ...]
    input_dtypes: tuple[torch.dtype, ...]
    num_inputs: int
    # Positions in ``flat_parameters(ops)`` of the parameters passed (tied ones once), and per
    # op, parameter name -> position among those passed.
    param_picks: tuple[int, ...]
    param_slots: tuple[dict[str, int], ...]
    # Per call work these spare: every flat extra input is a tensor (``extra_args`` is then the
    # Function's template as it is); no parameter is tied (the call's list is passed as it is).
    extras_all_tensors: bool
    params_untied: bool



def flat_parameters(ops: Sequence[torch.nn.Module]) -> list[torch.nn.Parameter]:
    """Every op's own parameters in op order (a tied one once per op holding it)."""
    return [p for op in ops for _, p in op.own_parameters()]


def parameter_slots(ops: Sequence[torch.nn.Module]
                    ) -> tuple[list[torch.nn.Parameter], list[int], list[dict[str, int]]]:
    """The ops' parameters each once, in order (a tied one once: dynamo cannot trace a Function
    given one tensor twice; compared with ``is``, not ``id()``, which dynamo would guard); the
    position in ``flat_parameters(ops)`` of each; per op, parameter name -> its position among
    them."""
    unique: list[torch.nn.Parameter] = []
    picks, slots, flat = [], [], 0
    for op in ops:
        op_slots = {}
        for name, p in op.own_parameters():
            index = next((i for i, q in enumerate(unique) if q is p), len(unique))
            if index == len(unique):
                unique.append(p)
                picks.append(flat)
            op_slots[name] = index
            flat += 1
        slots.append(op_slots)
    return unique, picks, slots


def _spans(counts: Sequence[int]) -> tuple[tuple[int, int], ...]:
    out, start = [], 0
    for n in counts:
        out.append((start, start + n))
        start += n
    return tuple(out)


def prepare(
    plan: Any, ops: Sequence[torch.nn.Module], ctxs: Sequence[OpContext], x: torch.Tensor,
    extra_inputs: Sequence[Any], params: Sequence[torch.nn.Parameter],
) -> Prepared:
    """The ``Prepared`` run of ``plan`` for a call like this one (``extra_inputs`` flat,
    ``params`` from ``flat_parameters``)."""
    # Each tensor passed once: dynamo cannot trace a Function given one tensor twice.
    # Compared with ``is``, not by ``id()``: dynamo would guard on each tensor's identity.
    inputs: list[torch.Tensor] = [x]
    picks, args = [], []
    for k, e in enumerate(extra_inputs):
        if not isinstance(e, torch.Tensor):
            args.append(None)
            continue
        index = next((i for i, t in enumerate(inputs) if t is e), len(inputs))
        if index == len(inputs):
            inputs.append(e)
            picks.append(k)
        args.append(Arg(index))
    _, param_picks, slots = parameter_slots(ops)
    return Prepared(
        plan=plan,
        ctxs=tuple(ctxs),
        needs_backward=any(ctx.needs_backward for ctx in ctxs),
        device_type=x.device.type,
        autocast=any(ctx.autocast is not None for ctx in ctxs),
        extra_spans=_spans([op.num_extra_inputs for op in ops]),
        extra_output_spans=_spans([op.num_extra_outputs for op in ops]),
        num_extra_outputs=sum(op.num_extra_outputs for op in ops),
        extra_takers=tuple(i for i, op in enumerate(ops) if op.num_extra_inputs),
        empty_per_op=((),) * len(ops),
        extra_args=tuple(args),
        input_picks=tuple(picks),
        input_dtypes=tuple(t.dtype for t in inputs),
        num_inputs=len(inputs),
        param_picks=tuple(param_picks),
        param_slots=tuple(slots),
        extras_all_tensors=all(a is not None for a in args),
        params_untied=param_picks == list(range(len(params))),
    )


def forward_without_grad(prep: Prepared, ops: Sequence[torch.nn.Module], x: torch.Tensor,
                         extra_inputs: Sequence[Any], compiling: bool) -> list[torch.Tensor]:
    """``[y, *extra outputs]`` of a call that needs no backward (no autograd Function);
    ``compiling``: torch.compile may be tracing it."""
    per_op = per_op_extras(prep, extra_inputs)
    ctxs = [ctx.with_saved(None) for ctx in prep.ctxs] if compiling else fresh_contexts(prep.ctxs)
    # The signature holds the autocast state: without autocast at prepare, none now.
    if prep.autocast:
        with autocast_off(prep.device_type):
            y, extra_outputs = run_forward(prep.plan, ops, ctxs, x, per_op)
    else:
        y, extra_outputs = run_forward(prep.plan, ops, ctxs, x, per_op)
    if not prep.num_extra_outputs:
        return [y]
    return [y, *[t for outs in extra_outputs for t in outs]]


def run_prepared(
    prep: Prepared, ops: Sequence[torch.nn.Module], x: torch.Tensor, extra_inputs: Sequence[Any],
    params: Sequence[torch.nn.Parameter], *, compiling: bool = True,
) -> Any:
    """Run ``prep`` on this call's tensors; returns ``y`` or ``(y, *extra_outputs)``. Not
    ``compiling``: the caller knows torch.compile is not tracing this call."""
    transforms = torch._C._are_functorch_transforms_active()
    # (``forward_ad``'s level is not read while dynamo traces: it would be one more guard.)
    dual = (not compiling or not torch.compiler.is_compiling()) and autodiff_state.dual_level_active()
    if (transforms or dual) and plain_autograd.needed():
        # Forward-mode or higher-order derivatives: torch differentiates the ops' forward itself.
        return plain_autograd.run(prep, ops, x, extra_inputs)
    if not prep.needs_backward:
        flat = forward_without_grad(prep, ops, x, extra_inputs, compiling)
        return (*flat,) if prep.num_extra_outputs else flat[0]

    if prep.extras_all_tensors:
        template = prep.extra_args
    else:
        template = tuple([e if a is None else a for e, a in zip(extra_inputs, prep.extra_args)])
    state = RunState(prep, ops, template, params if prep.params_untied else [params[i] for i in prep.param_picks])
    inputs = [extra_inputs[i] for i in prep.input_picks] if prep.input_picks else ()
    # torch.func needs the setup_context form; torch.compile traces the other.
    if transforms:
        outputs = PlanFunctionForTransforms.apply(state, x, *inputs, *state.params)[: state.num_outputs]
    elif compiling:
        outputs = PlanFunction.apply(state, x, *inputs, *state.params)
    else:
        outputs = apply_eagerly(state, x, *inputs, *state.params)
    y = outputs[0]
    state.output_shape, state.output_dtype, state.output_device = tuple(y.shape), y.dtype, y.device
    return outputs if prep.num_extra_outputs else y
