"""Argument checks shared by the ops: each error names the argument, what was given and
what was expected, and is raised on the host before anything is launched.

Under ``torch.compile`` a check runs while dynamo traces. What the trace knows (shapes, dtypes, a
list's values) is checked then, and a failure is raised by the compiled graph (``bad_input``), with
eager's message: a value that may be symbolic (a row count after a recompile, under
``dynamic=True``) reaches a message through ``shown``. What only the data knows (a tensor's split
sizes) is checked by the compiled graph when it runs, by eager's own check
(``kernels/run_time_check.py``): a ``ValueError`` naming the values for a CPU tensor, the device
assert eager makes (no host sync) for a device one.
"""

from __future__ import annotations

import operator
import os
from collections.abc import Iterable
from typing import Any

import torch

from fuseops.kernels.custom_op import fuseops_op
from fuseops.kernels.dispatch import Kernel, launcher
from fuseops.kernels.run_time_check import registered, run_time_check
from fuseops.ops.contract import TensorSpec

FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)
_ERRORS = {"ValueError": ValueError, "TypeError": TypeError}


@fuseops_op("bad_input(str error, str message) -> ()")
def _raise_bad_input(error: str, message: str) -> None:
    raise _ERRORS[error](message)


@torch.library.register_fake("fuseops::bad_input")
def _(error: str, message: str) -> None:
    return None


# An operator with no output is dead code to AOTAutograd and Inductor unless marked.
torch.fx.node.has_side_effect(_raise_bad_input)


def bad_input(error: ValueError | TypeError) -> None:
    """Raise ``error``, a failed check's. While torch.compile traces, the compiled graph raises it
    instead, when it runs, and tracing goes on (the caller carries on with a stand-in): dynamo
    turns a raise in traced code into a graph break, which under ``fullgraph=True`` reaches the
    user as ``torch._dynamo.exc.Unsupported`` ("Observed exception") in place of the error."""
    if not torch.compiler.is_compiling():
        raise error
    # By isinstance, not ``type(error).__name__``: torch 2.11's dynamo cannot hand a class's
    # ``__name__`` to an operator.
    _raise_bad_input("TypeError" if isinstance(error, TypeError) else "ValueError", str(error))


def refused_while_tracing(error: ValueError | TypeError, stand_in: Any) -> Any:
    """A check that failed while torch.compile traces: the compiled graph raises ``error`` as
    its first step (``bad_input``), and the trace goes on with ``stand_in`` in place of the
    result (never computed: the graph raises before anything reads it). Eagerly, raises."""
    bad_input(error)
    return stand_in


def shown(value: Any) -> Any:
    """``value`` (an int, or a shape, list or tuple of them) for a message: ints as Python ints,
    a sequence as a list. While torch.compile traces, a size may be symbolic, and dynamo cannot
    format one (``torch._dynamo.exc.Unsupported``); ``operator.index`` makes it a constant,
    guarding only the failing trace on its value (the trace of a good call formats nothing)."""
    if isinstance(value, (list, tuple)):  # torch.Size too
        return [shown(v) for v in value]
    if isinstance(value, (int, torch.SymInt)) and not isinstance(value, bool):
        return operator.index(value)
    return value


def positive_int(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{name}: expected a positive int, got {value!r}")
    return value


def flag(name: str, value: Any) -> bool:
    """A bool argument: ``bool(value)`` would take "no" or a tensor as a flag."""
    if not isinstance(value, bool):
        raise TypeError(f"{name}: expected True or False, got {value!r}")
    return value


def probability(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value < 1.0:
        raise ValueError(f"{name}: expected a float in [0, 1), got {value!r}")
    return float(value)


def choice(name: str, value: Any, valid: Iterable[str]) -> str:
    valid = tuple(valid)
    if value not in valid:
        raise ValueError(f"{name}: expected one of {', '.join(map(repr, valid))}, got {value!r}")
    return value


def float_dtype(name: str, dtype: torch.dtype | None) -> torch.dtype | None:
    if dtype is not None and dtype not in FLOAT_DTYPES:
        raise TypeError(f"{name}: expected float32, float16, bfloat16 (or float64), got {dtype}")
    return dtype


def same_device(a: torch.device, b: torch.device) -> bool:
    if a == b:
        return True
    if a.type != b.type:
        return False
    if a.type != "cuda":
        return True
    current = torch.cuda.current_device() if torch.cuda.is_available() else 0
    return (a.index if a.index is not None else current) == (b.index if b.index is not None else current)


def features(op: str | torch.nn.Module, spec: TensorSpec, expected: int, *, what: str = "input") -> None:
    """The last dim of the input must be ``expected``; ``op``: its name, or the op (named by
    its class)."""
    if len(spec.shape) == 0 or spec.shape[-1] != expected:
        raise ValueError(
            f"{_name(op)} {what}: expected shape [..., {expected}], got {shown(spec.shape)}"
        )


def _name(op: str | torch.nn.Module) -> str:
    # Only on the way to an error: read in a torch.compile trace, each op's class name costs
    # guards (the same class reached from several ops) on every call.
    return op if isinstance(op, str) else type(op).__name__


def matches_parameters(op: torch.nn.Module, spec: TensorSpec, *, what: str = "input") -> None:
    """The input must have the dtype and device of the op's parameters; under
    ``torch.autocast`` any of float32/float16/bfloat16 meets any of them (the op casts)."""
    eligible = (torch.float32, torch.float16, torch.bfloat16)
    for pname, p in op._parameters.items():
        if p is None:
            continue
        autocast_casts = spec.autocast is not None and p.dtype in eligible and spec.dtype in eligible
        if p.dtype != spec.dtype and not autocast_casts:
            name = _name(op)
            raise TypeError(
                f"{name} {what}: dtype {spec.dtype} does not match {name}.{pname} ({p.dtype}); "
                f"expected {p.dtype} (convert the model with .to(dtype) or the input, or run "
                f"under torch.autocast)"
            )
        if not same_device(p.device, spec.device):
            name = _name(op)
            raise ValueError(
                f"{name} {what}: device {spec.device} does not match {name}.{pname} "
                f"({p.device}); expected a tensor on {p.device}"
            )


def parameter_shapes(op: torch.nn.Module, expected: dict[str, tuple[int, ...]]) -> None:
    """Each named parameter (when present) has the shape the op was built with: a
    ``param.data = t`` of another shape keeps the parameter and would reach the kernels."""
    for pname, shape in expected.items():
        p = op._parameters.get(pname)
        if p is not None and tuple(p.shape) != shape:
            raise ValueError(
                f"{_name(op)}.{pname}: shape {tuple(shown(p.shape))} does not match the op's features; "
                f"expected {shape}"
            )


def extra_tensor(
    op: str,
    name: str,
    value: Any,
    spec: TensorSpec,
    shape: tuple[int, ...],
    *,
    dtypes: tuple[torch.dtype, ...] | None = None,
) -> None:
    """An extra-input tensor must be on the input's device with the given shape."""
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{op} {name}: expected a torch.Tensor, got {type(value).__name__}")
    if tuple(value.shape) != tuple(shape):
        raise ValueError(f"{op} {name}: expected shape {shown(shape)}, got {shown(value.shape)}")
    allowed = dtypes if dtypes is not None else (spec.dtype,)
    if value.dtype not in allowed:
        expected = " or ".join(str(d) for d in allowed)
        raise TypeError(f"{op} {name}: expected dtype {expected}, got {value.dtype}")
    if not same_device(value.device, spec.device):
        raise ValueError(
            f"{op} {name}: expected a tensor on the input's device {spec.device}, got {value.device}"
        )


# ``os.environ``'s own table of encoded names and values: every call asks for the flag, and
# ``os.environ.get`` costs four Python frames a read. Setting the
# variable through ``os.environ`` (``monkeypatch.setenv`` too) updates this table; where the
# platform's ``os.environ`` has none, ``os.environ.get`` reads it.
_ENVIRON_TABLE = getattr(os.environ, "_data", None)
try:
    _DEBUG_NAME, _ON = os.environ.encodekey("FUSEOPS_DEBUG"), os.environ.encodevalue("1")  # type: ignore[attr-defined]
except AttributeError:
    _ENVIRON_TABLE = None


def debug_checks_enabled() -> bool:
    """``FUSEOPS_DEBUG=1`` turns on checks that read device data (and so sync the host)."""
    if _ENVIRON_TABLE is not None:
        return _ENVIRON_TABLE.get(_DEBUG_NAME) == _ON
    return os.environ.get("FUSEOPS_DEBUG", "0") == "1"


SPLIT_SIZE_VALUES = "split_sizes"  # the run-time check of a tensor's sizes (kernels/run_time_check.py)


def split_sizes(name: str, value: Any, groups: int, rows: int, device: torch.device) -> None:
    """Split sizes: G non-negative ints summing to ``rows``, as a list, a tuple or a 1-D integer
    tensor on the CPU or ``device``. Checked here: the form, a list's values and, eagerly, a CPU
    tensor's (a device tensor's too with ``FUSEOPS_DEBUG=1``: a host sync). Left to the device
    (``sizes_asserted``): a device tensor's values eagerly, at every call (``GroupedLinear.offsets``).
    Under torch.compile a failure the trace sees is the compiled graph's (``bad_input``; the forward
    then carries on with a stand-in: ``usable_split_sizes``), and a tensor's values are checked by
    the compiled graph when it runs, as eagerly (``split_size_values``, or ``sizes_asserted``)."""
    if isinstance(value, torch.Tensor):
        if value.dim() != 1 or value.shape[0] != groups:
            return bad_input(ValueError(f"{name}: expected shape [{groups}], got {shown(value.shape)}"))
        if not _integer(value):
            return bad_input(TypeError(f"{name}: expected an integer dtype, got {value.dtype}"))
        if value.device.type != "cpu" and not same_device(value.device, device):
            return bad_input(ValueError(
                f"{name}: expected a CPU tensor or one on the input's device {device}, got {value.device}"))
        if torch.compiler.is_compiling():
            # While tracing, no tensor's values are known, a CPU one's neither.
            return run_time_check(SPLIT_SIZE_VALUES, value, rows, name)
        if value.device.type != "cpu" and not debug_checks_enabled():
            return None
        return split_size_values(name, value.tolist(), rows)
    if isinstance(value, (list, tuple)):
        if len(value) != groups:
            return bad_input(ValueError(f"{name}: expected {groups} sizes, got {len(value)}: {shown(value)}"))
        if not _ints(value):
            return bad_input(TypeError(f"{name}: expected ints, got {[type(s).__name__ for s in value]}"))
        return split_size_values(name, list(value), rows)
    return bad_input(TypeError(
        f"{name}: expected a list, tuple or integer tensor of {groups} sizes, got {type(value).__name__}"))


def split_size_values(name: str, sizes: list[int], rows: int) -> None:
    """The sizes are >= 0 and sum to ``rows``."""
    if any(s < 0 for s in sizes):
        return bad_input(ValueError(f"{name}: expected non-negative sizes, got {shown(sizes)}"))
    if sum(sizes) != rows:
        return bad_input(ValueError(f"{name}: expected sizes summing to the {shown(rows)} input rows, "
                                    f"got {shown(sizes)} (sum {shown(sum(sizes))})"))
    return None


@registered(SPLIT_SIZE_VALUES)
def _split_size_values_at_run_time(sizes: torch.Tensor, rows: int, name: str, what: str) -> None:
    """A tensor's split sizes checked as an eager call checks them: read on the CPU (and with
    ``FUSEOPS_DEBUG=1``), asserted on the device otherwise."""
    if sizes.device.type == "cpu" or debug_checks_enabled():
        split_size_values(name, sizes.tolist(), rows)
    else:
        sizes_asserted(name, sizes, rows)


def usable_split_sizes(value: Any, groups: int) -> bool:
    """Whether ``value`` has a form the kernels take (G ints, or a 1-D integer tensor of G). A
    traced forward replaces split sizes without one by a stand-in: ``split_sizes`` made the
    compiled graph raise before they would be used."""
    if isinstance(value, torch.Tensor):
        return value.dim() == 1 and value.shape[0] == groups and _integer(value)
    return isinstance(value, (list, tuple)) and len(value) == groups and _ints(value)


def sizes_asserted(name: str, sizes: torch.Tensor, rows: int) -> torch.Tensor:
    """int64 [G + 1] group offsets of ``sizes``, and ``sizes`` >= 0 summing to ``rows`` asserted
    on their device without a host sync (one launch makes both): on CUDA the next synchronising
    call raises (a device-side assert, which leaves the CUDA context unusable), on the CPU this
    call raises ``RuntimeError``. Never while torch.compile traces (``run_time_check``): a
    symbolic row count would not print."""
    offsets, ok = launcher(Kernel.CHECKED_GROUP_OFFSETS, sizes)(sizes, rows)
    torch._assert_async(ok, f"{name}: expected non-negative sizes summing to the {rows} input rows")
    return offsets


def _integer(t: torch.Tensor) -> bool:
    return not (t.is_floating_point() or t.is_complex() or t.dtype == torch.bool)


def _ints(values: Iterable[Any]) -> bool:
    return all(isinstance(s, int) and not isinstance(s, bool) for s in values)


def main_grad(weight: torch.nn.Parameter) -> torch.Tensor:
    """``weight.main_grad``: the caller's float32 buffer of the weight's shape."""
    buf = getattr(weight, "main_grad", None)
    if buf is None or buf.dtype != torch.float32 or buf.shape != weight.shape:
        got = None if buf is None else f"{buf.dtype} {shown(buf.shape)}"
        raise ValueError(
            f"weight.main_grad: expected a float32 tensor of shape {shown(weight.shape)} "
            f"(allocated by the caller) with accumulate_into_main_grad=True, got {got}"
        )
    return buf
