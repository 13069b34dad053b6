"""Launch a compiled Triton kernel without Triton's per-call binding.

``launch(kernel, grid, *args, **kw)`` does what ``kernel[grid](*args, **kw)`` does. The
first call of each specialization goes through Triton (which compiles if needed and
returns the ``CompiledKernel``); later calls with the same key hand the arguments straight
to that kernel's launcher, tensors as their data pointers. What this skips of Triton's
``JITFunction.run`` (12-60 us of host time a call on the H100 host, by the kernel's
arguments): binding the arguments, its cache key built as a string, launch metadata for
the (empty) hook chains, ``CudaLauncher.__call__``'s scratch closure, and in the C launcher
a ``data_ptr()`` call and a ``cuPointerGetAttribute`` per tensor, and for host tensor
descriptors the ``CUtensorMap`` encoding when one of the same address, shape, strides and
padding was encoded before (launch_descriptors.py). What stays: this key, the descriptors'
expansion otherwise and ``cuLaunchKernelEx``.

The key (``args_key``, ``kwargs_key``) determines Triton's specialization completely; it may
be finer (two keys, one compiled kernel), never coarser:

- per positional argument: tensors by dtype, 16-byte alignment of ``data_ptr()`` and
  ``is_cuda`` (a key with a CPU tensor is never stored: Triton's launch refuses it); ints
  by ``== 1``, ``% 16 == 0`` and range (int32 / int64 / uint64); floats, bools and None by
  type; host TensorDescriptors over a tensor by the base's dtype and the block shape (all
  that ``native_specialize_impl`` reads of them); anything else (Gluon descriptors, tuples,
  other tensor types) by Triton's own ``native_specialize_impl``. Parameters with flags (constexpr,
  ``do_not_specialize``, ``do_not_specialize_on_alignment``, type annotations) are keyed by
  ``native_specialize_impl`` with their flags, constexprs by type and value;
- every keyword (constexprs and options such as ``num_warps``) by name, type and value
  (floats and Triton dtypes by ``repr``: ``0.0 == -0.0`` but they compile differently; jit
  functions by identity);
  a keyword of any other type makes the call take Triton's path every time;
- the current device, ``knobs.runtime.debug`` and ``knobs.compilation.instrumentation_mode``
  (Triton adds both to its options).

The stream is read at every launch. Triton's path is taken when launch hooks are set
(``knobs.runtime.launch_enter_hook`` / ``launch_exit_hook``: they need launch metadata),
when the kernel has pre-run hooks, when a global value the kernel read at compile time has
changed (Triton raises there), when the grid is not a tuple, under ``TRITON_INTERPRET=1``
(the CPU tests: the interpreter has no compiled kernels), under ``torch.compile``
tracing and when ``ENABLED`` is off (``FUSEOPS_FAST_LAUNCH=0``). Global and profile scratch
buffers are allocated as ``CudaLauncher.__call__`` does, by calling it, for kernels that
need them.

``FUSEOPS_CHECK_LAUNCH=1`` (read at import; ``CHECK`` at run time) makes every fast call
also run Triton's binder and check that Triton's cache key and compiled kernel are the ones
stored for our key (``LaunchKeyMismatch`` otherwise), makes every kept ``CUtensorMap``
compared byte for byte with a fresh one (``ExpansionMismatch``), and counts the calls of
each path in ``counts``.
"""

from __future__ import annotations

import os
from typing import Any

import torch
import triton.language as tl
from triton import knobs
from triton.knobs import HookChain
from triton.runtime.jit import JITFunction, compute_cache_key
from triton.tools.tensor_descriptor import TensorDescriptor

from fuseops.kernels._triton import INTERPRET
from fuseops.kernels.launch_descriptors import DescriptorLaunch, descriptor_launch

# Off under the interpreter (it has no compiled kernels); FUSEOPS_FAST_LAUNCH=0, or setting
# this to False at run time, sends every call through Triton.
ENABLED: bool = not INTERPRET and os.environ.get("FUSEOPS_FAST_LAUNCH", "1") != "0"
CHECK: bool = os.environ.get("FUSEOPS_CHECK_LAUNCH", "0") == "1"
# Calls of each path, counted only under CHECK (what the tests read).
counts: dict[str, int] = {"fast": 0, "triton": 0}
# Keys kept per kernel; beyond, new specializations take Triton's path every call.
MAX_KEYS_PER_KERNEL = 1024


class LaunchKeyMismatch(AssertionError):
    """Our key mapped a call to a compiled kernel that Triton would not have launched."""


_Tensor = torch.Tensor
_Parameter = torch.nn.Parameter
_TensorDescriptor = TensorDescriptor
_NoneType = type(None)
# Keyword values keyed by (type, value): equal values of these types compile alike. A jit
# function (a declared activation's element function, a constexpr) is equal only to itself.
_BY_VALUE = frozenset({int, bool, str, _NoneType, JITFunction})
# Keyword values keyed by repr as well: equal floats may print (and compile) differently.
_BY_REPR = frozenset({float, tl.dtype})
_TENSORS = frozenset({_Tensor, _Parameter})
_I32 = 2**31
_I64 = 2**63
_U64 = 2**64


def int_key(x: int) -> Any:
    """Key of an int argument without flags: Triton makes 1 a constexpr, marks multiples
    of 16 divisible, and types the rest i32 / i64 / u64 by range (raising beyond)."""
    if x == 1:
        return "one"
    aligned = not x & 15
    if -_I32 <= x < _I32:
        return aligned
    if -_I64 <= x < _I64:
        return 2 + aligned
    if 0 <= x < _U64:
        return 4 + aligned
    return None  # Triton raises OverflowError: the caller takes Triton's path


def value_key(v: Any) -> Any:
    """Key of a constexpr or option value, or None if values of its type are not keyed."""
    c = v.__class__
    if c in _BY_VALUE:
        return (c, v)
    if c in _BY_REPR:
        return (c, repr(v))
    return None


class _Kernel:
    """What this module keeps per JITFunction: the stored launches by key, and per
    argument count whether every positional parameter is flag-free."""

    __slots__ = ("kernel", "entries", "plain", "backend", "globals_seen", "globals_live")

    def __init__(self, kernel: JITFunction):
        self.kernel = kernel
        self.entries: dict[tuple, _Entry] = {}
        self.plain: dict[int, bool] = {}
        self.backend = None
        # The kernel's used_global_vals when last found unchanged, and the immutable objects
        # its names were bound to then (None: some value is mutable, compare every call).
        self.globals_seen = None
        self.globals_live: tuple | None = None

    def plain_upto(self, nargs: int) -> bool:
        plain = self.plain.get(nargs)
        if plain is None:
            params = self.kernel.params
            plain = nargs <= len(params) and not any(
                p.is_constexpr or p.is_const or p.do_not_specialize or p.do_not_specialize_on_alignment
                or p.annotation_type for p in params[:nargs])
            self.plain[nargs] = plain
        return plain


class _Entry:
    """One stored launch: the compiled kernel, what its launcher takes besides the grid,
    stream and positional arguments, and Triton's key for the call that stored it."""

    __slots__ = ("compiled", "call", "function", "head", "tail", "triton_key")

    def __init__(self, compiled, tail: tuple, triton_key: str):
        launcher = compiled.run  # CudaLauncher; loads the binary on first use
        self.compiled = compiled
        self.function = compiled.function
        self.tail = tail
        self.triton_key = triton_key
        if not hasattr(launcher, "launch") or launcher.global_scratch_size or launcher.profile_scratch_size:
            # CudaLauncher.__call__ allocates the scratch buffers per launch (and is the
            # only entry point of other drivers' launchers).
            self.call = launcher
            self.head = (compiled.packed_metadata, None, None, None)
        else:
            # Triton's descriptor expansion with the encoded CUtensorMaps kept
            # (launch_descriptors.py); the C launcher as it is for kernels without descriptors.
            self.call = descriptor_launch(launcher.launch)
            if self.call.__class__ is DescriptorLaunch:
                self.call.verify = CHECK
            self.head = (launcher.launch_cooperative_grid, launcher.launch_pdl, None, None,
                         compiled.packed_metadata, None, None, None)


_kernels: dict[int, _Kernel] = {}
# Triton's current device and stream getters, resolved at the first launch (no driver on CPU; a
# CPU model on a GPU machine initialises no CUDA context for them).
_current_device = None
_current_stream = None


def _native_key(state: _Kernel, device: int, x: Any, is_const=False, specialize=True, align=True):
    if state.backend is None:
        state.backend = state.kernel.device_caches[device][3]
    from triton._C.libtriton import native_specialize_impl
    return ("native", native_specialize_impl(state.backend, x, is_const, specialize, align))


def args_key(state: _Kernel, device: int, args: tuple) -> tuple[tuple, tuple] | None:
    """``(key, launch_args)`` of the positional arguments, or None where a call is not keyed.

    ``launch_args`` are ``args`` with each tensor of a flag-free parameter replaced by its
    data pointer: the C launcher then takes the int as it is, without calling ``data_ptr()``
    again and asking the driver about the pointer (``cuPointerGetAttribute``, which is how
    Triton refuses CPU tensors: the key holds ``is_cuda`` for that, and a key with a CPU
    tensor is never stored since Triton's launch raises for it)."""
    if not state.plain_upto(len(args)):
        key = _flagged_args_key(state, device, args)
        return None if key is None else (key, args)
    # Flat: a tensor adds its dtype and a code (16-byte aligned + 2 * is_cuda), anything else
    # one part (only tensors add dtypes, so the parts split back into arguments one way only).
    key = []
    append = key.append
    launch_args = list(args)
    for i, x in enumerate(args):
        c = x.__class__
        if c is int:
            if x == 1:
                append("one")
            elif -_I32 <= x < _I32:
                append(not x & 15)  # int_key's value, without the call
            else:
                k = int_key(x)
                if k is None:
                    return None
                append(k)
        elif c is _Tensor or c is _Parameter:
            ptr = x.data_ptr()
            append(x.dtype)
            append((not ptr & 15) + 2 * x.is_cuda)
            launch_args[i] = ptr
        elif c is float or c is bool or x is None:
            append(c)
        elif c is _TensorDescriptor and x.base.__class__ in _TENSORS:
            # What native_specialize_impl reads of a host descriptor in Triton 3.6 (its
            # "tensordesc<dtype[block]>"): the base's dtype and the block shape; a tuple
            # after a dtype tells it from a tensor's int code.
            block = x.block_shape
            append(x.base.dtype)
            append(block if block.__class__ is tuple else tuple(block))
        else:
            try:
                append(_native_key(state, device, x))
            except (TypeError, OverflowError):
                return None  # Triton's path raises its own error
    return tuple(key), launch_args


def _flagged_args_key(state: _Kernel, device: int, args: tuple) -> tuple | None:
    if len(args) > len(state.kernel.params):
        return None
    key = []
    for x, p in zip(args, state.kernel.params):
        if p.is_constexpr:
            k = value_key(x)
            if k is None:
                return None
            key.append(("constexpr", k))
        else:
            try:
                key.append(_native_key(state, device, x, p.is_const, not p.do_not_specialize,
                                       not p.do_not_specialize_on_alignment))
            except (TypeError, OverflowError):
                return None
    return tuple(key)


def kwargs_key(kw: dict) -> tuple | None:
    """Key of the keyword arguments (names, types, values), or None if one is not keyed."""
    values = tuple(kw.values())
    types = tuple(map(type, values))
    if _BY_VALUE.issuperset(types):
        return (tuple(kw), values, types)
    if (_BY_VALUE | _BY_REPR).issuperset(types):
        # By repr alone: it tells -0.0 from 0.0, and a NaN's equals the next NaN's.
        return (tuple(kw), types, tuple(map(repr, values)))
    return None


def _hooks_active() -> bool:
    rt = knobs.runtime
    for hook in (rt.launch_enter_hook, rt.launch_exit_hook):
        if hook is not None and (hook.__class__ is not HookChain or hook.calls):
            return True
    return False


def _globals_changed(kernel: JITFunction) -> bool:
    """Triton's check: a global the kernel read at compile time is now bound to another value."""
    missing = _globals_changed
    for (name, _), (val, globals_dict) in kernel.used_global_vals.items():
        if globals_dict.get(name, missing) != val:
            return True
    return False


_IMMUTABLE = frozenset({int, float, bool, str, _NoneType, tl.dtype})


def _immutable(v: Any) -> bool:
    if v.__class__ is tl.constexpr:
        v = v.value
    return v.__class__ in _IMMUTABLE


def _globals_unchanged(state: _Kernel, kernel: JITFunction) -> bool:
    """``not _globals_changed(kernel)``, by identity while every name is still bound to the
    same immutable object it was bound to when last compared (what a constexpr global is)."""
    used = kernel.used_global_vals
    live = state.globals_live
    if state.globals_seen is used and live is not None:
        for globals_dict, name, obj in live:
            if globals_dict.get(name, _globals_changed) is not obj:
                break
        else:
            return True
    if _globals_changed(kernel):
        return False
    bound = tuple((d, name, d.get(name)) for (name, _), (_, d) in used.items())
    state.globals_seen = used
    state.globals_live = bound if all(_immutable(obj) for _, _, obj in bound) else None
    return True


def _triton_key(kernel: JITFunction, device: int, args: tuple, kw: dict):
    """Triton's own cache key of a call, as ``JITFunction.run`` computes it, with the bound
    arguments and the kernel cache it looks the key up in."""
    kw = dict(kw)
    kw["debug"] = kw.get("debug", kernel.debug) or knobs.runtime.debug
    kw["instrumentation_mode"] = knobs.compilation.instrumentation_mode
    kernel_cache, kernel_key_cache, _, _, binder = kernel.device_caches[device]
    bound_args, specialization, options = binder(*args, **kw)
    return compute_cache_key(kernel_key_cache, specialization, options), bound_args, kernel_cache


def launch(kernel: JITFunction, grid: tuple, *args: Any, **kw: Any) -> None:
    """``kernel[grid](*args, **kw)``, through the stored compiled kernel when this call's
    key was seen before (module docstring)."""
    if not ENABLED or grid.__class__ is not tuple or torch.compiler.is_compiling():
        kernel[grid](*args, **kw)
        return
    state = _kernels.get(id(kernel))
    if state is None:
        if not isinstance(kernel, JITFunction):  # stand-ins (benchmarks), autotuners
            kernel[grid](*args, **kw)
            return
        # The state keeps the kernel alive, so its id is never reused by another.
        state = _kernels[id(kernel)] = _Kernel(kernel)
    rt = knobs.runtime
    enter, exit_ = rt.launch_enter_hook, rt.launch_exit_hook
    if kernel.pre_run_hooks or not (enter.__class__ is HookChain and not enter.calls
                                    and exit_.__class__ is HookChain and not exit_.calls) and _hooks_active():
        kernel[grid](*args, **kw)
        return
    if _current_device is None:
        _resolve_driver()
    device = _current_device()
    kw_key = kwargs_key(kw) if kw else ()
    keyed = args_key(state, device, args) if kw_key is not None else None
    if keyed is None:
        _slow(kernel, grid, args, kw)
        return
    key = (device, rt.debug, knobs.compilation.instrumentation_mode, kw_key, keyed[0])
    entry = state.entries.get(key)
    if entry is None or (kernel.used_global_vals and not _globals_unchanged(state, kernel)):
        _store(state, key, kernel, grid, device, args, kw)
        return
    if CHECK:
        _check(kernel, entry, device, args, kw)
    n = len(grid)
    entry.call(grid[0], grid[1] if n > 1 else 1, grid[2] if n > 2 else 1,
               _current_stream(device), entry.function, *entry.head, *keyed[1], *entry.tail)


def _resolve_driver():
    global _current_device, _current_stream
    from triton.runtime import driver
    _current_stream = driver.active.get_current_stream
    _current_device = driver.active.get_current_device


def _slow(kernel: JITFunction, grid: tuple, args: tuple, kw: dict):
    if CHECK:
        counts["triton"] += 1
    return kernel[grid](*args, **kw)


def _store(state: _Kernel, key: tuple, kernel: JITFunction, grid: tuple, device: int, args: tuple, kw: dict):
    """Launch through Triton, then keep its compiled kernel under ``key`` (when Triton
    returned one and its own cache holds that kernel under the call's key)."""
    compiled = _slow(kernel, grid, args, kw)
    if compiled is None or hasattr(compiled, "result") or len(state.entries) >= MAX_KEYS_PER_KERNEL:
        return
    triton_key, bound_args, kernel_cache = _triton_key(kernel, device, args, kw)
    if kernel_cache.get(triton_key) is not compiled:
        return
    tail = tuple(bound_args.values())[len(args):]
    state.entries[key] = _Entry(compiled, tail, triton_key)


def _check(kernel: JITFunction, entry: _Entry, device: int, args: tuple, kw: dict):
    counts["fast"] += 1
    if entry.call.__class__ is DescriptorLaunch:
        entry.call.verify = True  # kept CUtensorMaps compared with fresh ones
    triton_key, bound_args, kernel_cache = _triton_key(kernel, device, args, kw)
    if triton_key != entry.triton_key or kernel_cache.get(triton_key) is not entry.compiled:
        raise LaunchKeyMismatch(
            f"{kernel.fn.__qualname__}: this call's Triton key {triton_key!r} differs from the "
            f"stored {entry.triton_key!r}")
    if tuple(bound_args.values())[len(args):] != entry.tail:
        raise LaunchKeyMismatch(f"{kernel.fn.__qualname__}: keyword/default arguments differ from the stored ones")
