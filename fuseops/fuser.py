"""The fuser: turns a flat op list into a plan by matching the registered fusions.

Patterns are matched left to right over the op list, longest first, separately for the
forward and the backward stage; a fusion whose guard refuses leaves its ops to run
basic, and the reason is kept in ``Plan.declined``. Plans are cached per op list and
per (recipe, dtypes, device, which inputs need grad).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import torch

from fuseops.fusions import REGISTRY
from fuseops.fusions.fusion import Fusion, PlanConfig, Stage, measured_declines_are_ignored, same_extra_input
from fuseops.kernels._triton import runs_triton
from fuseops.ops.executor.execute import Plan, Step, current_autocast
from fuseops.ops.op import BasicOp

logger = logging.getLogger("fuseops")
_warned: set[tuple[str, str]] = set()


def warn_once(key: tuple[str, str], message: str) -> None:
    """A fallback, logged once per ``key`` at WARNING."""
    if key not in _warned:
        _warned.add(key)
        logger.warning(message)


def plan_config(x: torch.Tensor, recipe: Any, grad_enabled: bool) -> PlanConfig:
    return PlanConfig(
        recipe=recipe,
        dtype=x.dtype,
        device_type=x.device.type,
        input_requires_grad=grad_enabled and x.requires_grad,
        grad_enabled=grad_enabled,
        triton=runs_triton(x),
        autocast=current_autocast(x),
        ignore_measured=measured_declines_are_ignored(),
    )


def config_signature(x: torch.Tensor, recipe: Any, grad_enabled: bool) -> tuple:
    """What ``plan_config`` reads of the call, as a tuple (``call_cache.py`` keys on it per
    call, so it is built without the dataclass)."""
    return (recipe, grad_enabled, runs_triton(x), current_autocast(x), measured_declines_are_ignored())


def _match_at(
    ops: Sequence[BasicOp], i: int, cfg: PlanConfig, extra_inputs: Sequence[tuple[Any, ...]],
    candidates: Sequence[Fusion], declined: list, hooked: frozenset[int] = frozenset(),
) -> Step | None:
    for fusion in candidates:
        stop = i + len(fusion.pattern)
        if not fusion.matches(ops[i:stop]):
            continue
        reason = fusion.guard(ops[i:stop], cfg, extra_inputs[i:stop])
        with_hooks = [j for j in range(i, stop) if j in hooked]
        if reason is None and with_hooks:
            # A hooked op is a boundary: it runs as a module so its hooks see its own tensors.
            j = with_hooks[0]
            reason = f"op {j} ({type(ops[j]).__name__}) has module hooks: it runs alone so they fire"
            warn_once((fusion.name, type(ops[j]).__name__), f"fuseops: {fusion.name} declined: {reason}")
        if reason is None:
            return Step(i, stop, fusion)
        entry = (fusion.name, tuple(range(i, stop)), reason)
        if entry not in declined:
            declined.append(entry)
    return None


def _partition(
    ops: Sequence[BasicOp], cfg: PlanConfig, extra_inputs: Sequence[tuple[Any, ...]],
    candidates: Sequence[Fusion], fixed: Sequence[Step], declined: list,
    hooked: frozenset[int] = frozenset(),
) -> tuple[Step, ...]:
    """Left to right, longest pattern first; ``fixed`` steps are kept where they are."""
    candidates = sorted(candidates, key=lambda f: -len(f.pattern))
    fixed_at = {s.start: s for s in fixed}
    steps, i = [], 0
    while i < len(ops):
        step = fixed_at.get(i)
        if step is None:
            # A fusion may not reach into a fixed step (no ``min(default=)``: dynamo cannot
            # trace that keyword).
            limit = min([s.start for s in fixed if s.start > i] + [len(ops)])
            fitting = [f for f in candidates if i + len(f.pattern) <= limit]
            step = _match_at(ops, i, cfg, extra_inputs, fitting, declined, hooked) or Step(i, i + 1)
        steps.append(step)
        i = step.stop
    return tuple(steps)


def build_plan(
    ops: Sequence[BasicOp], cfg: PlanConfig, extra_inputs: Sequence[tuple[Any, ...]],
    fusions: Sequence[Fusion] = REGISTRY, hooked: frozenset[int] = frozenset(),
) -> Plan:
    """The forward and backward steps for ``ops`` under ``cfg``.

    Fusions of both stages are placed first and hold the same ops in both directions
    (their forward may save what only their backward reads); single-stage fusions fill
    the rest of each direction independently. An op in ``hooked`` (module hooks) is a
    boundary: no fusion covers it, and ``declined`` says so.
    """
    declined: list = []
    both = [f for f in fusions if f.stage == Stage.BOTH] if cfg.grad_enabled else []
    fixed = [s for s in _partition(ops, cfg, extra_inputs, both, (), declined, hooked) if s.fusion is not None]
    forward_only = [f for f in fusions if f.stage & Stage.FORWARD and f.stage != Stage.BOTH]
    if not cfg.grad_enabled:
        # Without a backward, a both-stage fusion runs its forward alone.
        forward_only = [f for f in fusions if f.stage & Stage.FORWARD]
    forward = _partition(ops, cfg, extra_inputs, forward_only, fixed, declined, hooked)
    if cfg.grad_enabled:
        backward_only = [f for f in fusions if f.stage == Stage.BACKWARD]
        backward = _partition(ops, cfg, extra_inputs, backward_only, fixed, declined, hooked)
    else:
        backward = Plan.unfused(ops).backward_steps
    plan = Plan(tuple(type(op).__name__ for op in ops), forward, backward, tuple(declined))
    # Under torch.compile the plan is rebuilt per trace, and logging is a side effect.
    if not torch.compiler.is_compiling() and logger.isEnabledFor(logging.DEBUG):
        logger.debug("fuseops plan for %s under %s: forward %s, backward %s, declined %s",
                     plan.op_names, cfg, plan.forward, plan.backward, plan.declined)
    return plan


class PlanCache:
    """Plans of one op list, keyed by everything a guard may depend on."""

    def __init__(self) -> None:
        self._plans: dict[tuple, Plan] = {}

    def get(
        self, ops: Sequence[BasicOp], cfg: PlanConfig, extra_inputs: Sequence[tuple[Any, ...]],
        hooked: frozenset[int] = frozenset(),
    ) -> Plan:
        key = (
            cfg,
            hooked,
            tuple(op.training for op in ops),
            tuple(p.requires_grad for op in ops for _, p in op.own_parameters()),
            tuple(_extra_key(e) for extras in extra_inputs for e in extras),
            _alias_pattern([e for extras in extra_inputs for e in extras]),
        )
        plan = self._plans.get(key)
        if plan is None:
            plan = self._plans[key] = build_plan(ops, cfg, extra_inputs, hooked=hooked)
        return plan

    def clear(self) -> None:
        self._plans.clear()


def _alias_pattern(extras: Sequence[Any]) -> tuple[int, ...]:
    """For each extra input, the index of the first one that is the same."""
    return tuple(next(j for j in range(i + 1) if same_extra_input(extras[i], extras[j])) for i in range(len(extras)))


def _extra_key(e: Any) -> Any:
    if isinstance(e, torch.Tensor):
        return (e.dtype, e.device.type, e.requires_grad)
    return type(e)
