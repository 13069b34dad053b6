"""Replay of a recorded plan run: the host path without the ops' Python (issue 20).

A ``Prepared`` run (``prepared.py``) fixes everything a call decides from its signature, but
each call still walks the ops' forward and backward in Python: contexts, launch planning,
grids, descriptors, dispatch. All of that gives the same answer for the same signature and the
same input layout, and none of it reads device data on the grouped path. So the second call of
a layout is *recorded*: every aten op (through a ``TorchDispatchMode``) and every Triton launch
(through ``fuseops.kernels.launch.recording``) it issues, with each tensor argument named by
where it came from: a Function input (the input, an extra input, a parameter, a saved
activation, a gradient) or an earlier op's output. The record becomes one straight-line Python
function (as ``torch.fx`` generates code): later calls of that layout run it, re-issuing the
same ops and launches on their own tensors: aten ops through torch's own Python bindings (where
a meta probe shows they dispatch the same overload), launches whose Triton specialization the
layout fixes straight into the stored C entry point (``launch.bound``; tensor descriptors as
their kept expansions, looked up by the base's address: ``DescriptorLaunch.expansion``), the
others through ``launch``. Outputs are fresh tensors each call; saved activations still cross
``save_for_backward`` (version checks, saved-tensor hooks and offload see them as before).

The executor runs a program with torch's autocast off, as its ops ran when recorded (their casts
are explicit; under the caller's autocast torch would cast its aten ops again).

On the GPU a program whose host work outlasts its GPU work is replayed as one CUDA graph
(``graphed.py``): the recording notes what a graph could not repeat (random ops, writes into
an input, save notices) and splits the weight cache's copies off into a prologue.

A layout is the call's signature (the ``Prepared`` run) plus every input tensor's shape (a
compiled ``Sequential``'s run serves every size of a dynamic trace), strides and 16-byte
alignment, ``torch.are_deterministic_algorithms_enabled()`` and the launch state
(``launch.direct_state``: fast launches, checks, hooks, the current device); for backward also
which gradients are None and whether the graph is freed after it
(``saved_state.graph_freed_after_backward``).

A recording is refused where replaying could differ from running the ops; that direction
(forward or backward) of the ``Prepared`` run then keeps the full path, for every layout (what
refuses is what the ops do, not the layout):

- an op reads a tensor made outside the call (a main-grad buffer, a cached constant): the
  record cannot name it. Copies from the weight cache (``fuseops.quant.weight_cache.derived``:
  a float32 weight's cast under autocast) are the exception: the program asks the cache again at
  every call (``_DerivedRecorder``), which remakes a copy whose weight changed; so are tensors
  marked ``persistent`` (kept for the process: the MoE range-check flags), held as constants;
- an op's output shape or a Python value depends on tensor data: aten ops tagged
  ``dynamic_output_shape`` or ``data_dependent_output`` (``nonzero``, ``bincount``, ``.item()``),
  indexing by a boolean mask, or a host read (``tolist``, ``numpy``, ``bool``, ``int``,
  ``float``) of any tensor but an integer CPU input, whose values the signature holds;
- an argument the record cannot hold as a constant (a stream, an object of another kind).

A host-side action on tensors that no dispatch mode sees (freeing a dead tensor's storage:
``untyped_storage().resize_(0)``) goes through ``effect``, which a recording turns into a line of
the program (never graphed then).

Under a registered save receiver (offload's early notice, ``save_notice.py``) the recorded
call hands the receiver its notices as usual, and the program repeats each as a call of its
``notice`` argument, with this call's tensors: whether a receiver listens is part of the layout.

Not recorded at all (the full path runs): quantized recipes (their scaling state lives in
Python), torch.compile tracing, ``torch.func`` transforms, a backward that will be
differentiated again, hooks (the signature already sends those to the full path),
``FUSEOPS_DEBUG=1`` and ``FUSEOPS_REPLAY=0``.
"""

from __future__ import annotations

import dataclasses
import os
import threading
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import torch
import triton.language as tl
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes

from fuseops.kernels import launch as kernel_launch
from fuseops.kernels._triton import float32_matmul_in_tf32
from fuseops.kernels.launch_descriptors import DescriptorLaunch
from fuseops.ops._checks import debug_checks_enabled
from fuseops.ops.executor import graphed
from fuseops.quant import weight_cache

ENABLED: bool = os.environ.get("FUSEOPS_REPLAY", "1") != "0"
# Calls of each kind, and why recordings were refused (the tests read them).
counts: dict[str, int] = {"recorded": 0, "replayed": 0, "refused": 0}
refusals: dict[str, int] = {}
# Layouts kept per Prepared run and direction; beyond, new layouts take the full path.
MAX_LAYOUTS = 16

_CONSTANT_LEAVES = (int, float, bool, str, complex, type(None), type(...), torch.dtype, torch.device,
                    torch.layout, torch.memory_format, tl.dtype, tl.constexpr)
_DYNAMIC = (torch.Tag.dynamic_output_shape, torch.Tag.data_dependent_output)
_DETACH = torch.ops.aten.detach.default
# Ops that return a new tensor of their own (a factory function's result).
_ALLOCATING = frozenset({"empty", "empty_like", "empty_strided", "zeros", "zeros_like", "ones", "ones_like",
                         "full", "full_like", "new_empty", "new_zeros", "new_ones", "new_full"})
# Tensor methods that hand tensor data to Python (torch's Python wrappers and the C methods).
_HOST_READS = frozenset(getattr(owner, name) for owner in (torch.Tensor, torch._C.TensorBase)
                        for name in ("tolist", "item", "numpy", "__bool__", "__int__", "__float__", "__index__",
                                     "__complex__") if hasattr(owner, name))


# Tensors that live as long as the process (``persistent``), by id: a program may hold them.
_PERSISTENT: dict[int, torch.Tensor] = {}
# The recording now running (``record``), for ``effect``; None outside one.
_effects: _EffectRecorder | None = None


def persistent(t: torch.Tensor) -> torch.Tensor:
    """Mark ``t`` as living for the rest of the process (a kept flag): a recorded program that
    reads it holds it as a constant, where any other tensor made outside the call refuses the
    recording. Returns ``t``."""
    _PERSISTENT[id(t)] = t
    return t


def effect(fn: Callable[..., None], *tensors: torch.Tensor) -> None:
    """``fn(*tensors)``: a host-side action on tensors that no dispatch mode sees (freeing a
    dead tensor's storage early: ``untyped_storage().resize_(0)``). A call being recorded
    repeats it in its program, on that call's tensors (such a program is never graphed)."""
    recorder = _effects
    if recorder is not None:
        recorder(fn, tensors)
    else:
        fn(*tensors)


class NotRecordable(Exception):
    """What a call did that a recorded program cannot repeat (the module docstring)."""


def holds_tensors(value: Any) -> bool:
    """Whether ``value`` is or holds a tensor: itself, a quantized storage (``data_tensors``),
    or a tuple or list of them, at any depth."""
    if isinstance(value, torch.Tensor) or hasattr(value, "data_tensors"):
        return True
    return isinstance(value, (tuple, list)) and any(holds_tensors(v) for v in value)


class _Kernel:
    """A launch's kernel among its arguments: a constant of any type."""

    __slots__ = ("kernel",)

    def __init__(self, kernel: Any) -> None:
        self.kernel = kernel


class _Names:
    """Expressions for the values a recorded call handles: tensors by name, constants bound
    in the generated function's namespace."""

    def __init__(self) -> None:
        # By id, each tensor's name and a weak reference to it: holding the tensors would keep
        # every intermediate of the recorded call alive to its end (a higher peak), and an id
        # may be reused once its tensor is freed, which the reference tells.
        self.names: dict[int, tuple[str, weakref.ref]] = {}
        self.count = 0
        self.namespace: dict[str, Any] = {"launch": kernel_launch.launch, "stream": kernel_launch.current_stream}
        self.lines: list[str] = []
        self.host_readable: set[int] = set()
        self.refused: str | None = None
        # Depth of recorded ops (and launches) now running: what they do inside is theirs.
        self.inside_op = 0
        # The tensor the last recorded op allocated (``_ALLOCATING``), if it did.
        self.fresh: int | None = None
        # For CUDA-graph replay (``graphed.py``): the lines that ask the weight cache (their
        # positions in ``lines`` and output names), and why a graph could not repeat the call.
        self.derived: list[tuple[int, str]] = []
        self.not_graphable: str | None = None

    def bind(self, t: torch.Tensor, name: str) -> None:
        if self.name(t) is None:
            self.names[id(t)] = (name, weakref.ref(t))
        self.count += 1

    def name(self, t: torch.Tensor) -> str | None:
        found = self.names.get(id(t))
        return found[0] if found is not None and found[1]() is t else None

    def new_value(self, t: torch.Tensor) -> str:
        name = f"v{self.count}"
        self.bind(t, name)
        return name

    def constant(self, value: Any) -> str:
        name = f"c{len(self.namespace)}"
        self.namespace[name] = value
        return name

    def expr(self, value: Any) -> str:
        if value.__class__ is _Kernel:
            return self.constant(value.kernel)
        if isinstance(value, torch.Tensor):
            name = self.name(value)
            if name is None:
                if _PERSISTENT.get(id(value)) is value:
                    return self.constant(value)
                raise NotRecordable("an op read a tensor made outside the call")
            return name
        if value.__class__ in (int, bool) or value is None:
            return repr(value)
        if isinstance(value, _CONSTANT_LEAVES):
            return self.constant(value)
        if isinstance(value, (tuple, list)):
            if not holds_tensors(value):
                return self.constant(value)
            if value.__class__ not in (tuple, list):
                raise NotRecordable(f"a {type(value).__name__} holding tensors")
            inner = ", ".join(self.expr(v) for v in value)
            return f"[{inner}]" if value.__class__ is list else f"({inner},)"
        if dataclasses.is_dataclass(value) and isinstance(getattr(value, "base", None), torch.Tensor):
            # A tensor descriptor: rebuilt over this call's tensor, its other fields as they were.
            fields = {f.name: getattr(value, f.name) for f in dataclasses.fields(value) if f.init}
            base = self.expr(fields.pop("base"))
            if any(isinstance(v, torch.Tensor) for v in fields.values()):
                raise NotRecordable(f"a {type(value).__name__} holding a second tensor")
            make = self.constant(type(value))
            kw = self.constant(fields)
            return f"{make}(base={base}, **{kw})"
        raise NotRecordable(f"an argument of type {type(value).__name__}")

    def call(self, target: str, args: Sequence[Any], kwargs: dict[str, Any]) -> str:
        parts = [self.expr(a) for a in args] + [f"{k}={self.expr(v)}" for k, v in kwargs.items()]
        return f"{target}({', '.join(parts)})"

    def direct_launch(self, b: Any, grid: tuple, args: tuple, line: str) -> str:
        """A ``launch`` (``line``) as a call of its stored C entry point (``launch.bound``):
        tensors as their data pointers, descriptors as their kept expansions (``_expansions``),
        the stream read at the call; where the kernel read globals, only while each is still
        the object it was (``line`` otherwise)."""
        dims = (*grid, 1, 1)[:3]
        expansions = _expansions(b.call, args)
        parts = []
        for i, a in enumerate(args):
            if i in b.tensors:
                parts.append(f"{self.expr(a)}.data_ptr()")
            elif expansions is not None and i in expansions:
                parts.append(f"*{self.constant(expansions[i])}({self.expr(a.base)})")
            else:
                parts.append(self.expr(a))
        call = b.call if expansions is None else b.call.raw
        head, tail = self.constant(b.head), self.constant(b.tail)
        direct = (f"{self.constant(call)}({', '.join(map(repr, dims))}, stream({b.device}), "
                  f"{self.constant(b.function)}, *{head}, {', '.join(parts)}{', ' if parts else ''}*{tail})")
        if not b.guards:
            return direct
        unchanged = " and ".join(f"{self.constant(d)}.get({name!r}) is {self.constant(obj)}"
                                 for d, name, obj in b.guards)
        return f"{direct} if {unchanged} else {line}"

    def outputs(self, out: Any) -> str:
        """The assignment target for ``out``, naming its new tensors."""
        if isinstance(out, torch.Tensor):
            return self.name(out) or self.new_value(out)
        if isinstance(out, (tuple, list)) and all(o is None or isinstance(o, torch.Tensor) for o in out):
            if not out:
                return "_"
            return ", ".join("_" if o is None else self.outputs(o) for o in out) + ","
        if out is None:
            return "_"
        raise NotRecordable(f"an op returned a {type(out).__name__} to Python")


def _expansions(call: Any, args: Sequence[Any]) -> dict[int, Callable[[torch.Tensor], list]] | None:
    """For a launcher that expands descriptors (``DescriptorLaunch``), each descriptor
    argument's expansion as a function of its base tensor (``DescriptorLaunch.expansion``), by
    argument index: the program then calls the C launcher with them in place (no descriptor
    objects built a call). None for other launchers, and where one descriptor's expansion is
    not kept (the program then passes descriptors)."""
    if call.__class__ is not DescriptorLaunch:
        return None
    found = {}
    for j, i in enumerate(call.indices):
        desc = args[i] if i < len(args) else None
        if not (dataclasses.is_dataclass(desc) and isinstance(getattr(desc, "base", None), torch.Tensor)):
            return None
        expanded = call.expansion(j, desc)
        if expanded is None:
            return None
        found[i] = expanded
    return found


class _Probe(TorchDispatchMode):
    """The aten ops a call dispatches (``_callable``)."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[Any] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.seen.append(func)
        return func(*args, **(kwargs or {}))


def _on_meta(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return torch.empty_strided(value.shape, value.stride(), dtype=value.dtype, device="meta")
    if isinstance(value, torch.device):
        return torch.device("meta")
    if value.__class__ in (list, tuple):
        return value.__class__(_on_meta(v) for v in value)
    return value


def _callable(func: Any, args: Sequence[Any], kwargs: dict[str, Any]) -> Any:
    """What a program calls for the aten op ``func``: torch's own Python binding of the same
    name (``torch.addmm``, ``Tensor.t``: parsed in C++, 1-4 us a call less than the overload's
    boxed entry point on the CPU machine) where calling it with these arguments, on meta
    tensors, dispatches exactly ``func``; else the overload's entry point."""
    name = func._schema.name
    if name.startswith("aten::") and not func._schema.overload_name.startswith("out"):
        margs, mkwargs = _on_meta(list(args)), {k: _on_meta(v) for k, v in kwargs.items()}
        for owner in (torch, torch.Tensor):
            binding = getattr(owner, name[len("aten::"):], None)
            if binding is None or not callable(binding):
                continue
            probe = _Probe()
            try:
                with probe:
                    binding(*margs, **mkwargs)
            except Exception:  # noqa: BLE001, S112 - any failure: the binding does not take these arguments
                continue
            if probe.seen == [func]:
                return binding
    # The overload's C++ entry point: one Python frame less per op than calling it.
    return getattr(func, "_op", func)


class _AtenRecorder(TorchDispatchMode):
    def __init__(self, names: _Names) -> None:
        super().__init__()
        self.n = names

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        n = self.n
        if func is _DETACH and n.refused is None and id(args[0]) == n.fresh:
            # Under a mode, a factory function's result comes back through ``detach``: the
            # replay keeps the fresh tensor itself (no one else holds it).
            out = func(*args, **kwargs)
            n.bind(out, n.name(args[0]))
            return out
        line = None
        if n.refused is None:
            try:
                if any(tag in func.tags for tag in _DYNAMIC):
                    raise NotRecordable(f"{func} has a data-dependent result")
                if func is torch.ops.aten.index.Tensor and any(
                        isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in args[1]):
                    raise NotRecordable("indexing by a boolean mask")
                line = n.call(n.constant(_callable(func, args, kwargs)), args, kwargs)
                if n.not_graphable is None:
                    n.not_graphable = _not_graphable(n, func, args, kwargs)
            except NotRecordable as why:
                n.refused = str(why)
        # What runs inside the op (a custom op's launches and host reads) is the op's own:
        # the replay calls the op, which does it again.
        n.inside_op += 1
        try:
            out = func(*args, **kwargs)
        finally:
            n.inside_op -= 1
        if line is not None and n.refused is None and not isinstance(out, (torch.Tensor, tuple, list)) \
                and out is not None and not holds_tensors((args, list(kwargs.values()))):
            # A function of constants only (``promote_types``): its value is the same every call.
            return out
        if line is not None and n.refused is None:
            try:
                n.lines.append(f"{n.outputs(out)} = {line}  # {func}")
                n.fresh = id(out) if func.__name__.split(".")[0] in _ALLOCATING else None
            except NotRecordable as why:
                n.refused = f"{why} ({func})"
        return out


class _HostReadRecorder(TorchFunctionMode):
    def __init__(self, names: _Names) -> None:
        super().__init__()
        self.n = names

    def __torch_function__(self, func, types, args=(), kwargs=None):
        n = self.n
        if (func in _HOST_READS and not n.inside_op and n.refused is None and args
                and id(args[0]) not in n.host_readable):
            n.refused = f"a host read ({func.__name__}) of a tensor"
        return func(*args, **(kwargs or {}))


class _LaunchRecorder:
    """``fuseops.kernels.launch.recording`` while a call records: notes the launch, then
    launches with the recorders off (the interpreter's own tensor work is not the call's)."""

    def __init__(self, names: _Names) -> None:
        self.n = names
        # The hook is global; the call being recorded runs on this thread. Another thread's
        # launches (a second device's backward) are not the call's.
        self.thread = threading.get_ident()

    def __call__(self, kernel: Any, grid: Any, args: tuple, kw: dict) -> None:
        if threading.get_ident() != self.thread:
            # Another thread's launch, through Triton (``launch`` would call this hook again).
            kernel[grid](*args, **kw)
            return
        n = self.n
        line = None
        if n.refused is None and not n.inside_op:
            try:
                if grid.__class__ is not tuple:
                    raise NotRecordable("a launch whose grid is not a tuple")
                line = n.call("launch", (_Kernel(kernel), grid, *args), kw)
            except NotRecordable as why:
                n.refused = str(why)
        kernel_launch.recording = None
        n.inside_op += 1
        try:
            with torch._C.DisableTorchFunction(), _disable_current_modes():
                kernel_launch.launch(kernel, grid, *args, **kw)
                direct = kernel_launch.bound(kernel, grid, args, kw) if line is not None else None
        finally:
            n.inside_op -= 1
            kernel_launch.recording = self
        if line is not None and n.refused is None:
            n.lines.append(line if direct is None else n.direct_launch(direct, grid, args, line))


class _DerivedRecorder:
    """``fuseops.quant.weight_cache.recording`` while a call records: a parameter's cached copy
    (its cast under autocast) comes from an earlier call, so the program asks the cache for it
    at every call (``derived``: the kept copy while the weight is unchanged, a new one after an
    optimizer step, ``param.data = ...`` or a load)."""

    def __init__(self, names: _Names) -> None:
        self.n = names
        self.thread = threading.get_ident()

    def __call__(self, param: torch.Tensor, kind: Any, build: Callable, enabled: bool) -> Any:
        if threading.get_ident() != self.thread:
            return weight_cache.cached_copy(param, kind, build, enabled)  # another thread's, not the call's
        n = self.n
        line = None
        if n.refused is None and not n.inside_op:
            try:
                line = (f"{n.constant(weight_cache.derived)}({n.expr(param)}, {n.constant(kind)}, "
                        f"{n.constant(build)}, enabled={enabled!r})")
            except NotRecordable as why:
                n.refused = str(why)
        n.inside_op += 1
        try:
            # A copy built now is the cache's work, not the call's (the program's line builds
            # it again where the cache no longer holds it).
            with torch._C.DisableTorchFunction(), _disable_current_modes():
                out = weight_cache.cached_copy(param, kind, build, enabled)
        finally:
            n.inside_op -= 1
        if line is not None and n.refused is None:
            try:
                target = n.outputs(out)
                n.lines.append(f"{target} = {line}")
                if isinstance(out, torch.Tensor):
                    n.derived.append((len(n.lines) - 1, target))
                else:
                    n.not_graphable = n.not_graphable or "a cached copy that is not one tensor"
            except NotRecordable as why:
                n.refused = f"{why} (a cached copy of a parameter)"
        return out


class _EffectRecorder:
    """``effect`` while a call records: the action becomes a line of the program (on the
    call's own thread, outside the ops), then runs."""

    def __init__(self, names: _Names) -> None:
        self.n = names
        self.thread = threading.get_ident()

    def __call__(self, fn: Callable[..., None], tensors: tuple) -> None:
        n = self.n
        if threading.get_ident() == self.thread and n.refused is None and not n.inside_op:
            try:
                n.lines.append(f"{n.constant(fn)}({', '.join(n.expr(t) for t in tensors)})")
                n.not_graphable = n.not_graphable or "a host-side effect"
            except NotRecordable as why:
                n.refused = f"{why} (an effect)"
        fn(*tensors)


class _NoticeRecorder:
    """What the ops notice through while a call records under a save receiver: the notice
    becomes a line of the program, and the receiver runs with the recorders off (its copies
    and events are its own, made again at every call)."""

    def __init__(self, names: _Names, receiver: Callable[[list], None]) -> None:
        self.n = names
        self.receiver = receiver

    def __call__(self, tensors: list[torch.Tensor]) -> None:
        n = self.n
        if n.refused is None and not n.inside_op:
            try:
                n.lines.append(f"notice([{', '.join(n.expr(t) for t in tensors)}])")
                n.not_graphable = n.not_graphable or "a save receiver's notices"
            except NotRecordable as why:
                n.refused = str(why)
        previous, kernel_launch.recording = kernel_launch.recording, None
        n.inside_op += 1
        try:
            with torch._C.DisableTorchFunction(), _disable_current_modes():
                self.receiver(tensors)
        finally:
            n.inside_op -= 1
            kernel_launch.recording = previous


def _not_graphable(n: _Names, func: Any, args: Sequence[Any], kwargs: dict[str, Any]) -> str | None:
    """Why a CUDA graph could not repeat the aten op ``func`` (``graphed.py``), or None: a
    random op (a graph would repeat its draws) or one that writes into a call input (a graph
    writes into its own copy of the input)."""
    if torch.Tag.nondeterministic_seeded in func.tags:
        return f"a random op ({func})"
    schema = func._schema.arguments
    for arg, value in [*zip(schema, args), *[(a, kwargs[a.name]) for a in schema if a.name in kwargs]]:
        info = arg.alias_info
        if info is not None and info.is_write and isinstance(value, torch.Tensor):
            name = n.name(value)
            if name is not None and name.startswith("a"):
                return f"an op writing into an input ({func})"
    return None


class Program:
    """A recorded run as a function of the call's tensor inputs (``run``); returns the tensors
    ``results`` listed at recording time, in that order. ``meta``: the caller's, to read them.
    ``graph``: its CUDA-graph replay (``graphed.GraphedProgram``), where one may pay."""

    # (Weakly referenced by callers that note something per program: ``compiled_sequential``.)
    __slots__ = ("__weakref__", "graph", "meta", "run", "source")

    def __init__(self, run: Callable[..., tuple], source: str) -> None:
        self.run = run
        self.source = source
        self.meta: Any = None
        self.graph: graphed.GraphedProgram | None = None


class Refusal:
    """A layout whose recording was refused, and why: its calls take the full path."""

    __slots__ = ("reason",)

    def __init__(self, reason: str) -> None:
        self.reason = reason


def record(inputs: Sequence[torch.Tensor | None], body: Callable[[Any], Any],
           results: Callable[[Any], Sequence[torch.Tensor | None]],
           host_readable: Sequence[torch.Tensor] = (), receiver: Callable[[list], None] | None = None,
           graphs: bool = True) -> tuple[Any, Program | Refusal]:
    """Run ``body(notice)`` (the ops on ``inputs``) while recording it; ``results(out)`` lists
    the tensors (or None) the program must return. Returns ``body``'s result, unchanged (the
    call's own result: a refused recording still ran the ops), and the program or why not.
    ``host_readable``: inputs whose values the signature holds. ``receiver``: a save receiver
    (``save_notice.py``); ``notice`` is then what the ops must call in its place: it calls the
    receiver and records the call, which the program repeats with its ``notice`` argument.
    ``graphs``: whether the program may be replayed as a CUDA graph (``graphed.py``)."""
    n = _Names()
    params = []
    for i, t in enumerate(inputs):
        if t is not None:
            n.bind(t, f"a{i}")
        params.append(f"a{i}")
    n.host_readable = {id(t) for t in host_readable}
    notice = None if receiver is None else _NoticeRecorder(n, receiver)
    global _effects
    previous = kernel_launch.recording, weight_cache.recording, _effects
    kernel_launch.recording, weight_cache.recording = _LaunchRecorder(n), _DerivedRecorder(n)
    _effects = _EffectRecorder(n)
    try:
        with _HostReadRecorder(n), _AtenRecorder(n):
            out = body(notice)
    finally:
        kernel_launch.recording, weight_cache.recording, _effects = previous
    with _disable_current_modes():
        try:
            listed = results(out)
        except NotRecordable as why:
            n.refused = n.refused or str(why)
            listed = ()
        program = _finish(n, params, listed)
    if not isinstance(program, Refusal):
        counts["recorded"] += 1
        if graphs:
            program.graph = graphed.for_program(program, inputs, n.not_graphable,
                                                lambda: _graph_parts(n, params, listed))
    return out, program


def refuse(reason: str) -> Refusal:
    """A refused recording, counted by reason."""
    counts["refused"] += 1
    refusals[reason] = refusals.get(reason, 0) + 1
    return Refusal(reason)


def host_readable(inputs: Sequence[Any]) -> list[torch.Tensor]:
    """The inputs whose values a call's signature holds (``fuseops.call_cache``): integer CPU
    tensors. Host reads of these repeat in a replay."""
    return [t for t in inputs if isinstance(t, torch.Tensor) and t.is_cpu and not t.is_floating_point()
            and not t.is_complex()]


def _finish(n: _Names, params: list[str], results: Sequence[torch.Tensor | None]) -> Program | Refusal:
    try:
        if n.refused is not None:
            raise NotRecordable(n.refused)
        returned = ", ".join(n.expr(t) for t in results)
    except NotRecordable as why:
        return refuse(str(why))
    body = "\n".join(f"    {line}" for line in n.lines)
    source = (f"def program({', '.join([*params, '*', 'notice=None'])}):\n{body}\n"
              f"    return ({returned}{',' if results else ''})\n")
    return Program(_compiled(n, source)["program"], source)


def _compiled(n: _Names, source: str) -> dict[str, Any]:
    namespace = dict(n.namespace)
    exec(compile(source, "<fuseops replay>", "exec"), namespace)  # noqa: S102 - our own source, from recorded ops only
    return namespace


def _graph_parts(n: _Names, params: list[str], results: Sequence[torch.Tensor | None]) -> graphed.Parts | None:
    """The program as a CUDA graph runs it (``graphed.Parts``), or None where it has nothing
    to split: every line is then the graph's. Copies from the weight cache are made before
    the graph (``prologue``) and enter it as inputs (``body``'s last arguments)."""
    if not n.derived:
        return None
    skipped = {i for i, _ in n.derived}
    names = list(dict.fromkeys(name for _, name in n.derived))  # a copy asked for twice is one input
    returned = ", ".join(n.expr(t) for t in results)
    prologue = "\n".join(f"    {n.lines[i]}" for i, _ in n.derived)
    body = "\n".join(f"    {line}" for i, line in enumerate(n.lines) if i not in skipped)
    source = (f"def prologue({', '.join(params)}):\n{prologue}\n    return ({', '.join(names)},)\n\n"
              f"def body({', '.join([*params, *names])}):\n{body}\n"
              f"    return ({returned}{',' if results else ''})\n")
    namespace = _compiled(n, source)
    return graphed.Parts(namespace["prologue"], namespace["body"], len(names), source)


def layout_key(tensors: Sequence[Any]) -> tuple:
    """What a recorded program assumed of its inputs: shape, strides and 16-byte alignment of
    each tensor (None stays None), the deterministic-algorithms flag, torch's float32 matmul
    precision (the GEMM kernels' ``F32_DOT``, cuBLAS's TF32 in a captured graph), and what its
    direct launches assumed (``launch.direct_state``). The shapes too, though an eager ``Prepared`` run
    is one signature: a compiled ``Sequential``'s serves every size of a dynamic trace
    (``compiled_sequential.py``), and a program replays the sizes it was recorded with (its
    launches' grids, its allocations): session 33 replayed T=1024's at T=4096 on the GPU."""
    return (*global_state(), kernel_launch.direct_state(),
            *[None if t is None else (t.shape, t.stride(), t.data_ptr() & 15) for t in tensors])


def global_state() -> tuple[bool, bool]:
    """The process-wide settings a recorded program or a captured graph holds: torch's
    deterministic-algorithms flag (which aten kernels run) and whether float32 matmuls run in
    TF32 (cuBLAS's, and the GEMM kernels' ``F32_DOT``). Part of every key that replays work."""
    return torch.are_deterministic_algorithms_enabled(), float32_matmul_in_tf32()


def enabled_now() -> bool:
    """Whether calls may replay or record now (the module docstring's global conditions)."""
    return ENABLED and not debug_checks_enabled()


class Layouts:
    """A ``Prepared`` run's programs, by direction and input layout: seen once (None) or
    recorded (``Program``). A direction whose recording was refused becomes None: refusals come
    from what the ops do (a host read, a tensor made outside the call), not from the layout, so
    its later calls take the full path without computing a layout key."""

    __slots__ = ("backward", "forward")

    def __init__(self) -> None:
        self.forward: dict[tuple, Program | None] | None = {}
        self.backward: dict[tuple, Program | None] | None = {}


def lookup(table: dict, key: tuple) -> Program | bool:
    """The program for ``key`` in one of a ``Layouts``' tables; True where this call should
    record it (its second), False where it should run the full path (the first, or past
    ``MAX_LAYOUTS``)."""
    found = table.get(key, False)
    if found is False:
        if len(table) < MAX_LAYOUTS:
            table[key] = None
        return False
    return True if found is None else found


def keep(layouts: Layouts, direction: str, key: tuple, program: Program | Refusal) -> None:
    """A recording's outcome for ``key`` in ``layouts``' ``direction`` ("forward" or
    "backward"): the program, or a refusal, which closes the direction."""
    if program.__class__ is Refusal:
        setattr(layouts, direction, None)
    else:
        getattr(layouts, direction)[key] = program


def replayed(program: Program, *inputs: Any, notice: Callable[[list], None] | None = None) -> tuple:
    """``program``'s results on ``inputs``, counted; ``notice``: the save receiver, for a
    program recorded under one. Through its CUDA graph where it has one (``graphed.py``)."""
    counts["replayed"] += 1
    if program.graph is not None and notice is None:
        return program.graph.run(inputs)
    return program.run(*inputs, notice=notice)
