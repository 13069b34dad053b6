"""Running a plan of ops inside one ``torch.autograd.Function``.

A plan is two lists of steps over the op list, one for forward and one for backward;
each step covers a contiguous run of ops and is either one basic op or a fused op that
borrows them. Forward and backward are partitioned independently, so a run of ops can
be fused in one direction and not the other.

Saved state crosses the autograd boundary by role (``saved_state.py``): activation
tensors, and each plain buffer of a quantized storage, go through ``ctx.save_for_backward``.
This module knows fused ops only through the ``ForwardFusion``/``BackwardFusion``
protocols; the fuser builds plans from its registry.

Behaving as ``torch.nn`` does: under ``torch.autocast`` the plan runs with torch's autocast
off and each op casts as its torch counterpart would (``ops/_autocast.py``); each gradient
goes back in its tensor's dtype. Parameters whose value backward reads are saved through
``save_for_backward`` too, so an in-place change before backward raises torch's own error.
Outputs are never views of internal buffers (in-place ops on them work, and bump the
version counter of anything saved from them). Backward is once-differentiable: a second
backward through it raises torch's error rather than returning wrong gradients. The
Function has the ``setup_context`` form with a generated vmap rule, for ``torch.func``.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from fuseops.ops._autocast import autocast_dtype
from fuseops.ops.contract import OpContext, OpGrads, Role, Saved, TensorSpec
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

    def segment(self, start: int, stop: int) -> Plan:
        """The steps of ops ``[start, stop)``, renumbered from 0 (no step may cross)."""
        def cut(steps: tuple[Step, ...]) -> tuple[Step, ...]:
            inside = [s for s in steps if start <= s.start and s.stop <= stop]
            return tuple(dataclasses.replace(s, start=s.start - start, stop=s.stop - start) for s in inside)

        return Plan(self.op_names[start:stop], cut(self.forward_steps), cut(self.backward_steps))

    @classmethod
    def unfused(cls, ops: Sequence[Op]) -> Plan:
        steps = tuple(Step(i, i + 1) for i in range(len(ops)))
        return cls(tuple(type(op).__name__ for op in ops), steps, steps)


def current_autocast(x: Any) -> torch.dtype | None:
    """The ``torch.autocast`` dtype for ``x``'s device now (None outside autocast)."""
    return autocast_dtype(x.device) if isinstance(x, torch.Tensor) else None


def check_chain(ops: Sequence[Op], x: Any, extra_inputs: Sequence[tuple[Any, ...]]) -> list[TensorSpec]:
    """Validate the whole chain on the host before anything runs (under the autocast
    state of ``x``'s device); returns each op's input spec."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"input: expected a torch.Tensor, got {type(x).__name__}")
    # float64 runs the torch references everywhere: the dtype of oracles.
    if x.dtype not in (torch.float32, torch.float16, torch.bfloat16, torch.float64):
        raise TypeError(
            f"input: dtype {x.dtype} is not supported; expected float32, float16 or bfloat16"
        )
    spec = TensorSpec.of(x, current_autocast(x))
    specs = []
    for op, extras in zip(ops, extra_inputs):
        specs.append(spec)
        spec = op.check(spec, extras)
    return specs


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
    input_specs: Sequence[TensorSpec] | None = None,
) -> list[OpContext]:
    """Per-op contexts: which gradients each op's backward must produce; with
    ``input_specs`` (from ``check_chain``), the dtype each op's input gradient goes back in."""
    data_requires_grad = grad_enabled and x.requires_grad
    autocast = current_autocast(x)
    ctxs = []
    for i, (op, extras) in enumerate(zip(ops, extra_inputs)):
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
                autocast=autocast,
                input_dtype=input_specs[i].dtype if input_specs is not None else None,
            )
        )
        data_requires_grad = data_requires_grad or weight_rg or any(extra_rg)
    return ctxs


def _autocast_off(device_type: str) -> Any:
    """Torch's autocast switched off while the ops run: they cast explicitly (so forward,
    backward, kernels and references agree), and a backward called inside an autocast
    block must not re-cast."""
    if device_type not in ("cpu", "cuda"):
        return contextlib.nullcontext()
    return torch.autocast(device_type, enabled=False)


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


def _storage(t: torch.Tensor) -> int | None:
    """Where ``t``'s data lives; None when empty or when it has no storage of its own
    (a torch.func batched or wrapped tensor)."""
    try:
        return t.untyped_storage().data_ptr() if t.numel() else None
    except (NotImplementedError, RuntimeError):
        return None


def _non_view_outputs(outputs: list[torch.Tensor], inputs: Sequence[Any]) -> list[torch.Tensor]:
    """Outputs autograd may let the caller modify in place.

    A view (``y.view(shape)`` of a buffer made in forward) or a second copy of one object
    is replaced by ``detach()``: a distinct tensor that is no view and shares the buffer's
    version counter, so an in-place change still trips the check of anything saved from it.
    An output aliasing an input stays a view: torch then refuses in-place ops on it, as the
    data really is the input's."""
    tensors = [t for t in inputs if isinstance(t, torch.Tensor)]
    input_ids = {id(t) for t in tensors}
    input_storages = {_storage(t) for t in tensors} - {None}
    seen: set[int] = set()
    out = []
    for t in outputs:
        aliases_input = id(t) in input_ids or _storage(t) in input_storages
        if aliases_input:
            # An input returned as-is must be a view (setup_context form), and so must a copy.
            if id(t) in seen or id(t) in input_ids:
                t = t.view_as(t)
        elif t._is_view() or id(t) in seen:
            t = t.detach()
        seen.add(id(t))
        out.append(t)
    return out


def _checked_params(state: _RunState, records: Sequence[Saved | None]) -> list[torch.Tensor]:
    """The parameters whose value backward reads (a ``Role.PARAMETER`` field of an op's
    record, named after the op's parameter): saved too, for torch's version check."""
    out: list[torch.Tensor] = []
    for slots, record in zip(state.param_slots, records):
        if record is None:
            continue
        for name, value, role in record.fields_by_role():
            if role is Role.PARAMETER and value is not None:
                slot = slots.get(name, slots.get("weight"))
                if slot is not None and all(p is not state.params[slot] for p in out):
                    out.append(state.params[slot])
    return out


class _PlanFunction(torch.autograd.Function):
    # forward and backward are torch ops (or Triton kernels launched on CUDA); on CPU
    # torch.func transforms them through the torch references.
    generate_vmap_rule = True

    @staticmethod
    def forward(state: _RunState, x: torch.Tensor, *flat_inputs: Any):
        with _autocast_off(x.device.type):
            y, extra_outputs = _run_forward(state.plan, state.ops, state.ctxs, x, state.extra_inputs)
        state.to_save, state.records = pack_saved(state.ctxs)
        state.to_save += _checked_params(state, state.records)
        outputs = [y] + [t for outs in extra_outputs for t in outs]
        return tuple(_non_view_outputs(outputs, (x, *flat_inputs)))

    @staticmethod
    def setup_context(autograd_ctx, inputs, output) -> None:
        state: _RunState = inputs[0]
        autograd_ctx.set_materialize_grads(False)
        autograd_ctx.save_for_backward(*state.to_save)
        # Drop the state's references so only the saved ones hold the activations (an
        # offload hook then frees them); torch.func calls setup_context once per level.
        if not torch._C._are_functorch_transforms_active():
            state.to_save = []
        autograd_ctx.state = state

    @staticmethod
    def backward(autograd_ctx, dy: torch.Tensor | None, *flat_extra_output_grads):
        state: _RunState = autograd_ctx.state
        # Unpacking runs torch's version check of every saved tensor and parameter.
        saved_tensors = autograd_ctx.saved_tensors
        # Grad mode is on in backward only with create_graph=True (double backward).
        create_graph = torch.is_grad_enabled()
        with torch.no_grad(), _autocast_off(state.output_device.type):
            grads = _run_backward(state, saved_tensors, dy, flat_extra_output_grads)
        return _no_second_backward(grads) if create_graph else grads


def _no_second_backward(grads: tuple) -> tuple:
    """The gradients, each behind a node that raises if differentiated again: the ops'
    backward is not differentiable, and a second backward must fail, never be wrong."""
    present = [g for g in grads if isinstance(g, torch.Tensor)]
    if not present:
        return grads
    err = torch._C._functions.DelayedError(
        "fuseops: double backward (create_graph=True, then a backward through these "
        "gradients) is not supported; the ops' backward is not differentiable",
        len(present),
    )
    wrapped = iter(err(*[g.detach().requires_grad_() for g in present]))
    return tuple(next(wrapped) if isinstance(g, torch.Tensor) else g for g in grads)


def _cast(t: torch.Tensor | None, dtype: torch.dtype | None) -> torch.Tensor | None:
    return t if t is None or dtype is None or t.dtype == dtype else t.to(dtype)


def _run_backward(state: _RunState, saved_tensors, dy, flat_extra_output_grads) -> tuple:
    ops, ctxs, plan = state.ops, state.ctxs, state.plan
    for ctx, saved in zip(ctxs, unpack_saved(state.records, saved_tensors)):
        ctx.saved = saved
    extra_output_grads, i = [], 0
    for op in ops:
        extra_output_grads.append(tuple(flat_extra_output_grads[i : i + op.num_extra_outputs]))
        i += op.num_extra_outputs
    if dy is None:
        dy = torch.zeros(state.output_shape, dtype=state.output_dtype, device=state.output_device)
    # Under autocast each gradient goes back in its tensor's dtype, as the gradient of
    # torch's cast does.
    autocast = any(ctx.autocast is not None for ctx in ctxs)

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
        if autocast:
            dy = _cast(dy, ctxs[step.start].input_dtype)
    for ctx in ctxs:
        ctx.saved = None

    # A parameter shared by several ops (tied weights) gets the sum of their grads.
    param_grads: list[torch.Tensor | None] = [None] * len(state.params)
    for slots, g in zip(state.param_slots, grads):
        for name, grad in g.params.items():
            if grad is not None:
                i = slots[name]
                if autocast:
                    grad = _cast(grad, state.params[i].dtype)
                param_grads[i] = grad if param_grads[i] is None else param_grads[i] + grad
    extra_grads = [eg for g, op in zip(grads, ops) for eg in _pad(g.extra_inputs, op.num_extra_inputs)]
    if autocast:
        extra_inputs = [e for extras in state.extra_inputs for e in extras]
        extra_grads = [
            _cast(g, e.dtype) if isinstance(e, torch.Tensor) and e.is_floating_point() else g
            for g, e in zip(extra_grads, extra_inputs)
        ]
    return (None, dy, *extra_grads, *param_grads)


def _pad(grads: tuple, n: int) -> tuple:
    return tuple(grads) + (None,) * (n - len(grads))


@dataclass
class _RunState:
    plan: Plan
    ops: Sequence[Op]
    ctxs: list[OpContext]
    extra_inputs: list[tuple[Any, ...]]
    params: list[torch.nn.Parameter]
    # Per op: parameter name -> position in ``params``, fixed when forward ran.
    param_slots: list[dict[str, int]]
    output_shape: tuple[int, ...] = ()
    output_dtype: torch.dtype = torch.float32
    output_device: torch.device = torch.device("cpu")
    records: list[Saved | None] = dataclasses.field(default_factory=list)
    # What forward hands setup_context for save_for_backward (emptied there).
    to_save: list[torch.Tensor] = dataclasses.field(default_factory=list)


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
        with _autocast_off(x.device.type):
            y, extra_outputs = _run_forward(plan, ops, ctxs, x, extra_inputs)
        flat = [t for outs in extra_outputs for t in outs]
        return (y, *flat) if n_extra_out else y

    params, slots = unique_parameters(ops)
    state = _RunState(plan, ops, ctxs, extra_inputs, params, slots)
    flat_extra = [e for extras in extra_inputs for e in extras]
    outputs = _PlanFunction.apply(state, x, *flat_extra, *params)
    y = outputs[0]
    state.output_shape, state.output_dtype, state.output_device = tuple(y.shape), y.dtype, y.device
    return outputs if n_extra_out else y


def run_ops(ops: Sequence[Op], x: torch.Tensor, extra_inputs: Sequence[Any]) -> Any:
    """Validate and run ``ops`` unfused under the autocast recipe in effect (a lone op called
    directly comes here)."""
    per_op = split_extra_inputs(ops, extra_inputs)
    specs = check_chain(ops, x, per_op)
    ctxs = make_contexts(
        ops, x, per_op, recipe=current_recipe(), grad_enabled=torch.is_grad_enabled(), input_specs=specs
    )
    return execute(Plan.unfused(ops), ops, ctxs, x, per_op)
