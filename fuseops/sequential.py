"""``fuseops.Sequential``: compose basic ops; the fuser plans how they run."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, NoReturn

import torch

from fuseops.call_cache import CallCache, call_signature, sizeless_signature
from fuseops.fuser import PlanCache, build_plan, plan_config
from fuseops.ops import _checks
from fuseops.ops import op as op_module
from fuseops.ops.executor import plain_autograd
from fuseops.ops.executor.execute import Plan, check_chain, execute, make_contexts, split_extra_inputs, stand_in
from fuseops.ops.executor.prepared import flat_parameters, prepare, run_prepared
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
        self._calls = CallCache()
        self._plan: Plan | None = None
        # ``op.settings_epoch`` when the caches were last known to match the ops' settings.
        self._settings_epoch = op_module.settings_epoch
        for op in ops:
            self.append(op)

    def __prepare_scriptable__(self) -> NoReturn:
        op_module.refuse_torchscript(self)

    def append(self, op: BasicOp | Sequential) -> Sequential:
        """Add an op (or every op of a Sequential) at the end."""
        if isinstance(op, Sequential):
            for inner in op:
                self.append(inner)
            return self
        self.add_module(str(len(self)), op)
        return self

    def add_module(self, name: str, module: torch.nn.Module | None) -> None:
        """Put an op at ``name`` (``append``, ``register_module`` and ``setattr`` come here or to
        ``__setattr__``): what was planned for the ops before is dropped."""
        _check_op(name, module)
        super().add_module(name, module)
        self._forget()

    def __setattr__(self, name: str, value: Any) -> None:
        if isinstance(value, torch.nn.Module):
            # An op put in, or one replaced (``setattr(seq, "1", ops.ReLU())``).
            _check_op(name, value)
            super().__setattr__(name, value)
            self._forget()
            return
        super().__setattr__(name, value)

    def __delattr__(self, name: str) -> None:
        super().__delattr__(name)
        self._forget()

    def _forget(self) -> None:
        """Drop the plans and prepared runs: the ops or their settings changed."""
        if "_calls" in self.__dict__:  # (not while ``__init__`` has not made them yet)
            self._plans.clear()
            self._calls.clear()
            self._settings_epoch = op_module.settings_epoch

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
        # ``list(self)`` without the two Python calls of ``__iter__`` and ``__len__``.
        ops: list[BasicOp] = list(self._modules.values())  # type: ignore[arg-type]
        grad_enabled = torch.is_grad_enabled()
        recipe = current_recipe()
        compiling = torch.compiler.is_compiling()
        signature = None
        if not compiling:
            if self._settings_epoch != op_module.settings_epoch:
                # An op's setting changed since the last call (``op.settings_epoch``): perhaps one of these.
                self._forget()
            # A signature seen before: its checks passed, its plan and contexts are made
            # (``call_cache.py``); only the tensors are gathered.
            signature, params = call_signature(
                ops, input, extra_inputs, fuse=self.fuse, grad_enabled=grad_enabled, recipe=recipe
            )
            prepared = None if signature is None else self._calls.runs.get(signature)
            if prepared is not None:
                if self._plan is not prepared.plan:
                    self._plan = prepared.plan
                return run_prepared(prepared, ops, input, extra_inputs, params, compiling=False)
            prepared = None if signature is None else self._calls.general.get(sizeless_signature(signature))
            if prepared is not None:
                # Seen but for sizes or split-size values (``sizeless_signature``): the checks
                # read those, so they run; the run kept serves.
                try:
                    check_chain(ops, input, split_extra_inputs(ops, extra_inputs))
                except (ValueError, TypeError) as error:
                    return _checks.refused_while_tracing(error, stand_in(ops, input))
                self._calls.put(signature, prepared)
                if self._plan is not prepared.plan:
                    self._plan = prepared.plan
                return run_prepared(prepared, ops, input, extra_inputs, params, compiling=False)
        try:
            per_op = split_extra_inputs(ops, extra_inputs)
            specs = check_chain(ops, input, per_op)
        except (ValueError, TypeError) as error:
            # Eagerly raised at once; while tracing, by the compiled graph (a raise while tracing
            # would reach the user as dynamo's ``Unsupported`` under ``fullgraph=True``).
            return _checks.refused_while_tracing(error, stand_in(ops, input))
        hooked = hooked_ops(ops)
        if not self.fuse:
            plan = Plan.unfused(ops)
        elif compiling:
            # Planned once per trace; a plan made while tracing can be neither cached nor
            # kept in ``self.plan`` (dynamo cannot rebuild it outside the graph).
            plan = build_plan(ops, plan_config(input, recipe, grad_enabled), per_op, hooked=hooked)
        else:
            plan = self._plans.get(ops, plan_config(input, recipe, grad_enabled), per_op, hooked)
        if not compiling:
            self._plan = plan
        if hooked:
            return self._run_segments(plan, ops, hooked, input, per_op)
        ctxs = make_contexts(ops, input, per_op, recipe=recipe, grad_enabled=grad_enabled, input_specs=specs)
        if compiling or signature is None and plain_autograd.parametrized(ops):
            # (A parametrized op has submodules: ``call_signature`` sends it here every call.)
            return execute(plan, ops, ctxs, input, per_op)
        if signature is None:
            params = flat_parameters(ops)
        prepared = prepare(plan, ops, ctxs, input, extra_inputs, params)
        self._calls.put(signature, prepared)
        return run_prepared(prepared, ops, input, extra_inputs, params, compiling=False)

    def _run_segments(
        self, plan: Plan, ops: list[BasicOp], hooked: frozenset[int], x: torch.Tensor, per_op: list
    ) -> Any:
        """Run with module hooks: each hooked op is called as a module (its hooks fire with
        its own input and output, on tensors autograd tracks), the runs of ops between are
        planned sub-chains (the plan never fuses across a hooked op)."""
        extra_outputs: list[torch.Tensor] = []
        i = 0
        while i < len(ops):
            if i in hooked:
                out = ops[i](x, *per_op[i])
                stop = i + 1
            else:
                stop = min([j for j in hooked if j > i], default=len(ops))
                seg_ops, seg_extras = ops[i:stop], per_op[i:stop]
                sub = plan.segment(i, stop)
                specs = check_chain(seg_ops, x, seg_extras)
                ctxs = make_contexts(
                    seg_ops, x, seg_extras, recipe=current_recipe(), grad_enabled=torch.is_grad_enabled(),
                    input_specs=specs,
                )
                out = execute(sub, seg_ops, ctxs, x, seg_extras)
            n_extra = sum(op.num_extra_outputs for op in ops[i:stop])
            if n_extra:
                x, *outs = out
                extra_outputs += outs
            else:
                x = out
            i = stop
        return (x, *extra_outputs) if extra_outputs else x


def _check_op(name: str, module: Any) -> None:
    """A TypeError unless ``module`` is a basic op (what a Sequential holds as its children)."""
    if not isinstance(module, BasicOp):
        raise TypeError(f"ops: expected fuseops basic ops or fuseops.Sequential, got {type(module).__name__} "
                        f"at position {name}")


def hooked_ops(ops: list[BasicOp]) -> frozenset[int]:
    """Positions of ops with hooks of their own: they run as modules, so the hooks fire.

    Global module hooks (``register_module_forward_hook`` and the like) fire for the
    ``Sequential`` call itself, not per op: offloading's group boundaries and profilers use
    them, and they must not turn fusion off."""
    return frozenset(
        i for i, op in enumerate(ops)
        if op._forward_hooks or op._forward_pre_hooks or op._backward_hooks or op._backward_pre_hooks
    )
