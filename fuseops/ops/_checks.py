"""Argument checks shared by the ops: each error names the argument, what was given and
what was expected, and is raised on the host before anything is launched."""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any

import torch

from fuseops.ops.contract import TensorSpec

FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)


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
            f"{_name(op)} {what}: expected shape [..., {expected}], got {list(spec.shape)}"
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
                f"{_name(op)}.{pname}: shape {tuple(p.shape)} does not match the op's features; "
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
        raise ValueError(f"{op} {name}: expected shape {list(shape)}, got {list(value.shape)}")
    allowed = dtypes if dtypes is not None else (spec.dtype,)
    if value.dtype not in allowed:
        expected = " or ".join(str(d) for d in allowed)
        raise TypeError(f"{op} {name}: expected dtype {expected}, got {value.dtype}")
    if not same_device(value.device, spec.device):
        raise ValueError(
            f"{op} {name}: expected a tensor on the input's device {spec.device}, got {value.device}"
        )


# ``os.environ``'s own table of encoded names and values: every replayed call asks for the flag
# (issue 20's host path), and ``os.environ.get`` costs four Python frames a read. Setting the
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


def split_sizes(name: str, value: Any, groups: int, rows: int, device: torch.device) -> None:
    """Split sizes: G non-negative ints summing to ``rows`` (device tensors, and any tensor
    under torch.compile: shape and dtype only, unless debug checks are on)."""
    if isinstance(value, torch.Tensor):
        if value.dim() != 1 or value.shape[0] != groups:
            raise ValueError(f"{name}: expected shape [{groups}], got {list(value.shape)}")
        if value.is_floating_point() or value.is_complex() or value.dtype == torch.bool:
            raise TypeError(f"{name}: expected an integer dtype, got {value.dtype}")
        if value.device.type != "cpu" and not same_device(value.device, device):
            raise ValueError(f"{name}: expected a CPU tensor or one on the input's device {device}, got {value.device}")
        if value.device.type != "cpu" and not debug_checks_enabled():
            return
        # Under torch.compile a tensor's values are not known while tracing: a CPU tensor is
        # checked as a device one is.
        if torch.compiler.is_compiling():
            return
        sizes = value.tolist()
    elif isinstance(value, (list, tuple)):
        if len(value) != groups:
            raise ValueError(f"{name}: expected {groups} sizes, got {len(value)}")
        if not all(isinstance(s, int) and not isinstance(s, bool) for s in value):
            raise TypeError(f"{name}: expected ints, got {[type(s).__name__ for s in value]}")
        sizes = list(value)
    else:
        raise TypeError(f"{name}: expected a list, tuple or integer tensor of {groups} sizes, got {type(value).__name__}")
    if any(s < 0 for s in sizes):
        raise ValueError(f"{name}: expected non-negative sizes, got {sizes}")
    if sum(sizes) != rows:
        raise ValueError(f"{name}: expected sizes summing to the {rows} input rows, got {sizes} (sum {sum(sizes)})")


def main_grad(weight: torch.nn.Parameter) -> torch.Tensor:
    """``weight.main_grad``: the caller's float32 buffer of the weight's shape."""
    buf = getattr(weight, "main_grad", None)
    if buf is None or buf.dtype != torch.float32 or buf.shape != weight.shape:
        got = None if buf is None else f"{buf.dtype} {list(buf.shape)}"
        raise ValueError(
            f"weight.main_grad: expected a float32 tensor of shape {list(weight.shape)} "
            f"(allocated by the caller) with accumulate_into_main_grad=True, got {got}"
        )
    return buf
