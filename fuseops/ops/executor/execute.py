"""Running a plan of ops inside one ``torch.autograd.Function`` (``function.py``).

A plan is two lists of steps over the op list, one for forward and one for backward;
each step covers a contiguous run of ops and is either one basic op or a fused op that
borrows them. Forward and backward are partitioned independently, so a run of ops can
be fused in one direction and not the other. This module knows fused ops only through the
``ForwardFusion``/``BackwardFusion`` protocols; the fuser builds plans from its registry.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from fuseops.ops import _checks
from fuseops.ops._autocast import autocast_dtype
from fuseops.ops.contract import OpContext, OpGrads, TensorSpec
from fuseops.ops.executor import plain_autograd
from fuseops.ops.executor.prepared import flat_parameters, prepare, run_prepared
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
        # (All of them: a parametrized op's tensor is computed from its parametrization's.)
        weight_rg = grad_enabled and any(p.requires_grad for p in op.parameters())
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


def execute(
    plan: Plan,
    ops: Sequence[Op],
    ctxs: list[OpContext],
    x: torch.Tensor,
    extra_inputs: list[tuple[Any, ...]],
) -> Any:
    """Run ``plan`` (prepared for this call alone); returns ``y`` or ``(y, *extra_outputs)``."""
    flat = [e for extras in extra_inputs for e in extras]
    params = flat_parameters(ops)
    prep = prepare(plan, ops, ctxs, x, flat, params)
    if prep.needs_backward and plain_autograd.parametrized(ops):
        return plain_autograd.run(prep, ops, x, flat, plain_autograd.PARAMETRIZED)
    return run_prepared(prep, ops, x, flat, params)


def stand_in(ops: Sequence[Op], x: Any) -> Any:
    """What a traced call that failed its checks returns in place of its result
    (``_checks.refused_while_tracing``): ``x`` (or an empty tensor), once per output."""
    y = x if isinstance(x, torch.Tensor) else torch.empty(0)
    n_extra = sum(op.num_extra_outputs for op in ops)
    return (y, *[y] * n_extra) if n_extra else y


def run_ops(ops: Sequence[Op], x: torch.Tensor, extra_inputs: Sequence[Any]) -> Any:
    """Validate and run ``ops`` unfused under the autocast recipe in effect (a lone op called
    directly comes here)."""
    try:
        per_op = split_extra_inputs(ops, extra_inputs)
        specs = check_chain(ops, x, per_op)
    except (ValueError, TypeError) as error:
        # Eagerly raised at once; while tracing, by the compiled graph (``Sequential.forward``).
        return _checks.refused_while_tracing(error, stand_in(ops, x))
    ctxs = make_contexts(
        ops, x, per_op, recipe=current_recipe(), grad_enabled=torch.is_grad_enabled(), input_specs=specs
    )
    return execute(Plan.unfused(ops), ops, ctxs, x, per_op)
