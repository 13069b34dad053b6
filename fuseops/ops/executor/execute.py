"""Running a plan of ops inside one ``torch.autograd.Function``.

A plan is two lists of steps over the op list, one for forward and one for backward;
each step covers a contiguous run of ops and is either one basic op or a fused op that
borrows them. Forward and backward are partitioned independently, so a run of ops can
be fused in one direction and not the other.

Saved state crosses the autograd boundary by role (``saved_state.py``): activation
tensors, and each plain buffer of a quantized storage, go through ``ctx.save_for_backward``.
This module knows fused ops only through the ``ForwardFusion``/``BackwardFusion``
protocols; the fuser builds plans from its registry.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from fuseops.ops.contract import OpContext, OpGrads, Saved, TensorSpec
from fuseops.ops.executor.saved_state import pack_saved, unpack_saved
from fuseops.quant.autocast import current_recipe

# A basic op (``fuseops.ops.op.BasicOp``); named by its base class here, which imports this
# module to run a lone op.
Op = torch.nn.Module


class ForwardFusion(Protocol):
    name: str

    def fused_forward(
        self,
        ops: Sequence[Op],
        ctxs: Sequence[OpContext],
        x: torch.Tensor,
        extra_inputs: Sequence[tuple[Any, ...]],
    ) -> tuple[torch.Tensor, list[tuple[torch.Tensor, ...]]]: ...


class BackwardFusion(Protocol):
    name: str

    def fused_backward(
        self,
        ops: Sequence[Op],
        ctxs: Sequence[OpContext],
        dy: torch.Tensor,
        extra_output_grads: Sequence[tuple[torch.Tensor | None, ...]],
    ) -> list[OpGrads]: ...


@dataclass(frozen=True)
class Step:
    """One entry of a plan: ops ``[start, stop)``, run basic (``fusion is None``) or fused."""

    start: int
    stop: int
    fusion: Any = None

    @property
    def name(self) -> str:
        return self.fusion.name if self.fusion is not None else ""

    @property
    def indices(self) -> tuple[int, ...]:
        return tuple(range(self.start, self.stop))


@dataclass(frozen=True)
class Plan:
    """What runs, as data. ``forward``/``backward`` list ``(name, indices)`` per step."""

    op_names: tuple[str, ...]
    forward_steps: tuple[Step, ...]
    backward_steps: tuple[Step, ...]
    # Why fusions that matched did not apply: (fusion name, indices, reason).
    declined: tuple[tuple[str, tuple[int, ...], str], ...] = ()

    def _entries(self, steps: tuple[Step, ...]) -> list[tuple[str, tuple[int, ...]]]:
        return [(s.name or self.op_names[s.start], s.indices) for s in steps]

    @property
    def forward(self) -> list[tuple[str, tuple[int, ...]]]:
        return self._entries(self.forward_steps)

    @property
    def backward(self) -> list[tuple[str, tuple[int, ...]]]:
        return self._entries(self.backward_steps)

    @classmethod
    def unfused(cls, ops: Sequence[Op]) -> Plan:
        steps = tuple(Step(i, i + 1) for i in range(len(ops)))
        return cls(tuple(type(op).__name__ for op in ops), steps, steps)


def check_chain(ops: Sequence[Op], x: Any, extra_inputs: Sequence[tuple[Any, ...]]) -> None:
    """Validate the whole chain on the host before anything runs."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"input: expected a torch.Tensor, got {type(x).__name__}")
    # float64 runs the torch references everywhere: the dtype of oracles.
    if x.dtype not in (torch.float32, torch.float16, torch.bfloat16, torch.float64):
        raise TypeError(
            f"input: dtype {x.dtype} is not supported; expected float32, float16 or bfloat16"
        )
    spec = TensorSpec.of(x)
    for op, extras in zip(ops, extra_inputs):
        spec = op.check(spec, extras)


def split_extra_inputs(ops: Sequence[Op], extra_inputs: Sequence[Any]) -> list[tuple[Any, ...]]:
    """Hand the extra inputs out to the ops that take them, in op order."""
    wanted = sum(op.num_extra_inputs for op in ops)
    if len(extra_inputs) != wanted:
        takers = [f"{type(op).__name__} ({op.num_extra_inputs})" for op in ops if op.num_extra_inputs]
        raise TypeError(
            f"extra_inputs: expected {wanted} extra input(s) for "
            f"{', '.join(takers) or 'no op'}, got {len(extra_inputs)}"
        )
    out, i = [], 0
    for op in ops:
        out.append(tuple(extra_inputs[i : i + op.num_extra_inputs]))
        i += op.num_extra_inputs
    return out


def make_contexts(
    ops: Sequence[Op],
    x: torch.Tensor,
    extra_inputs: Sequence[tuple[Any, ...]],
    *,
    recipe: Any,
    grad_enabled: bool,
) -> list[OpContext]:
    """Per-op contexts: which gradients each op's backward must produce."""
    data_requires_grad = grad_enabled and x.requires_grad
    ctxs = []
    for op, extras in zip(ops, extra_inputs):
        weight_rg = grad_enabled and any(p.requires_grad for p in op.parameters(recurse=False))
        extra_rg = tuple(
            grad_enabled and isinstance(e, torch.Tensor) and e.requires_grad for e in extras
        )
        ctxs.append(
            OpContext(
                recipe=recipe,
                training=op.training,
                input_requires_grad=data_requires_grad,
                weight_requires_grad=weight_rg,
                extra_requires_grad=extra_rg,
            )
        )
        data_requires_grad = data_requires_grad or weight_rg or any(extra_rg)
    return ctxs


def _run_forward(plan, ops, ctxs, x, extra_inputs):
    extra_outputs: list[tuple[torch.Tensor, ...]] = [()] * len(ops)
    for step in plan.forward_steps:
        if step.fusion is None:
            op = ops[step.start]
            x, outs = op.op_forward(ctxs[step.start], x, extra_inputs[step.start])
            extra_outputs[step.start] = tuple(outs)
        else:
            span = slice(step.start, step.stop)
            x, outs = step.fusion.fused_forward(ops[span], ctxs[span], x, extra_inputs[span])
            extra_outputs[span] = [tuple(o) for o in outs]
    return x, extra_outputs


class _PlanFunction(torch.autograd.Function):
    @staticmethod
    def forward(autograd_ctx, state: _RunState, *inputs: Any):
        autograd_ctx.set_materialize_grads(False)
        # Under torch.compile the forward may not mutate objects made outside it: the ops fill
        # fresh contexts, and the packed records ride on the autograd ctx.
        ctxs = [ctx.with_saved(None) for ctx in state.ctxs]
        x = inputs[0]
        extra_inputs = [tuple(inputs[e.index] if isinstance(e, _Arg) else e for e in extras) for extras in state.extra_template]
        y, extra_outputs = _run_forward(state.plan, state.ops, ctxs, x, extra_inputs)
        tensors, records = pack_saved(ctxs)
        autograd_ctx.save_for_backward(*tensors)
        autograd_ctx.state = state
        autograd_ctx.records = records
        outputs = [y] + [t for outs in extra_outputs for t in outs]
        # Autograd needs distinct output objects to route each output's gradient.
        seen: set[int] = set()
        for i, t in enumerate(outputs):
            if id(t) in seen:
                outputs[i] = t.view_as(t)
            seen.add(id(outputs[i]))
        return tuple(outputs)

    @staticmethod
    def backward(autograd_ctx, dy: torch.Tensor | None, *flat_extra_output_grads):
        state: _RunState = autograd_ctx.state
        ops, plan = state.ops, state.plan
        # Fresh contexts rather than writing ``saved`` into the forward's: under torch.compile
        # the backward may not mutate objects made outside it.
        ctxs = [
            ctx.with_saved(saved)
            for ctx, saved in zip(state.ctxs, unpack_saved(autograd_ctx.records, autograd_ctx.saved_tensors))
        ]
        extra_output_grads, i = [], 0
        for op in ops:
            extra_output_grads.append(tuple(flat_extra_output_grads[i : i + op.num_extra_outputs]))
            i += op.num_extra_outputs
        if dy is None:
            dy = torch.zeros(state.output_shape, dtype=state.output_dtype, device=state.output_device)

        grads: list[OpGrads] = [OpGrads(None)] * len(ops)
        for step in reversed(plan.backward_steps):
            # No gradient flows further: the ops before need no backward at all.
            if dy is None:
                break
            span = slice(step.start, step.stop)
            if step.fusion is None:
                step_grads = [ops[step.start].op_backward(ctxs[step.start], dy, extra_output_grads[step.start])]
            else:
                step_grads = step.fusion.fused_backward(ops[span], ctxs[span], dy, extra_output_grads[span])
            grads[span] = step_grads
            dy = step_grads[0].dx

        # A parameter shared by several ops (tied weights) gets the sum of their grads.
        param_grads: list[torch.Tensor | None] = [None] * len(state.params)
        for slots, g in zip(state.param_slots, grads):
            for name, grad in g.params.items():
                if grad is not None:
                    i = slots[name]
                    param_grads[i] = grad if param_grads[i] is None else param_grads[i] + grad
        # Gradients of the tensor inputs, each passed once (x may also be an extra input).
        input_grads: list[torch.Tensor | None] = [dy] + [None] * state.num_inputs
        extra_grads = [eg for g, op in zip(grads, ops) for eg in _pad(g.extra_inputs, op.num_extra_inputs)]
        flat_template = [e for extras in state.extra_template for e in extras]
        for e, grad in zip(flat_template, extra_grads):
            if isinstance(e, _Arg) and grad is not None:
                prev = input_grads[e.index]
                input_grads[e.index] = grad if prev is None else prev + grad
        return (None, *input_grads[: state.num_inputs], *param_grads)


def _pad(grads: tuple, n: int) -> tuple:
    return tuple(grads) + (None,) * (n - len(grads))


@dataclass(frozen=True)
class _Arg:
    """An extra input passed to the autograd Function as its input ``index``."""

    index: int


@dataclass
class _RunState:
    plan: Plan
    ops: Sequence[Op]
    ctxs: list[OpContext]
    # Per op, its extra inputs with each tensor replaced by an ``_Arg``.
    extra_template: list[tuple[Any, ...]]
    # Tensor inputs of the Function (x first), each once.
    num_inputs: int
    params: list[torch.nn.Parameter]
    # Per op: parameter name -> position in ``params``, fixed when forward ran.
    param_slots: list[dict[str, int]]
    output_shape: tuple[int, ...] = ()
    output_dtype: torch.dtype = torch.float32
    output_device: torch.device = torch.device("cpu")


def unique_parameters(ops: Sequence[Op]) -> tuple[list[torch.nn.Parameter], list[dict[str, int]]]:
    """Each parameter once (tied ones too), and per op where its parameters sit."""
    params: list[torch.nn.Parameter] = []
    position: dict[int, int] = {}
    slots = []
    for op in ops:
        op_slots = {}
        for name, p in op.named_parameters(recurse=False):
            if id(p) not in position:
                position[id(p)] = len(params)
                params.append(p)
            op_slots[name] = position[id(p)]
        slots.append(op_slots)
    return params, slots


def execute(
    plan: Plan,
    ops: Sequence[Op],
    ctxs: list[OpContext],
    x: torch.Tensor,
    extra_inputs: list[tuple[Any, ...]],
) -> Any:
    """Run ``plan``; returns ``y`` or ``(y, *extra_outputs)``."""
    n_extra_out = sum(op.num_extra_outputs for op in ops)
    if not any(ctx.needs_backward for ctx in ctxs):
        y, extra_outputs = _run_forward(plan, ops, ctxs, x, extra_inputs)
        flat = [t for outs in extra_outputs for t in outs]
        return (y, *flat) if n_extra_out else y

    params, slots = unique_parameters(ops)
    # Each tensor passed once: dynamo cannot trace a Function given one tensor twice.
    # Compared with ``is``, not by ``id()``: dynamo would guard on each tensor's identity.
    inputs: list[torch.Tensor] = [x]
    template = []
    for extras in extra_inputs:
        op_template = []
        for e in extras:
            if isinstance(e, torch.Tensor):
                index = next((i for i, t in enumerate(inputs) if t is e), len(inputs))
                if index == len(inputs):
                    inputs.append(e)
                e = _Arg(index)
            op_template.append(e)
        template.append(tuple(op_template))
    state = _RunState(plan, ops, ctxs, template, len(inputs), params, slots)
    outputs = _PlanFunction.apply(state, *inputs, *params)
    y = outputs[0]
    state.output_shape, state.output_dtype, state.output_device = tuple(y.shape), y.dtype, y.device
    return outputs if n_extra_out else y


def run_ops(ops: Sequence[Op], x: torch.Tensor, extra_inputs: Sequence[Any]) -> Any:
    """Validate and run ``ops`` unfused under the autocast recipe in effect (a lone op called
    directly comes here)."""
    per_op = split_extra_inputs(ops, extra_inputs)
    check_chain(ops, x, per_op)
    ctxs = make_contexts(ops, x, per_op, recipe=current_recipe(), grad_enabled=torch.is_grad_enabled())
    return execute(Plan.unfused(ops), ops, ctxs, x, per_op)
