"""Where the scheduler meets torch: saved-tensor hooks and module call hooks.

Saved tensors reach the innermost active context through
``torch.autograd.graph.saved_tensors_hooks`` (fuseops' fuser saves its activations
through ``ctx.save_for_backward``, so plain torch code and fuseops ops take the same
door). Module hooks, installed process-wide only while some context is active on some
thread, do three things for the innermost context of the calling thread: each top-level
``fuseops.Sequential`` call becomes a group; the buffers of every module called are
remembered, so that a buffer saved by autograd stays where it is (a parameter is
recognised from the tensor itself); and every module called counts its FLOPs and weight
gradients to the group it runs in (plan.py). While some context is active, the executor's save
notices (``ops/executor/save_notice.py``) go to the innermost context of the calling
thread too, when its hooks are the ones its saves will reach.
"""

from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Iterator
from typing import Any

import torch
from torch.nn.modules import module as nn_module

from fuseops.offload.records import Skip, count_skip
from fuseops.offload.scheduler import Scheduler
from fuseops.ops.executor.save_notice import set_receiver

_local = threading.local()
_install_lock = threading.Lock()
_installed: list[Any] = []
_users = 0


def _stack() -> list[Any]:
    if not hasattr(_local, "stack"):
        _local.stack = []
    return _local.stack


def innermost() -> Any:
    """The innermost active scope of this thread: a ``Scheduler``, a ``Disabled``, or None."""
    # Every module call asks (the module hooks): no stack built for a thread that has none.
    stack = getattr(_local, "stack", None)
    return stack[-1] if stack else None


class Disabled:
    """An ``offload_activations(enabled=False)`` block: saved tensors pass through."""

    def __init__(self, stats: dict[str, int]) -> None:
        self.stats = stats

    def pack(self, t: torch.Tensor) -> torch.Tensor:
        count_skip(self.stats, Skip.DISABLED)
        return t

    def unpack(self, t: torch.Tensor) -> torch.Tensor:
        return t


@functools.cache
def _sequential_class() -> type:
    # offload/ is the top layer: importing the Sequential it groups by is allowed, and
    # done on first use so that fuseops/__init__ can import this package in any order.
    from fuseops.sequential import Sequential

    return Sequential


def _pre_hook(module: torch.nn.Module, args: Any) -> None:
    scope = innermost()
    if not isinstance(scope, Scheduler):
        return
    buffers = module._buffers
    if buffers:
        for buffer in buffers.values():
            if buffer is not None:
                scope.buffers.add(buffer)
    if isinstance(module, _sequential_class()):
        scope.sequential_groups.append(scope.open_group())
    # After the group opens: a Sequential's FLOPs and weight gradients are its group's.
    scope.count_module(module, args)


def _post_hook(module: torch.nn.Module, args: Any, output: Any) -> None:
    scope = innermost()
    if isinstance(scope, Scheduler) and scope.sequential_groups and isinstance(module, _sequential_class()):
        scope.close_group(scope.sequential_groups.pop())


def _notice(tensors: list[torch.Tensor]) -> None:
    """The executor's notice of saves to come (``save_notice.py``), for the innermost
    context of the calling thread, when torch's innermost saved-tensor hooks are that
    context's own (a checkpoint, or the caller's own hooks, inside the context takes the
    saves elsewhere: a notice there would make records no save ever reaches)."""
    scope = innermost()
    if isinstance(scope, Scheduler):
        top = torch._C._autograd._top_saved_tensors_default_hooks(False)
        if top is not None and top[0] == scope.pack:
            scope.notice(tensors)


def _install() -> None:
    global _users
    with _install_lock:
        _users += 1
        if _users == 1:
            _installed.append(nn_module.register_module_forward_pre_hook(_pre_hook))
            # always_call: a forward that raises still closes its group.
            _installed.append(nn_module.register_module_forward_hook(_post_hook, always_call=True))
            set_receiver(_notice)


def _uninstall() -> None:
    global _users
    with _install_lock:
        _users -= 1
        if _users == 0:
            set_receiver(None)
            while _installed:
                _installed.pop().remove()


@contextlib.contextmanager
def active(scope: Scheduler | Disabled) -> Iterator[None]:
    """Make ``scope`` the innermost context of this thread for the block."""
    stack = _stack()
    stack.append(scope)
    _install()
    try:
        with torch.autograd.graph.saved_tensors_hooks(scope.pack, scope.unpack):
            yield
    finally:
        _uninstall()
        stack.pop()
