"""Checks of what only a tensor's values tell (split sizes, routing ids), made by a compiled graph
when it runs.

While torch.compile traces, no tensor's values are known, and a row count may be symbolic: an
error formatted then could name neither the values nor the row count (printing a symbolic one
would pin the graph to one row count). Traced, ``run_time_check`` is one operator,
``fuseops::run_time_check``, whose implementation runs eager's own check (one registered in
``CHECKS``) on the tensor and the bound the graph has when it runs. So a compiled call fails as
the same call made eagerly does: a ``ValueError`` naming the values where they are on the CPU (or
read back with ``FUSEOPS_DEBUG=1``), the device-side assert naming the argument and the bound on
a device (its values stay there: reading them would sync the host).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from fuseops.kernels.custom_op import fuseops_op

# name -> check(t, bound, argument, what): raises (or asserts on t's device) when t's values fail.
CHECKS: dict[str, Callable[[torch.Tensor, int, str, str], None]] = {}


def registered(name: str) -> Callable[[Callable], Callable]:
    """Register the decorated eager check under ``name`` (for ``run_time_check``)."""
    def register(check: Callable) -> Callable:
        CHECKS[name] = check
        return check
    return register


@fuseops_op("run_time_check(str check, Tensor t, SymInt bound, str argument, str what) -> ()")
def _run_time_check(check: str, t: torch.Tensor, bound: int, argument: str, what: str) -> None:
    CHECKS[check](t, bound, argument, what)


@torch.library.register_fake("fuseops::run_time_check")
def _(check: str, t: torch.Tensor, bound: int, argument: str, what: str) -> None:
    return None


# An operator with no output is dead code to AOTAutograd and Inductor unless marked.
torch.fx.node.has_side_effect(_run_time_check)


def run_time_check(check: str, t: torch.Tensor, bound: int, argument: str, what: str = "") -> None:
    """The check registered as ``check`` of ``t`` against ``bound`` (a row count, the expert
    count), for the argument called ``argument``; ``what`` says what the bound is. Eagerly made
    at once; while torch.compile traces, by the compiled graph when it runs."""
    if torch.compiler.is_compiling():
        _run_time_check(check, t, bound, argument, what)
    else:
        CHECKS[check](t, bound, argument, what)
