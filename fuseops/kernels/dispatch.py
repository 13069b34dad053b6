"""The one dispatch table: which implementation serves each kernel-level operation.

Ops, fusions and the quantized GEMMs never choose between a Triton kernel, a Hopper Gluon
kernel and a torch reference themselves: they ask ``launcher(Kernel.X, t)`` and call what
it returns with the launcher's arguments. ``TABLE`` holds the choice as data, one ``Route``
a row, tried in order; ``describe()`` (or ``python -m fuseops.kernels``) prints it.

Where a tensor's work runs (``backend_of``):

- ``Backend.TORCH``: the torch reference of the same signature (``reference_*`` beside
  each launcher): CPU tensors, and float64 anywhere (the dtype of oracles).
- ``Backend.TRITON``: the Triton kernels: CUDA tensors, and CPU tensors inside
  ``interpreted_kernels()`` (the tests, through the interpreter).
- ``Backend.SM90``: CUDA on an sm_90 GPU (H100 / H200): the warp-specialized Gluon kernels
  where their row's ``when`` holds for the call's arguments (TMA-ready operands, the
  format), then the ``TRITON`` rows.

Under ``torch.compile`` every kernel is served by its torch reference, which the compiler
traces and fuses, but for those that reach the compiler as ``torch.library`` custom ops whose
implementation asks this table at run time: the grouped GEMMs (``library.py``), the MoE
routing (``moe/traceable.py``) and every ``QUANTIZED`` kernel (``quantized_ops/``, through
``quantized_launcher``; asking ``launcher`` for one while tracing is an error).

Dense GEMMs without an epilogue (``Linear``'s forward, dgrad and wgrad) are cuBLAS through
``torch`` on every backend; they have no row here. The dense forward GEMM with an epilogue
goes to cuBLAS + one elementwise kernel on sm_90 where its output is too small to fill the
GPU: ``dense_dispatch.py`` holds that measured rule (``FUSEOPS_DENSE_DISPATCH`` pins a
branch). Each family's ``__init__`` docstring says what its kernels compute, in which dtypes,
recipes and architectures.
"""

from __future__ import annotations

import contextlib
import enum
import functools
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch._C._functorch import maybe_current_level

from fuseops.kernels import dense_dispatch
from fuseops.kernels._triton import cpu_kernels_active
from fuseops.kernels.elementwise import (
    activation,
    activation_quantize,
    bias_grad,
    gated_activation,
    norm,
    norm_quantize,
)
from fuseops.kernels.gemm import (
    dense,
    dense_cublas,
    dense_gated,
    dense_scaled,
    group_offsets,
    grouped,
    grouped_gated,
    grouped_gated_bwd,
    grouped_scaled,
    grouped_scaled_act,
    grouped_scaled_dgrad_gated,
    grouped_scaled_wgrad,
    grouped_wgrad,
    traced,
)
from fuseops.kernels.hopper import blockwise, blockwise_wgrad, pipeline, tensor_scaled, tensor_scaled_wgrad, wgrad
from fuseops.kernels.moe import permute
from fuseops.kernels.quantization import amax, quantize


class Backend(enum.Enum):
    TORCH = "torch reference"
    TRITON = "triton"
    SM90 = "gluon sm_90"

    # No identity-hash override (``__hash__ = object.__hash__``) on these enums: torch 2.11's
    # dynamo refuses to hash an enum with an overridden __hash__ (graph break, and an error
    # under fullgraph=True) where launcher() runs inside the autograd Function.


class Kernel(enum.Enum):
    """Kernel-level operations, by family (the launcher's name)."""

    # elementwise/
    ACTIVATION_FWD = "activation_fwd"
    ACTIVATION_BWD = "activation_bwd"
    ACTIVATION_BWD_DBIAS = "activation_bwd_dbias"
    GATED_FWD = "gated_fwd"
    GATED_BWD = "gated_bwd"
    BIAS_GRAD = "bias_grad"
    LAYERNORM_FWD = "layernorm_fwd"
    LAYERNORM_BWD = "layernorm_bwd"
    RMSNORM_FWD = "rmsnorm_fwd"
    RMSNORM_BWD = "rmsnorm_bwd"
    ACTIVATION_QUANTIZE_FWD = "activation_quantize_fwd"
    GATED_QUANTIZE_FWD = "gated_quantize_fwd"
    LAYERNORM_QUANTIZE_FWD = "layernorm_quantize_fwd"
    RMSNORM_QUANTIZE_FWD = "rmsnorm_quantize_fwd"
    # gemm/ (and hopper/ on sm_90)
    GEMM = "gemm"
    GEMM_GATED = "gemm_gated"
    GEMM_SCALED = "gemm_scaled"
    GROUP_OFFSETS = "group_offsets"
    CHECKED_GROUP_OFFSETS = "checked_group_offsets"
    GROUPED_GEMM = "grouped_gemm"
    GROUPED_GEMM_GATED = "grouped_gemm_gated"
    GROUPED_GEMM_DGRAD_GATED = "grouped_gemm_dgrad_gated"
    GROUPED_GEMM_WGRAD = "grouped_gemm_wgrad"
    GROUPED_BIAS_GRAD = "grouped_bias_grad"
    GROUPED_GEMM_SCALED = "grouped_gemm_scaled"
    GROUPED_GEMM_SCALED_ACT = "grouped_gemm_scaled_act"
    GROUPED_GEMM_SCALED_WGRAD = "grouped_gemm_scaled_wgrad"
    GROUPED_GEMM_SCALED_DGRAD_GATED = "grouped_gemm_scaled_dgrad_gated"
    # quantization/
    AMAX = "amax"
    ROW_AMAX = "row_amax"
    TENSOR_SCALES = "tensor_scales"
    QUANTIZE = "quantize"
    # moe/
    PERMUTE = "permute"
    UNPERMUTE = "unpermute"
    UNPERMUTE_BWD = "unpermute_bwd"


@dataclass(frozen=True)
class Route:
    """One row: on ``backend``, ``runs`` serves ``kernel`` when ``when(*args, **kwargs)``
    holds for the call (``None``: always). ``why`` is the measurement or reason behind it."""

    kernel: Kernel
    backend: Backend
    runs: Callable[..., Any]
    when: Callable[..., bool] | None = None
    why: str = ""


def _launcher_and_reference(module: Any, name: str, kernel: Kernel, why: str = "") -> tuple[Route, Route]:
    return (
        Route(kernel, Backend.TRITON, getattr(module, name), None, why),
        Route(kernel, Backend.TORCH, getattr(module, f"reference_{name}"), None, "the spec; CPU and float64"),
    )


# On sm_90 the Gluon rows come first; everything else has one Triton and one torch row.
TABLE: tuple[Route, ...] = (
    Route(Kernel.GEMM, Backend.SM90, dense_cublas.gemm, dense_dispatch.prefers_cublas,
          "bf16 / fp16 x @ W^T under one wave of 128x128 output tiles, dy @ W with act'(z) under 2 (a residual: "
          "1), float32 always: cuBLAS + one elementwise kernel, 1.18-5.9x (float32 up to 10.7x) the fused kernel "
          "there (H100; the rules in dense_dispatch.py)"),
    Route(Kernel.GEMM_GATED, Backend.SM90, dense_cublas.gemm_gated, dense_dispatch.prefers_cublas_gated,
          "bf16 / fp16 x @ W^T + b with SwiGLU / GLU under 2 waves of 128x128 output tiles (3 with the "
          "pre-activation saved), float32 always: cuBLAS + the gated kernel, up to 2.4x (float32 7.2x) the "
          "fused kernel there (H100, dense_dispatch.py)"),
    Route(Kernel.GEMM_SCALED, Backend.SM90, blockwise.gemm_scaled, blockwise.serves_gemm_scaled,
          "FP8 blockwise, TMA-ready operands: 1.3-1.7x the Triton kernel (H100, 16384x4096x14336)"),
    Route(Kernel.GROUPED_GEMM_SCALED, Backend.SM90, blockwise.grouped_gemm_scaled,
          blockwise.serves_grouped_gemm_scaled,
          "FP8 blockwise, TMA-ready operands: 1.6-1.7x the Triton kernel (H100, E=8 T=16384 4096x14336)"),
    Route(Kernel.GROUPED_GEMM_SCALED, Backend.SM90, tensor_scaled.grouped_gemm_scaled,
          tensor_scaled.serves_grouped_gemm_scaled,
          "FP8 per-tensor, TMA-ready operands, bf16 / fp16 out: the ping-pong kernel, 1.01-1.04x a "
          "cooperative one that ran 1.06-1.09x the Triton kernel (H200 / H100, Qwen3-30B-A3B's forward and dgrad)"),
    Route(Kernel.GROUPED_GEMM_SCALED_WGRAD, Backend.SM90, blockwise_wgrad.grouped_gemm_scaled_wgrad,
          blockwise_wgrad.serves, "FP8 blockwise wgrad: 846-923 against 453 TFLOP/s Triton (H100, Mixtral FC1)"),
    Route(Kernel.GROUPED_GEMM_SCALED_WGRAD, Backend.SM90, tensor_scaled_wgrad.grouped_gemm_scaled_wgrad,
          tensor_scaled_wgrad.serves,
          "FP8 per-tensor wgrad: 1.07-1.11x the Triton kernel (H200, Qwen3-30B-A3B's FC1 / FC2 wgrads)"),
    Route(Kernel.GROUPED_GEMM_WGRAD, Backend.SM90, wgrad.grouped_gemm_wgrad, wgrad.serves,
          "bf16 / fp16 wgrad: 1.02-1.31x the Triton kernel (H100, 4 shapes x 2 routings); float32 dw "
          "(autocast) on the main_grad tile, not timed apart"),
    *_launcher_and_reference(activation, "activation_fwd", Kernel.ACTIVATION_FWD),
    *_launcher_and_reference(activation, "activation_bwd", Kernel.ACTIVATION_BWD),
    *_launcher_and_reference(activation, "activation_bwd_dbias", Kernel.ACTIVATION_BWD_DBIAS),
    *_launcher_and_reference(gated_activation, "gated_fwd", Kernel.GATED_FWD),
    *_launcher_and_reference(gated_activation, "gated_bwd", Kernel.GATED_BWD),
    *_launcher_and_reference(bias_grad, "bias_grad", Kernel.BIAS_GRAD),
    *_launcher_and_reference(norm, "layernorm_fwd", Kernel.LAYERNORM_FWD),
    *_launcher_and_reference(norm, "layernorm_bwd", Kernel.LAYERNORM_BWD),
    *_launcher_and_reference(norm, "rmsnorm_fwd", Kernel.RMSNORM_FWD),
    *_launcher_and_reference(norm, "rmsnorm_bwd", Kernel.RMSNORM_BWD),
    *_launcher_and_reference(activation_quantize, "activation_quantize_fwd", Kernel.ACTIVATION_QUANTIZE_FWD),
    *_launcher_and_reference(activation_quantize, "gated_quantize_fwd", Kernel.GATED_QUANTIZE_FWD),
    *_launcher_and_reference(norm_quantize, "layernorm_quantize_fwd", Kernel.LAYERNORM_QUANTIZE_FWD),
    *_launcher_and_reference(norm_quantize, "rmsnorm_quantize_fwd", Kernel.RMSNORM_QUANTIZE_FWD),
    *_launcher_and_reference(dense, "gemm", Kernel.GEMM, "bias / activation / residual epilogues; cuBLAS parity at 4096-14336 (linear.py)"),
    *_launcher_and_reference(dense_gated, "gemm_gated", Kernel.GEMM_GATED),
    *_launcher_and_reference(dense_scaled, "gemm_scaled", Kernel.GEMM_SCALED),
    *_launcher_and_reference(group_offsets, "group_offsets", Kernel.GROUP_OFFSETS),
    *_launcher_and_reference(group_offsets, "checked_group_offsets", Kernel.CHECKED_GROUP_OFFSETS),
    *_launcher_and_reference(grouped, "grouped_gemm", Kernel.GROUPED_GEMM, "1.01-1.42x torch._grouped_mm (grouped_gemm.py)"),
    *_launcher_and_reference(grouped_gated, "grouped_gemm_gated", Kernel.GROUPED_GEMM_GATED),
    *_launcher_and_reference(grouped_gated_bwd, "grouped_gemm_dgrad_gated", Kernel.GROUPED_GEMM_DGRAD_GATED),
    *_launcher_and_reference(grouped_wgrad, "grouped_gemm_wgrad", Kernel.GROUPED_GEMM_WGRAD),
    *_launcher_and_reference(grouped_wgrad, "grouped_bias_grad", Kernel.GROUPED_BIAS_GRAD),
    *_launcher_and_reference(grouped_scaled, "grouped_gemm_scaled", Kernel.GROUPED_GEMM_SCALED),
    *_launcher_and_reference(grouped_scaled_act, "grouped_gemm_scaled_act", Kernel.GROUPED_GEMM_SCALED_ACT),
    *_launcher_and_reference(grouped_scaled_wgrad, "grouped_gemm_scaled_wgrad", Kernel.GROUPED_GEMM_SCALED_WGRAD),
    *_launcher_and_reference(grouped_scaled_dgrad_gated, "grouped_gemm_scaled_dgrad_gated",
                             Kernel.GROUPED_GEMM_SCALED_DGRAD_GATED),
    *_launcher_and_reference(amax, "amax", Kernel.AMAX),
    *_launcher_and_reference(amax, "row_amax", Kernel.ROW_AMAX),
    *_launcher_and_reference(amax, "tensor_scales", Kernel.TENSOR_SCALES),
    *_launcher_and_reference(quantize, "quantize", Kernel.QUANTIZE),
    *_launcher_and_reference(permute, "permute", Kernel.PERMUTE),
    *_launcher_and_reference(permute, "unpermute", Kernel.UNPERMUTE),
    *_launcher_and_reference(permute, "unpermute_bwd", Kernel.UNPERMUTE_BWD),
)


def backend_of(t: torch.Tensor) -> Backend:
    """Where work on ``t`` runs (module docstring)."""
    # ``runs_triton(t)`` inline (this runs per launch): float64 never, CUDA always, CPU tensors
    # inside ``interpreted_kernels()``.
    if t.dtype == torch.float64:
        return Backend.TORCH
    if t.is_cuda:
        return Backend.SM90 if pipeline.on_sm90(t) else Backend.TRITON
    return Backend.TRITON if cpu_kernels_active() else Backend.TORCH


# Rows that may serve a backend: sm_90 falls through to the Triton rows.
_FALLS_TO = {Backend.TORCH: (Backend.TORCH,), Backend.TRITON: (Backend.TRITON,),
             Backend.SM90: (Backend.SM90, Backend.TRITON)}


@functools.cache
def _routes(kernel: Kernel, backend: Backend) -> tuple[Route, ...]:
    return tuple(r for b in _FALLS_TO[backend] for r in TABLE if r.kernel is kernel and r.backend is b)


def _first_serving(routes: tuple[Route, ...], *args: Any, **kwargs: Any) -> Any:
    for route in routes:
        if route.when is None or route.when(*args, **kwargs):
            return route.runs(*args, **kwargs)
    raise LookupError(f"no route serves {routes[0].kernel} for these arguments")


# What serves each (kernel, backend), keyed by the members' ids: an Enum member hashes
# through Python code, and ``launcher`` runs several times a step.
_SERVING: dict[tuple[int, int], Callable[..., Any]] = {}


def _callable(kernel: Kernel, backend: Backend) -> Callable[..., Any]:
    runs = _SERVING.get((id(kernel), id(backend)))
    if runs is None:
        runs = _SERVING[(id(kernel), id(backend))] = _serving(kernel, backend)
    return runs


def _serving(kernel: Kernel, backend: Backend) -> Callable[..., Any]:
    routes = _routes(kernel, backend)
    if not routes:
        raise LookupError(f"dispatch TABLE has no {backend.value} route for {kernel}")
    if routes[0].when is None:
        return routes[0].runs
    # The first row depends on the call's arguments: decide per call, rows in order.
    return functools.partial(_first_serving, routes)


# Under torch.compile: the plain-torch references, which the compiler traces and fuses itself
# (a Triton launcher's host code is not traceable; the grouped GEMMs and the MoE routing,
# whose references walk offsets on the host or cost more than the kernels, reach the
# compiler as custom ops through library.py and moe/traceable.py instead).
# The dense GEMMs take their product in bf16 / fp16 there (gemm/traced.py: the references'
# float32 product made the compiled model 5x slower than eager).
# Keyed by the members' values: dynamo guards a dict's keys while it traces a lookup, and an
# Enum member key costs a guard on each key's identity and ``__hash__`` (121 guards of a 4-block
# dense stack's 2,202 were this table's and ``QUANTIZED``'s, against 39 with string keys).
_TRACED = {r.kernel.value: r.runs for r in TABLE if r.backend is Backend.TORCH} | {
    Kernel.GEMM.value: traced.gemm, Kernel.GEMM_GATED.value: traced.gemm_gated}


# The quantize kernels and the GEMMs on quantized operands: custom ops under torch.compile.
QUANTIZED = frozenset({
    Kernel.ACTIVATION_QUANTIZE_FWD, Kernel.GATED_QUANTIZE_FWD, Kernel.LAYERNORM_QUANTIZE_FWD,
    Kernel.RMSNORM_QUANTIZE_FWD, Kernel.GEMM_SCALED, Kernel.GROUPED_GEMM_SCALED, Kernel.GROUPED_GEMM_SCALED_ACT,
    Kernel.GROUPED_GEMM_SCALED_WGRAD, Kernel.GROUPED_GEMM_SCALED_DGRAD_GATED, Kernel.AMAX, Kernel.ROW_AMAX,
    Kernel.TENSOR_SCALES, Kernel.QUANTIZE})
# What a torch.compile trace may run: ``_TRACED`` less the quantized kernels. A lookup that
# misses is a quantized kernel; a membership test of a set would guard the whole set's value.
_COMPILABLE = {value: runs for value, runs in _TRACED.items() if value not in {k.value for k in QUANTIZED}}


def launcher(kernel: Kernel, t: torch.Tensor) -> Callable[..., Any]:
    """What serves ``kernel`` for work on ``t``: call it with the launcher's arguments.

    Raises:
        LookupError: ``kernel`` is quantized and torch.compile is tracing: those kernels reach
            the compiler as custom ops (``fuseops.kernels.quantized_ops.quantized_launcher``);
            their traced references give wrong weight gradients on the H100."""
    if torch.compiler.is_compiling():
        runs = _COMPILABLE.get(kernel.value)
        if runs is None:
            raise LookupError(f"{kernel.value}: a quantized kernel is not traced; ask "
                              "fuseops.kernels.quantized_ops.quantized_launcher, which serves its custom op")
        return runs
    if maybe_current_level() is not None or _references_forced:
        # Under torch.func transforms: vmap runs the plan's Function on batched tensors (its
        # generated vmap rule), which have no storage a Triton kernel could read. Forced: a
        # plan run that torch differentiates itself (``ops/executor/plain_autograd.py``).
        return _TRACED[kernel.value]
    backend = backend_of(t)
    # ``_callable`` inline: this runs per launch.
    runs = _SERVING.get((id(kernel), id(backend)))
    return _callable(kernel, backend) if runs is None else runs


def untraced_launcher(kernel: Kernel, t: torch.Tensor) -> Callable[..., Any]:
    """``launcher`` for a caller that found torch.compile not tracing
    (``quantized_ops.quantized_launcher``): the same answer without a second
    ``torch.compiler.is_compiling()``, which costs ~150 ns a call on the CPU machine."""
    if maybe_current_level() is not None or _references_forced:
        return _TRACED[kernel.value]
    return _callable(kernel, backend_of(t))


# While set, ``launcher`` serves every kernel by its torch reference, as under torch.func: a plan
# run under ``torch.autograd.forward_ad`` outside torch.func, whose dual tensors a Triton kernel
# would read without their tangents (``ops/executor/plain_autograd.py`` sets it).
_references_forced = False


@contextlib.contextmanager
def references_forced() -> Iterator[None]:
    """Every kernel served by its torch reference (plain, differentiable torch ops) inside."""
    global _references_forced
    previous, _references_forced = _references_forced, True
    try:
        yield
    finally:
        _references_forced = previous


def describe() -> str:
    """``TABLE`` as text: one line a row, in the order rows are tried."""
    lines = [f"{'kernel':<32} {'backend':<16} {'runs':<66} {'when':<28} why"]
    for r in TABLE:
        runs = f"{r.runs.__module__.removeprefix('fuseops.kernels.')}.{r.runs.__name__}"
        when = "always" if r.when is None else r.when.__name__
        lines.append(f"{r.kernel.value:<32} {r.backend.value:<16} {runs:<66} {when:<28} {r.why}")
    return "\n".join(lines)
