"""``fuseops.Sequential``: compose basic ops; the fuser plans how they run."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch

from fuseops.fuser import PlanCache, plan_config
from fuseops.ops.executor.execute import (
    Plan,
    check_chain,
    execute,
    make_contexts,
    split_extra_inputs,
)
from fuseops.ops.op import BasicOp
from fuseops.quant.autocast import current_recipe


class Sequential(torch.nn.Module):
    """A chain of basic ops run as one planned, possibly fused, autograd function.

    Args:
        *ops: basic ops or Sequentials (nested ones are flattened).
        fuse: run the registered fusions where they apply; ``False`` runs the basic
            ops only (the reference).

    ``forward(input, *extra_inputs)``: ops that take extra inputs (``GroupedLinear``'s
    split sizes, ``AddExtraInput``'s tensor, a scaled gated activation's probs) consume
    them in op order. Returns the output, or ``(output, *extra_outputs)`` when an op
    makes extra outputs. After a forward, ``plan`` records what ran.
    """

    def __init__(self, *ops: BasicOp | Sequential, fuse: bool = True) -> None:
        super().__init__()
        if not isinstance(fuse, bool):
            raise TypeError(f"fuse: expected True or False, got {fuse!r}")
        self.fuse = fuse
        self._plans = PlanCache()
        self._plan: Plan | None = None
        for op in ops:
            self.append(op)

    def append(self, op: BasicOp | Sequential) -> Sequential:
        """Add an op (or every op of a Sequential) at the end."""
        if isinstance(op, Sequential):
            for inner in op:
                self.append(inner)
            return self
        if not isinstance(op, BasicOp):
            raise TypeError(
                f"ops: expected fuseops basic ops or fuseops.Sequential, got {type(op).__name__} "
                f"at position {len(self)}"
            )
        self.add_module(str(len(self)), op)
        self._plans.clear()
        return self

    def __len__(self) -> int:
        return len(self._modules)

    def __iter__(self) -> Iterator[BasicOp]:
        return iter(self._modules.values())  # type: ignore[arg-type]

    def __getitem__(self, index: int | slice) -> BasicOp | Sequential:
        ops = list(self)
        if isinstance(index, slice):
            return Sequential(*ops[index], fuse=self.fuse)
        return ops[index]

    @property
    def plan(self) -> Plan | None:
        """The plan of the last forward: ``plan.forward`` / ``plan.backward`` are lists of
        ``(name, indices)``, one entry per executed (possibly fused) op."""
        return self._plan

    def forward(self, input: torch.Tensor, *extra_inputs: Any) -> Any:
        ops = list(self)
        per_op = split_extra_inputs(ops, extra_inputs)
        check_chain(ops, input, per_op)
        grad_enabled = torch.is_grad_enabled()
        recipe = current_recipe()
        if self.fuse:
            plan = self._plans.get(ops, plan_config(input, recipe, grad_enabled), per_op)
        else:
            plan = Plan.unfused(ops)
        self._plan = plan
        ctxs = make_contexts(ops, input, per_op, recipe=recipe, grad_enabled=grad_enabled)
        return execute(plan, ops, ctxs, input, per_op)
