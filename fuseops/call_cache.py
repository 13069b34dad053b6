"""Per-call work decided once per call signature.

A ``Sequential`` call validates the chain, finds its plan, builds the op contexts and lays
out the autograd Function's inputs; all of that follows from the call's *signature*: the
input's shape, dtype, device and whether it needs grad; grad mode, the recipe, the autocast
dtype, whether kernels run for the device; each op's training flag and each parameter's
identity, shape, dtype, device and ``requires_grad``; for each extra input, which earlier tensor it
is (by identity) and its metadata, or, where the checks read values (a list of split sizes,
an integer CPU tensor), the values themselves. A call whose signature was seen before skips
straight to running (``fuseops.ops.executor.prepared``): its checks passed for that signature
and would pass again, so errors still come before any launch. What is kept holds no tensor.

Only the checks read the sizes and the split sizes' values; the kept run does not. A call that
matches a kept run but for those (``sizeless_signature``: expert parallelism receives another
row count, in other groups, every step) runs the checks, then that run: not the full path.

The signature holds no op setting (``eps``, ``approximate``): a change of one, or an op put in,
drops every kept run instead (``fuseops.ops.op.settings_epoch``, ``Sequential._forget``).

Calls with per-op module hooks, with an integer device tensor under ``FUSEOPS_DEBUG=1``
(the checks then read its values), with an extra input of another kind, and calls while
torch.compile traces take the full path.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from fuseops.fuser import config_signature
from fuseops.ops._checks import debug_checks_enabled
from fuseops.ops.executor.prepared import Prepared

# Signatures kept per Sequential: a changing row count makes one per count; past this many
# the cache starts over (a miss costs the full path, no more).
MAX_SIGNATURES = 64


def _extra_key(e: Any, tensors: list[torch.Tensor]) -> Any:
    """An extra input's part of the signature; None when it has none (the full path runs)."""
    if isinstance(e, torch.Tensor):
        same = -1
        for i, t in enumerate(tensors):
            if t is e:
                same = i
                break
        else:
            tensors.append(e)
        # The checks and the plan read an integer CPU tensor's values (split sizes on the host).
        values = None
        if not e.is_floating_point():
            if e.dim() != 1:
                # Not a list of sizes: the full path says what is wrong.
                return None
            if e.is_cpu:
                values = tuple(e.tolist())
            elif debug_checks_enabled():
                # FUSEOPS_DEBUG=1: the checks read device split sizes too (a host sync).
                return None
        return same, e.shape, e.dtype, e.device, e.requires_grad, values
    if isinstance(e, (list, tuple)) and all(type(s) is int for s in e):
        # Plain ints only: True == 1 and 1.0 == 1 as keys, but the checks refuse bools and
        # floats (anything else takes the full path, which says what is wrong).
        return tuple(e)
    return None


def call_signature(
    ops: Sequence[torch.nn.Module], x: Any, extra_inputs: Sequence[Any], *, fuse: bool, grad_enabled: bool,
    recipe: Any,
) -> tuple[tuple | None, list[torch.nn.Parameter]]:
    """``(signature, every op's own parameters in op order)``; the signature is None where
    the call must take the full path (module docstring)."""
    params: list[torch.nn.Parameter] = []
    if not isinstance(x, torch.Tensor):
        return None, params
    per_op: list[Any] = []
    for op in ops:
        # Hooks, or submodules: no basic op has any but a parametrized one (torch.nn.utils.parametrize).
        if op._forward_hooks or op._forward_pre_hooks or op._backward_hooks or op._backward_pre_hooks or op._modules:
            return None, params
        per_op.append(op.training)
        for p in op._parameters.values():
            if p is not None:
                params.append(p)
                # The id tells which positions hold one (tied) parameter; no id is reused
                # while both objects live, so equal ids mean the same sharing. The shape:
                # ``param.data = t`` may change it under the same id, and the checks read it.
                per_op.append((id(p), p.shape, p.dtype, p.device, p.requires_grad))
    tensors = [x]
    extras = []
    for e in extra_inputs:
        key = _extra_key(e, tensors)
        if key is None:
            return None, params
        extras.append(key)
    signature = (
        x.shape, x.dtype, x.device, x.requires_grad, fuse, config_signature(x, recipe, grad_enabled),
        tuple(per_op), tuple(extras),
    )
    return signature, params


def sizeless_signature(signature: tuple) -> tuple:
    """``signature`` without the sizes and values the checks read: the input's and each extra
    tensor's shape (their ranks stay), a host list's or CPU tensor's split sizes (their count
    stays). A prepared run depends on none of them: its plan (``PlanCache`` keys on no shape
    or value), op contexts and layout follow from the rest. So a call that matches a kept
    run only here (expert parallelism: the received row count, and host split sizes, change
    every step) runs the checks, which read what they read, and then that run."""
    x_shape, *middle, extras = signature
    keys, values = [], []
    for k in extras:
        if len(k) == 6 and type(k[1]) is torch.Size:  # a tensor's (``_extra_key``)
            keys.append((k[0], len(k[1]), k[2], k[3], k[4], None if k[5] is None else len(k[5])))
            values.append(k[5])
        else:  # a list of ints
            keys.append(("sizes", len(k)))
            values.append(k)
    # Which host split sizes are equal stays: a plan fuses two GroupedLinears only when they get
    # the same sizes (``same_extra_input`` compares values; ``PlanCache`` keys on that pattern).
    same = tuple(None if v is None else values.index(v) for v in values)
    return (len(x_shape), *middle, tuple(keys), same)


class CallCache:
    """``Prepared`` runs of one ``Sequential``, by call signature, and by its
    ``sizeless_signature`` (``general``: runs a call may take once its checks passed)."""

    def __init__(self) -> None:
        # Read directly by ``Sequential.forward`` (``runs.get``: no Python call per call).
        self.runs: dict[tuple, Prepared] = {}
        self.general: dict[tuple, Prepared] = {}

    def get(self, signature: tuple | None) -> Prepared | None:
        return None if signature is None else self.runs.get(signature)

    def put(self, signature: tuple | None, prepared: Prepared) -> None:
        if signature is None:
            return
        if len(self.runs) >= MAX_SIGNATURES:
            self.runs.clear()
        self.runs[signature] = prepared
        general = sizeless_signature(signature)
        if general not in self.general:
            if len(self.general) >= MAX_SIGNATURES:
                self.general.clear()
            self.general[general] = prepared

    def clear(self) -> None:
        self.runs.clear()
        self.general.clear()

    def __getstate__(self) -> dict:
        # Derived state, rebuilt by the next call: a copy (``copy.deepcopy``, ``torch.save`` of
        # the module) starts empty.
        return {"runs": {}, "general": {}}

    def __setstate__(self, state: dict) -> None:
        self.runs, self.general = {}, {}
