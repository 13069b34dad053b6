"""``fuseops::`` operators registered through ``torch.library.Library`` directly.

``torch.library.custom_op`` infers the schema and wraps each call in Python (its autograd
kernel, argument handling), which costs ~20 us a call on this project's CPU machine against
~7 us for an operator defined from a schema with a plain implementation: a compiled MoE step
calls ten of them, and where it is host-bound that overhead is its step time. The ops are
functional (no argument is mutated, outputs never alias inputs), have no autograd formula
(they run inside the plans' and routing's autograd Functions) and get their fake (shape-only)
implementation from ``torch.library.register_fake``; ``torch.library.opcheck`` checks each
(tests/kernels/test_library.py, tests/kernels/moe/test_traceable.py).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

_LIB = torch.library.Library("fuseops", "FRAGMENT")


def fuseops_op(schema: str) -> Callable[[Callable], torch._ops.OpOverload]:
    """Define ``fuseops::<schema>`` with the decorated function as its implementation on every
    device; returns the operator (call it with positional arguments)."""
    name = schema.split("(", 1)[0]

    def define(impl: Callable) -> torch._ops.OpOverload:
        _LIB.define(schema)
        _LIB.impl(name, impl, "CompositeExplicitAutograd")
        return getattr(torch.ops.fuseops, name).default
    return define
