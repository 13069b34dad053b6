"""The plan's ``torch.autograd.Function``: one forward and one backward over a plan's steps.

Saved state crosses the autograd boundary by role (``saved_state.py``): activation tensors,
and each plain buffer of a quantized storage, go through ``save_for_backward``; so do the
parameters whose value backward reads, so an in-place change before backward raises
torch's own error. Outputs are never views of internal buffers (in-place ops on them work,
and bump the version counter of anything saved from them). Backward is once-differentiable:
a second backward through it raises rather than returning wrong gradients. The
``PlanFunction`` form, run eagerly, also announces each step's activations to a
registered receiver as soon as they are made (``save_notice.py``: the offload scheduler
may start their copies before the save).

Under ``torch.autocast`` the ops run with torch's autocast off and cast as their torch
counterparts would (``ops/_autocast.py``); each gradient goes back in its tensor's dtype.

Two forms of the same Function: ``PlanFunction`` (``forward(ctx, ...)``), which
``torch.compile`` traces (forward and backward build fresh op contexts and keep the packed
records on the autograd ctx, mutating nothing made outside them), and
``PlanFunctionForTransforms``, the ``setup_context`` form with a generated vmap rule, for
``torch.func``. Both share the bodies below.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch._C._functorch import is_legacy_batchedtensor
from torch.nn.utils.stateless import _reparametrize_module

from fuseops.kernels.autodiff_state import refuse_batched_cotangents
from fuseops.kernels.dispatch import references_forced
from fuseops.ops.contract import FIELDS_BY_ROLE, OpGrads, Saved, fresh_contexts, role_fields
from fuseops.ops.executor.save_notice import Receiver, current_receiver, noticing
from fuseops.ops.executor.saved_state import activation_tensors, functional, pack_saved, unpack_saved
from fuseops.ops.executor.second_backward import (
    input_links,
    linked_inputs,
    no_second_backward,
    refuse_batched_create_graph,
)


@dataclass(frozen=True)
class Arg:
    """An extra input passed to the autograd Function as its tensor input ``index``."""

    index: int


@dataclass
class RunState:
    """What one call hands its Function: its ``Prepared`` run (``prepared.py``; typed ``Any``
    here, which that module imports), the ops, its extra inputs and its parameters."""

    prep: Any
    ops: Sequence[torch.nn.Module]
    # The call's flat extra inputs, each tensor replaced by an ``Arg``.
    extra_template: tuple[Any, ...]
    params: list[torch.nn.Parameter]
    output_shape: tuple[int, ...] = ()
    output_dtype: torch.dtype = torch.float32
    output_device: torch.device = torch.device("cpu")
    # The setup_context form only: what forward hands setup_context.
    records: list[Saved | None] = field(default_factory=list)
    save_from: list[tuple[bool, int]] = field(default_factory=list)
    num_outputs: int = 0


# Reusable: entering it does nothing.
_NO_CONTEXT = contextlib.nullcontext()


def autocast_off(device_type: str) -> Any:
    """Torch's autocast switched off while the ops run: they cast explicitly (so forward,
    backward, kernels and references agree), and a backward called inside an autocast
    block must not re-cast."""
    if device_type not in ("cpu", "cuda") or not torch.is_autocast_enabled(device_type):
        return _NO_CONTEXT
    return torch.autocast(device_type, enabled=False)


def run_forward(plan, ops, ctxs, x, extra_inputs, notice: Receiver | None = None):
    """Run the plan's forward steps; ``notice``: handed each step's to-be-saved
    activations as soon as the step has run (``save_notice.py``)."""
    extra_outputs: list[tuple[torch.Tensor, ...]] = [()] * len(ops)
    for step in plan.forward_steps:
        if step.fusion is None:
            op = ops[step.start]
            x, outs = op.op_forward(ctxs[step.start], x, extra_inputs[step.start])
            extra_outputs[step.start] = tuple(outs)
        else:
            span = slice(step.start, step.stop)
            x, outs = step.fusion.fused_forward(ops[span], ctxs[span], x, extra_inputs[span])
            extra_outputs[span] = list(map(tuple, outs))
        if notice is not None:
            tensors = activation_tensors(ctxs[step.start:step.stop])
            if tensors:
                notice(tensors)
    return x, extra_outputs


def per_op_extras(prep: Any, flat: Sequence[Any]) -> Sequence[tuple[Any, ...]]:
    """Per op, its slice of the call's flat extra inputs (``()`` for ops that take none)."""
    if not prep.extra_takers:
        return prep.empty_per_op
    per_op = list(prep.empty_per_op)
    for i in prep.extra_takers:
        a, b = prep.extra_spans[i]
        per_op[i] = tuple(flat[a:b])
    return per_op


def _root(t: torch.Tensor) -> torch.Tensor:
    """The tensor whose memory ``t`` views (``t`` itself when it is no view)."""
    return t if t._base is None else t._base


def non_view_outputs(outputs: list[torch.Tensor], inputs: Sequence[Any]) -> list[torch.Tensor]:
    """Outputs autograd may let the caller modify in place.

    A view (``y.view(shape)`` of a buffer made in forward) or a second copy of one object
    is replaced by ``detach()``: a distinct tensor that is no view and shares the buffer's
    version counter, so an in-place change still trips the check of anything saved from it.
    An output aliasing an input stays a view: torch then refuses in-place ops on it, as the
    data really is the input's."""
    if len(outputs) == 1:
        # The common case, without the walk below: one output, an input or a view or new.
        (t,) = outputs
        # A loop, not ``any`` of a comprehension (a frame of its own before Python 3.12).
        for i in inputs:
            if t is i:
                return [t.view_as(t)]
        if t._base is None or all(t._base is not _root(i) for i in inputs if isinstance(i, torch.Tensor)):
            return [t] if t._base is None else [t.detach()]
    roots = [_root(t) for t in inputs if isinstance(t, torch.Tensor)]
    seen: list[torch.Tensor] = []
    out = []
    for t in outputs:
        is_input = any(t is i for i in inputs)
        repeated = any(t is s for s in seen)
        if is_input or any(_root(t) is r for r in roots):
            # An input returned as-is must be a view, and so must a second copy.
            if repeated or is_input:
                t = t.view_as(t)
        elif t._base is not None or repeated:
            t = t.detach()
        seen.append(t)
        out.append(t)
    return out


def _checked_param_slots(state: RunState, records: Sequence[Saved | None], compiling: bool) -> list[int]:
    """Positions among the Function's parameters of those whose value backward reads (a
    ``Role.PARAMETER`` field of an op's record, named after the op's parameter): saved too,
    for torch's version check. Each once (a tied parameter has one position: ``prepare``)."""
    picked: list[int] = []
    for slots, record in zip(state.prep.param_slots, records):
        if record is None or not slots:
            continue
        names = None if compiling else FIELDS_BY_ROLE.get(record.__class__)
        for name in (names or role_fields(record, compiling=compiling)).parameter:
            if getattr(record, name) is not None:
                slot = slots[name] if name in slots else slots.get("weight")
                if slot is not None and slot not in picked:
                    picked.append(slot)
    return picked


def _run_forward_noticing(prep, ops, ctxs, x, extra_inputs, receiver: Receiver):
    """``run_forward`` telling ``receiver`` of each step's saves, and letting fused steps
    notice sooner (``save_notice.notice_early``) while it runs."""
    previous = noticing(receiver)
    try:
        with autocast_off(prep.device_type):
            return run_forward(prep.plan, ops, ctxs, x, extra_inputs, receiver)
    finally:
        noticing(previous)


def forward_body(state: RunState, inputs: Sequence[Any], *, notice: bool = False
                 ) -> tuple[tuple, list[torch.Tensor], list[Saved | None]]:
    """Run the plan's forward on fresh op contexts: ``(outputs, tensors to save, packed
    records)``. ``notice``: the caller saves the tensors through ``save_for_backward``
    (``PlanFunction``), so a registered receiver hears of each step's as it is produced
    (``save_notice.py``), unless this forward is being traced. The tensors to save end with
    the parameters backward reads (for torch's version check)."""
    prep = state.prep
    compiling = torch.compiler.is_compiling()
    receiver = current_receiver() if notice and not compiling else None
    ctxs = [ctx.with_saved(None) for ctx in prep.ctxs] if compiling else fresh_contexts(prep.ctxs)
    x = inputs[0]
    if prep.extra_takers:
        flat = [inputs[e.index] if isinstance(e, Arg) else e for e in state.extra_template]
        extra_inputs = per_op_extras(prep, flat)
    else:
        extra_inputs = prep.empty_per_op
    if receiver is not None:
        y, extra_outputs = _run_forward_noticing(prep, state.ops, ctxs, x, extra_inputs, receiver)
    elif prep.autocast:
        with autocast_off(prep.device_type):
            y, extra_outputs = run_forward(prep.plan, state.ops, ctxs, x, extra_inputs)
    else:
        y, extra_outputs = run_forward(prep.plan, state.ops, ctxs, x, extra_inputs)
    tensors, records = pack_saved(ctxs, compiling=compiling)
    outputs = ([y] + [t for outs in extra_outputs for t in outs]) if prep.num_extra_outputs else [y]
    # The parameters as this Function received them (under torch.func, unwrapped).
    params = inputs[prep.num_inputs:]
    for slot in _checked_param_slots(state, records, compiling):
        tensors.append(params[slot])
    return tuple(non_view_outputs(outputs, inputs)), tensors, records


def _cast(t: torch.Tensor | None, dtype: torch.dtype | None) -> torch.Tensor | None:
    return t if t is None or dtype is None or t.dtype == dtype else t.to(dtype)


# What an op whose backward did not run gave (read only).
_NO_GRADS = OpGrads(None)


def run_backward(state: RunState, records, saved_tensors, dy, flat_extra_output_grads, compiling: bool) -> tuple:
    ops, prep = state.ops, state.prep
    plan = prep.plan
    unpacked = unpack_saved(records, saved_tensors, compiling=compiling)
    if compiling:
        ctxs = [ctx.with_saved(saved) for ctx, saved in zip(prep.ctxs, unpacked)]
    else:
        ctxs = fresh_contexts(prep.ctxs, unpacked)
    if prep.num_extra_outputs:
        extra_output_grads = [tuple(flat_extra_output_grads[a:b]) for a, b in prep.extra_output_spans]
    else:
        extra_output_grads = prep.empty_per_op
    if dy is None:
        dy = torch.zeros(state.output_shape, dtype=state.output_dtype, device=state.output_device)
    # Under autocast each gradient goes back in its tensor's dtype, as the gradient of
    # torch's cast does.
    autocast = prep.autocast

    grads: list[OpGrads] = [_NO_GRADS] * len(ops)
    for step in reversed(plan.backward_steps):
        # No gradient flows further: the ops before need no backward at all.
        if dy is None:
            break
        if step.fusion is None:
            step_grads = [ops[step.start].op_backward(ctxs[step.start], dy, extra_output_grads[step.start])]
        else:
            span = slice(step.start, step.stop)
            step_grads = step.fusion.fused_backward(ops[span], ctxs[span], dy, extra_output_grads[span])
        grads[step.start:step.stop] = step_grads
        dy = step_grads[0].dx
        if autocast:
            dy = _cast(dy, ctxs[step.start].input_dtype)

    # A parameter shared by several ops (tied weights) gets the sum of their grads.
    param_grads: list[torch.Tensor | None] = [None] * len(state.params)
    for slots, g in zip(prep.param_slots, grads):
        for name, grad in g.params.items():
            if grad is not None:
                i = slots[name]
                if autocast:
                    grad = _cast(grad, state.params[i].dtype)
                param_grads[i] = grad if param_grads[i] is None else param_grads[i] + grad
    # Gradients of the tensor inputs, each passed once (x may also be an extra input).
    input_grads: list[torch.Tensor | None] = [dy] + [None] * (prep.num_inputs - 1)
    for i in prep.extra_takers:
        for k, grad in zip(range(*prep.extra_spans[i]), grads[i].extra_inputs):
            arg = prep.extra_args[k]
            if arg is not None and grad is not None:
                prev = input_grads[arg.index]
                input_grads[arg.index] = grad if prev is None else prev + grad
    if autocast:
        input_grads = [_cast(g, dtype) for g, dtype in zip(input_grads, prep.input_dtypes)]
    return (None, *input_grads, *param_grads)


# The torch.func transforms that differentiate (their interpreters' keys, as text).
DIFFERENTIATING_TRANSFORMS = ("TransformType.Grad", "TransformType.Jvp")


def differentiating_levels(stack) -> int:
    """How many of torch.func's interpreter ``stack`` differentiate (grad, jvp)."""
    return sum(str(level.key()) in DIFFERENTIATING_TRANSFORMS for level in stack or ())


def backward_body(state: RunState, records, saved_tensors, dy, flat_extra_output_grads, input_refs: tuple = ()
                  ) -> tuple:
    """The gradients (``run_backward``'s); ``input_refs``: the forward's
    ``second_backward.input_links``, for ``create_graph=True``."""
    # Something will differentiate this backward again: under torch.func, a second grad /
    # jvp transform around the one running it; else create_graph=True (grad mode on).
    compiling = torch.compiler.is_compiling()
    stack = None if compiling else torch._C._functorch.get_interpreter_stack()
    if stack:
        if differentiating_levels(stack) > 1:
            # Calls made under two such transforms run as plain torch (``plain_autograd.py``):
            # here a Function made under one is differentiated under another.
            raise RuntimeError("fuseops: higher-order derivatives through torch.func of a call made under fewer "
                               "transforms are not supported; the ops' backward is not differentiable")
        create_graph = False
    else:
        create_graph = torch.is_grad_enabled()
    # (``batched_cotangents``, which is False while compiling, inline: this runs per call.)
    batched = False
    if not compiling:
        for g in (dy, *flat_extra_output_grads):
            if g is not None and is_legacy_batchedtensor(g):
                batched = True
                break
    if batched:
        # Batched by torch's older vmap (``is_grads_batched=True``): tensors without storage,
        # which no kernel reads; the references batch.
        if create_graph:
            refuse_batched_create_graph()
        with references_forced():
            return _backward_batched(state, records, saved_tensors, dy, flat_extra_output_grads)
    off = autocast_off(state.prep.device_type)
    if off is _NO_CONTEXT and not torch.is_grad_enabled():
        # The common case, without entering a null context.
        return run_backward(state, records, saved_tensors, dy, flat_extra_output_grads, compiling)
    with off:
        if not torch.is_grad_enabled():
            # The engine runs backward with grad mode off unless create_graph is set.
            return run_backward(state, records, saved_tensors, dy, flat_extra_output_grads, compiling)
        with torch.no_grad():
            grads = run_backward(state, records, saved_tensors, dy, flat_extra_output_grads, compiling)
    if not create_graph:
        return grads
    links = (dy, *flat_extra_output_grads, *saved_tensors, *state.params, *linked_inputs(input_refs))
    return no_second_backward(grads, links)


def _backward_batched(state: RunState, records, saved_tensors, dy, flat_extra_output_grads) -> tuple:
    """``run_backward`` of batched cotangents: nothing written over a saved
    activation (``functional``); raises where they cannot batch."""
    named = [f"{i} ({type(op).__name__})" for i, op in enumerate(state.ops)]
    refuse_batched_cotangents(any(ctx.recipe is not None for ctx in state.prep.ctxs),
                              [n for n, op in zip(named, state.ops) if op.communicates],
                              [n for n, op in zip(named, state.ops) if getattr(op, "accumulate_into_main_grad", False)
                               and op.weight.requires_grad])
    with autocast_off(state.prep.device_type), torch.no_grad(), functional():
        return run_backward(state, records, saved_tensors, dy, flat_extra_output_grads, False)


class PlanFunction(torch.autograd.Function):
    @staticmethod
    def forward(autograd_ctx, state: RunState, *inputs: Any):
        autograd_ctx.set_materialize_grads(False)
        outputs, tensors, records = forward_body(state, inputs, notice=True)
        autograd_ctx.save_for_backward(*tensors)
        # The parameters (after the inputs) are linked as they are (``backward_body``).
        autograd_ctx.input_links = input_links(inputs[:state.prep.num_inputs])
        autograd_ctx.state = state
        autograd_ctx.records = records
        return outputs

    @staticmethod
    def backward(autograd_ctx, dy: torch.Tensor | None, *flat_extra_output_grads):
        # Reading saved_tensors runs torch's version check of every saved tensor and parameter.
        return backward_body(autograd_ctx.state, autograd_ctx.records, autograd_ctx.saved_tensors, dy,
                             flat_extra_output_grads, autograd_ctx.input_links)


# The autograd Function's own entry point, which ``Function.apply``'s Python wrapper calls: that
# wrapper's per-call work (a setup_context probe, a generator over the arguments) costs ~2 us a
# call. Only outside torch.compile's tracing (dynamo traces
# ``PlanFunction.apply``) and torch.func's transforms (the other form); dead functorch wrappers
# are unwrapped as the wrapper would. Absent on a torch without them: the wrapper runs.
_PLAN_ENTRY = super(torch.autograd.Function, PlanFunction).apply
_unwrap_if_dead = getattr(torch._C._functorch, "unwrap_if_dead", None)


def apply_eagerly(state: RunState, *inputs: torch.Tensor) -> Any:
    """``PlanFunction.apply(state, *inputs)`` for a call outside torch.compile and torch.func."""
    if _unwrap_if_dead is None:
        return PlanFunction.apply(state, *inputs)
    return _PLAN_ENTRY(state, *map(_unwrap_if_dead, inputs))


class PlanFunctionForTransforms(torch.autograd.Function):
    """The ``setup_context`` form: torch.func lets a Function save only its inputs and its
    outputs, so forward also returns the activations it saves, after the real outputs."""

    # forward and backward are torch ops (or Triton kernels launched on CUDA); on CPU
    # torch.func transforms them through the torch references.
    generate_vmap_rule = True

    @staticmethod
    def forward(state: RunState, *inputs: Any):
        # The ops read their parameters as module attributes: at this level those must be
        # the Function's own (unwrapped) parameter inputs, not the transform's wrappers.
        params = inputs[state.prep.num_inputs:]
        with contextlib.ExitStack() as stack:
            for op, slots in zip(state.ops, state.prep.param_slots):
                if slots:
                    stack.enter_context(_reparametrize_module(op, {n: params[i] for n, i in slots.items()}))
            outputs, tensors, state.records = forward_body(state, inputs)
        # Where each saved tensor comes from in setup_context: an input, or an extra output.
        extra: list[torch.Tensor] = []
        state.save_from = []
        for t in tensors:
            k = next((i for i, s in enumerate(inputs) if s is t), None)
            if k is not None:
                state.save_from.append((True, k))
                continue
            # Autograd needs distinct output objects.
            if any(t is o for o in (*outputs, *extra)):
                t = t.view_as(t)
            state.save_from.append((False, len(outputs) + len(extra)))
            extra.append(t)
        state.num_outputs = len(outputs)
        return (*outputs, *extra)

    @staticmethod
    def setup_context(autograd_ctx, inputs, output) -> None:
        state: RunState = inputs[0]
        autograd_ctx.set_materialize_grads(False)
        autograd_ctx.save_for_backward(*[inputs[1 + k] if from_input else output[k]
                                         for from_input, k in state.save_from])
        autograd_ctx.mark_non_differentiable(*output[state.num_outputs:])
        autograd_ctx.state = state
        autograd_ctx.records = state.records

    @staticmethod
    def backward(autograd_ctx, dy: torch.Tensor | None, *output_grads):
        state: RunState = autograd_ctx.state
        flat_extra_output_grads = output_grads[: state.num_outputs - 1]
        saved_tensors = autograd_ctx.saved_tensors
        if _unwrap_if_dead is not None:
            # ``torch.func.vjp``'s vjp_fn runs this backward after the transform's level has
            # ended: the cotangents and saved tensors are then dead wrappers, with no storage a
            # Triton kernel could read (torch's own ops unwrap them as they dispatch).
            dy, saved_tensors, flat_extra_output_grads = (
                _unwrap_dead(dy), tuple(map(_unwrap_dead, saved_tensors)),
                tuple(map(_unwrap_dead, flat_extra_output_grads)))
        return backward_body(state, autograd_ctx.records, saved_tensors, dy, flat_extra_output_grads)


def _unwrap_dead(t: torch.Tensor | None) -> torch.Tensor | None:
    return t if t is None else _unwrap_if_dead(t)
