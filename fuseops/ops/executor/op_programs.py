"""The ``fuseops::`` operators' implementations through recorded programs (issue 20: the host
time of a compiled step).

Under ``torch.compile`` each of our kernels is a custom operator (``kernels/custom_op.py``)
whose implementation is its launcher, and the launcher's Python (views, checks, tile choice,
descriptors, output allocation, the launch key) ran at every call: 40-80 us a launcher on the
H100 host besides the launch itself, 0.75-1.05 ms of a compiled Qwen3 MoE step's 2.4-2.9 ms
enqueue at T=1024, where torch.compile's whole step enqueued in 1.4 ms (session 28, device calls
2-4). All of it gives the same answer for the same arguments' layout and reads no device data, so
an operator's calls take ``replay.py``'s path, as the executor's plans do: the first call of a
layout runs the implementation, the second is recorded, later ones run the recorded program (its
allocations through torch's bindings, its launches straight into the stored C entry points).

A layout is every tensor argument's shape, strides, dtype, device and 16-byte alignment, which
tensor arguments are the same object (a record names it once), every other argument's value (floats by ``repr``: -0.0 is not 0.0 to a kernel), torch's autocast state,
whether CPU tensors run the Triton kernels (``interpreted_kernels()``) and ``replay.layout_key``'s
global state (deterministic algorithms, the launch state). A refused
recording (a host read of device data, a tensor from outside the call: a CPU reference walking
offsets) leaves that layout on the implementation. No CUDA graph is made of these programs: one
operator's program is a launch or a few, which a graph's input copies would outweigh.

The MoE routing's calls and ``expert_layer``'s bodies take the same path eagerly
(``routing_graphs._recorded``, ``expert_layer_steps._backward_through_graphs``), keyed by the
call's name and static values: where no CUDA graph is kept (the host is not the bound, graphs
off, the CPU) they replay their programs instead of running the launchers' Python.

Not used (the implementation runs as it is) while another recording runs (the executor's: what
the operator does is part of that record), on meta tensors or a list of tensors, and where
``replay.enabled_now()`` is off (``FUSEOPS_REPLAY=0``, ``FUSEOPS_DEBUG=1``).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Any

import torch

from fuseops.kernels import custom_op
from fuseops.kernels import launch as kernel_launch
from fuseops.kernels._triton import cpu_kernels_active
from fuseops.ops.executor import replay

# Layouts kept per operator; beyond, new layouts run the implementation.
MAX_LAYOUTS = 64

# By operator name (or ``call``'s other keys): layout -> None (seen once), a recorded program, or a refusal.
_programs: dict[Hashable, dict[tuple, Any]] = {}


class _Unkeyed(Exception):
    """An argument a layout cannot hold: a list of tensors (a record names only the arguments)."""


def _arg_key(a: Any) -> Any:
    if isinstance(a, torch.Tensor):
        if a.is_meta:
            raise _Unkeyed
        return (a.shape, a.stride(), a.dtype, a.device, a.data_ptr() & 15)
    if a.__class__ is float:
        return (float, repr(a))
    if a.__class__ is list:
        if any(isinstance(v, torch.Tensor) for v in a):
            raise _Unkeyed
        return (list, tuple(a))
    return (a.__class__, a)


def layout(args: tuple) -> tuple | None:
    """The layout of an operator's arguments (module docstring), or None where an argument has
    none (a meta tensor, a list of tensors): the implementation then runs as it is."""
    try:
        keys = tuple(map(_arg_key, args))
    except _Unkeyed:
        return None
    tensors = [id(a) for a in args if isinstance(a, torch.Tensor)]
    # A record names a tensor passed twice once: which arguments are the same object is part of it.
    same = len(set(tensors)) != len(tensors) and tuple(map(tensors.index, tensors))
    device = next((a.device.type for a in args if isinstance(a, torch.Tensor)), "cpu")
    return (torch.is_autocast_enabled(device), cpu_kernels_active(), replay.layout_key(()), same, *keys)


def clear() -> None:
    """Forget every operator's layouts and programs (a test that counts recordings from none)."""
    _programs.clear()


def call(name: Hashable, impl: Callable, args: tuple) -> Any:
    """``impl(*args)``, through the program recorded for the arguments' layout where there is one.
    ``name``: the operator's, or any key that fixes what ``impl`` does besides its arguments
    (``routing_graphs``: a call's name and static values)."""
    key = None if kernel_launch.recording is not None or not replay.enabled_now() else layout(args)
    if key is None:
        return impl(*args)
    table = _programs.setdefault(name, {})
    found = table.get(key, False)
    if found.__class__ is replay.Program:
        out = replay.replayed(found, *[a if isinstance(a, torch.Tensor) else None for a in args])
        return out if found.meta else out[0]
    if found is False:
        if len(table) < MAX_LAYOUTS:
            table[key] = None
        return impl(*args)
    if found is not None:  # a refusal
        return impl(*args)
    inputs = [a if isinstance(a, torch.Tensor) else None for a in args]
    out, program = replay.record(inputs, lambda notice: impl(*args),
                                 lambda out: out if isinstance(out, tuple) else (out,), graphs=False)
    if program.__class__ is replay.Program:
        program.meta = isinstance(out, tuple)  # the operator returns a tuple
    table[key] = program
    return out


def programs(name: Hashable) -> dict[tuple, Any]:
    """Operator ``name``'s layouts and what each holds (tests)."""
    return _programs.get(name, {})


custom_op.calling = call
