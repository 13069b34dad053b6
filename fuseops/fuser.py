"""The fuser: turns a flat op list into a plan by matching the registered fusions.

Patterns are matched left to right over the op list, longest first, separately for the
forward and the backward stage; a fusion whose guard refuses leaves its ops to run
basic, and the reason is kept in ``Plan.declined``. Plans are cached per op list and
per (recipe, dtypes, device, which inputs need grad).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from fuseops.fusions import REGISTRY
from fuseops.fusions.fusion import Fusion, PlanConfig, Stage
from fuseops.kernels._triton import runs_triton
from fuseops.ops.execute import Plan, Step
from fuseops.ops.op import BasicOp


def plan_config(x: torch.Tensor, recipe: Any, grad_enabled: bool) -> PlanConfig:
    return PlanConfig(
        recipe=recipe,
        dtype=x.dtype,
        device_type=x.device.type,
        input_requires_grad=grad_enabled and x.requires_grad,
        grad_enabled=grad_enabled,
        triton=runs_triton(x),
    )


def _partition(
    ops: Sequence[BasicOp], cfg: PlanConfig, stage: Stage, fusions: Sequence[Fusion], declined: list
) -> tuple[Step, ...]:
    candidates = sorted((f for f in fusions if f.stage & stage), key=lambda f: -len(f.pattern))
    steps, i = [], 0
    while i < len(ops):
        for fusion in candidates:
            window = ops[i : i + len(fusion.pattern)]
            if not fusion.matches(window):
                continue
            reason = fusion.guard(window, cfg)
            if reason is None:
                steps.append(Step(i, i + len(window), fusion))
                i += len(window)
                break
            entry = (fusion.name, tuple(range(i, i + len(window))), reason)
            if entry not in declined:
                declined.append(entry)
        else:
            steps.append(Step(i, i + 1))
            i += 1
    return tuple(steps)


def build_plan(ops: Sequence[BasicOp], cfg: PlanConfig, fusions: Sequence[Fusion] = REGISTRY) -> Plan:
    """The forward and backward steps for ``ops`` under ``cfg``."""
    declined: list = []
    forward = _partition(ops, cfg, Stage.FORWARD, fusions, declined)
    # Without a backward there is nothing to fuse in it.
    backward = _partition(ops, cfg, Stage.BACKWARD, fusions, declined) if cfg.grad_enabled else Plan.unfused(ops).backward_steps
    return Plan(tuple(type(op).__name__ for op in ops), forward, backward, tuple(declined))


class PlanCache:
    """Plans of one op list, keyed by everything a guard may depend on."""

    def __init__(self) -> None:
        self._plans: dict[tuple, Plan] = {}

    def get(self, ops: Sequence[BasicOp], cfg: PlanConfig, extra_inputs: Sequence[tuple[Any, ...]]) -> Plan:
        key = (
            cfg,
            tuple(op.training for op in ops),
            tuple(p.requires_grad for op in ops for p in op.parameters(recurse=False)),
            tuple(_extra_key(e) for extras in extra_inputs for e in extras),
        )
        plan = self._plans.get(key)
        if plan is None:
            plan = self._plans[key] = build_plan(ops, cfg)
        return plan

    def clear(self) -> None:
        self._plans.clear()


def _extra_key(e: Any) -> Any:
    if isinstance(e, torch.Tensor):
        return (e.dtype, e.device.type, e.requires_grad)
    return type(e)
