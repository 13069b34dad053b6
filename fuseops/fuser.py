"""The fuser: turns a flat op list into a plan by matching the registered fusions.

Patterns are matched left to right over the op list, longest first, separately for the
forward and the backward stage; a fusion whose guard refuses leaves its ops to run
basic, and the reason is kept in ``Plan.declined``. Plans are cached per op list and
per (recipe, dtypes, device, which inputs need grad).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Sequence
from typing import Any

import torch

from fuseops.fusions import REGISTRY
from fuseops.fusions.fusion import Fusion, PlanConfig, Stage, measured_declines_are_ignored, same_extra_input
from fuseops.kernels._triton import runs_triton
from fuseops.ops._autocast import autocast_dtype
from fuseops.ops.executor.execute import Plan, Step, current_autocast
from fuseops.ops.op import OP_CLASSES, BasicOp

logger = logging.getLogger("fuseops")
_warned: set[tuple[str, str]] = set()


def warn_once(key: tuple[str, str], message: str) -> None:
    """A fallback, logged once per ``key`` at WARNING; not while torch.compile traces (a log
    call breaks the graph, and ``fullgraph=True`` raises): ``plan.declined`` records it there
    too, and an eager call logs it."""
    if torch.compiler.is_compiling():
        return
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
    # (``current_autocast(x)`` without its check: x is a tensor here.)
    return (recipe, grad_enabled, runs_triton(x), autocast_dtype(x.device), measured_declines_are_ignored())


@torch.compiler.assume_constant_result
def _registry_view(op_codes: tuple[int, ...], *fusion_types: type[Fusion]) -> tuple:
    """What matching reads of the fusions for ops of these classes (``BasicOp.class_code``),
    as ints and strings: per fusion its name, pattern length and the pattern elements with a
    ``where`` predicate; then for each planning pass, per op position, the fusions whose
    pattern types match there, longest pattern first (registry order among equals).

    Under torch.compile this is called once per trace and its result is a constant: dynamo
    guards its arguments (each op's class code, the registry's length and each fusion's type;
    ``pattern`` and ``stage`` are class attributes) instead of every pattern's contents, which
    cost hundreds of guards checked on every call. Nothing in the result is an object the trace
    also reaches another way (dynamo would guard that the two are the same)."""
    return _view_of(op_codes, fusion_types)


@functools.cache
def _view_of(op_codes: tuple[int, ...], fusion_types: tuple[type[Fusion], ...]) -> tuple:
    classes = [OP_CLASSES[c] for c in op_codes]
    names = tuple(f.__name__ for f in fusion_types)
    # Per op position, why no fusion may take the op (a user's subclass that overrides the math).
    unfusible = tuple(c.unfusible_reason() for c in classes)
    lengths = tuple(len(f.pattern) for f in fusion_types)
    wheres = tuple(tuple(j for j, m in enumerate(f.pattern) if m.where is not None) for f in fusion_types)

    def types_match(k: int, i: int) -> bool:
        window = classes[i:i + lengths[k]]
        pattern = fusion_types[k].pattern
        return len(window) == len(pattern) and all(issubclass(c, m.types) for c, m in zip(window, pattern))

    def candidates(keep) -> tuple[tuple[int, ...], ...]:
        picked = sorted((k for k, f in enumerate(fusion_types) if keep(f.stage)), key=lambda k: -lengths[k])
        return tuple(tuple(k for k in picked if types_match(k, i)) for i in range(len(classes)))

    both = candidates(lambda s: s == Stage.BOTH)
    forward_only = candidates(lambda s: bool(s & Stage.FORWARD) and s != Stage.BOTH)
    # Without a backward, a both-stage fusion runs its forward alone.
    forward_any = candidates(lambda s: bool(s & Stage.FORWARD))
    backward_only = candidates(lambda s: s == Stage.BACKWARD)
    return names, lengths, wheres, unfusible, both, forward_only, forward_any, backward_only


class _Matcher:
    """Matches the fusions of one ``build_plan`` call at op positions; records declines."""

    def __init__(
        self, ops: Sequence[BasicOp], cfg: PlanConfig, extra_inputs: Sequence[tuple[Any, ...]],
        fusions: Sequence[Fusion], view: tuple, hooked: frozenset[int],
    ) -> None:
        self.ops, self.cfg, self.extra_inputs, self.fusions, self.hooked = ops, cfg, extra_inputs, fusions, hooked
        self.names, self.lengths, self.wheres, self.unfusible = view[:4]
        self.declined: list = []

    def at(self, i: int, limit: int, candidates: Sequence[int]) -> Step | None:
        """The first of ``candidates`` (positions of fusions whose types match at op ``i``)
        that fits within ``limit``, whose predicates hold and whose guard accepts, as a step."""
        for k in candidates:
            stop = i + self.lengths[k]
            if stop > limit:
                continue
            window = self.ops[i:stop]
            fusion = self.fusions[k]
            unknown = [j for j in range(i, stop) if self.unfusible[j] is not None]
            if unknown:
                reason = f"op {unknown[0]}: {self.unfusible[unknown[0]]}"
                warn_once((self.names[k], reason), f"fuseops: {self.names[k]} declined: {reason}")
                self._decline(k, i, stop, reason)
                continue
            if not all(fusion.pattern[j].where(window[j]) for j in self.wheres[k]):
                continue
            reason = fusion.guard(window, self.cfg, self.extra_inputs[i:stop])
            with_hooks = [j for j in range(i, stop) if j in self.hooked]
            if reason is None and with_hooks:
                # A hooked op is a boundary: it runs as a module so its hooks see its own tensors.
                j = with_hooks[0]
                reason = f"op {j} ({type(self.ops[j]).__name__}) has module hooks: it runs alone so they fire"
                warn_once((self.names[k], type(self.ops[j]).__name__), f"fuseops: {self.names[k]} declined: {reason}")
            if reason is None:
                return Step(i, stop, fusion)
            self._decline(k, i, stop, reason)
        return None

    def _decline(self, k: int, start: int, stop: int, reason: str) -> None:
        entry = (self.names[k], tuple(range(start, stop)), reason)
        if entry not in self.declined:
            self.declined.append(entry)

    def partition(self, candidates: Sequence[Sequence[int]], fixed: Sequence[Step]) -> tuple[Step, ...]:
        """Left to right, at each op its ``candidates`` in order (longest pattern first);
        ``fixed`` steps are kept where they are."""
        fixed_at = {s.start: s for s in fixed}
        steps, i = [], 0
        while i < len(self.ops):
            step = fixed_at.get(i)
            if step is None:
                # A fusion may not reach into a fixed step (no ``min(default=)``: dynamo cannot
                # trace that keyword).
                limit = min([s.start for s in fixed if s.start > i] + [len(self.ops)])
                step = self.at(i, limit, candidates[i]) or Step(i, i + 1)
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
    view = _registry_view(tuple([op.class_code for op in ops]), *[type(f) for f in fusions])
    both, forward_only, forward_any, backward_only = view[4:]
    matcher = _Matcher(ops, cfg, extra_inputs, fusions, view, hooked)
    fixed = [s for s in matcher.partition(both, ()) if s.fusion is not None] if cfg.grad_enabled else []
    forward = matcher.partition(forward_only if cfg.grad_enabled else forward_any, fixed)
    if cfg.grad_enabled:
        backward = matcher.partition(backward_only, fixed)
    else:
        backward = tuple(Step(i, i + 1) for i in range(len(ops)))
    compiling = torch.compiler.is_compiling()
    # The op names only label a plan for display, and a plan made while tracing is never
    # shown (``type(op).__name__`` would cost guards on every op's type name).
    names = () if compiling else tuple(type(op).__name__ for op in ops)
    plan = Plan(names, forward, backward, tuple(matcher.declined))
    # Under torch.compile the plan is rebuilt per trace, and logging is a side effect.
    if not compiling and logger.isEnabledFor(logging.DEBUG):
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

    def __getstate__(self) -> dict:
        # Derived state (``CallCache.__getstate__``): a copy of the module plans again.
        return {"_plans": {}}


def _alias_pattern(extras: Sequence[Any]) -> tuple[int, ...]:
    """For each extra input, the index of the first one that is the same."""
    return tuple(next(j for j in range(i + 1) if same_extra_input(extras[i], extras[j])) for i in range(len(extras)))


def _extra_key(e: Any) -> Any:
    if isinstance(e, torch.Tensor):
        return (e.dtype, e.device.type, e.requires_grad)
    return type(e)
