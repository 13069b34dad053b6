"""Shape-aware dispatch of the dense GEMMs with an epilogue (the forward's, the gated one, the
dgrad's) on sm_90: the fused Triton kernel, or cuBLAS followed by one elementwise kernel.

The rule (``RULE``): fused where the output has at least ``waves`` waves of 128x128 tiles,
``ceil(M / 128) * ceil(N / 128) >= waves * SMs``, else cuBLAS. Below a wave the persistent
fused kernel leaves SMs idle while cuBLAS splits K or picks smaller tiles (M=64, K=4096,
N=1024: 43.5 against 8.9 us); from there on the fused epilogue saves the elementwise kernel's
pass over the output. ``prefers_cublas`` (``dense.gemm``: the forward orientation ``x @ W^T``,
or the dgrad's ``dy @ W`` with act'(z) or a residual) and ``prefers_cublas_gated``
(``dense_gated.gemm_gated``) apply it where it was measured: bf16 and fp16 operands, the
epilogue in ``a``'s dtype. float32 always takes cuBLAS: the fused kernels multiply it in full
IEEE precision off the tensor cores, 1.3-10.7x slower than cuBLAS's SGEMM (under TF32 both
branches use the tensor cores, and cuBLAS stays the choice, untimed against the fused TF32
kernels). An activation followed by a residual was not measured and stays fused. CPU and
other GPUs keep their routes.

``FUSEOPS_DENSE_DISPATCH=table|fused|cublas`` (read at the first decision) or
``force_branch()`` pins one branch for every call these rows can serve (benchmarks, tests).
"""

from __future__ import annotations

import enum
import functools
import os

import torch

from fuseops.kernels._triton import num_sms
from fuseops.kernels.elementwise.activation_math import Activation, AnyActivation


class Branch(enum.Enum):
    FUSED = "fused"
    CUBLAS = "cublas"


class Epilogue(enum.Enum):
    """Epilogue classes of the forward GEMM (a bias or not in each)."""

    BIAS = "bias"
    ACTIVATION = "bias+act"
    RESIDUAL = "bias+residual"
    ACTIVATION_RESIDUAL = "bias+act+residual"
    # ``dense_gated.gemm_gated`` (SwiGLU and the other GLUs; output tiles count its F columns),
    # without and with the pre-activation saved (an inference and a training forward).
    GATED = "bias+gated"
    GATED_SAVED = "bias+gated+saved"
    # The dgrad orientation ``dy @ W`` (``b`` the forward's weight as it is, no bias).
    DGRAD_ACTIVATION = "dgrad+act"
    DGRAD_RESIDUAL = "dgrad+residual"


# Side of the square tile that counts the output's tiles (the fused kernel's BLOCK_M).
TILE = 128
# Waves of TILE x TILE output tiles from which the fused kernel runs; None: always fused.
# Fitted on an H100 SXM, 132 SMs, bf16 (``python -m benchmarks.dense_dispatch``, GPU time
# replayed from a CUDA graph: ``benchmarks/results/dense_dispatch-h100-2026-11-27.json``); a
# cell is wrong where the rule picks the slower branch:
# - forward, bias / bias+GELU / bias+residual, 72 cells: 1 wave, 10 wrong, each by at most
#   5 % (always fused: 34 wrong, up to 5.3x; always cuBLAS: 38 wrong, up to 1.41x);
# - gated, ``z`` not saved: 2 waves (3 of 30 wrong, worst 1.04x): the fused kernel writes only
#   ``y`` where cuBLAS writes ``z`` and reads it back. ``z`` saved: 3 waves (7 of 30, worst
#   1.07x, all ties): both write ``z``, and the fused two-accumulator main loop is no faster;
# - dgrad with act'(z): 2 waves (6 of 30 wrong, worst 1.07x); with a residual: 1 wave (2 of 30,
#   worst 1.02x), the fused epilogue reading the residual that cuBLAS's add reads and writes.
# float16 keeps these rows (bias+GELU and the saved gated GEMM re-measured: 1 and 9 of 30
# wrong, worst 1.10x). On an H200 (``dense_dispatch-h200-2026-11-28.json``, 48 cells from a
# wave on) the table's sum is within 0.6 % of the faster branch's per cell.
RULE: dict[Epilogue, float | None] = {
    Epilogue.BIAS: 1.0,
    Epilogue.ACTIVATION: 1.0,
    Epilogue.RESIDUAL: 1.0,
    Epilogue.ACTIVATION_RESIDUAL: None,
    Epilogue.GATED: 2.0,
    Epilogue.GATED_SAVED: 3.0,
    Epilogue.DGRAD_ACTIVATION: 2.0,
    Epilogue.DGRAD_RESIDUAL: 1.0,
}
# The rules' dtypes (module docstring); float32 always takes cuBLAS.
MEASURED_DTYPES = frozenset({torch.bfloat16, torch.float16})

ENV = "FUSEOPS_DENSE_DISPATCH"
_UNREAD = object()
_forced: object = _UNREAD


def epilogue_class(has_act: bool, has_residual: bool) -> Epilogue:
    if has_act:
        return Epilogue.ACTIVATION_RESIDUAL if has_residual else Epilogue.ACTIVATION
    return Epilogue.RESIDUAL if has_residual else Epilogue.BIAS


def choose(tiles_m: int, tiles_n: int, epilogue: Epilogue, sms: int) -> Branch:
    """The rule as a pure function of the output's TILE x TILE tile grid and the SM count."""
    waves = RULE[epilogue]
    if waves is None or tiles_m * tiles_n == 0 or tiles_m * tiles_n >= waves * sms:
        return Branch.FUSED
    return Branch.CUBLAS


@functools.lru_cache(maxsize=4096)
def _choice(tiles_m: int, tiles_n: int, has_act: bool, has_residual: bool, device_index: int) -> Branch:
    # Keyed by plain bools and ints: an Enum's hash is Python code, a few hundred ns a call.
    return choose(tiles_m, tiles_n, epilogue_class(has_act, has_residual), num_sms(device_index))


@functools.lru_cache(maxsize=4096)
def _dgrad_choice(tiles_m: int, tiles_n: int, has_act: bool, device_index: int) -> Branch:
    epilogue = Epilogue.DGRAD_ACTIVATION if has_act else Epilogue.DGRAD_RESIDUAL
    return choose(tiles_m, tiles_n, epilogue, num_sms(device_index))


@functools.lru_cache(maxsize=4096)
def _gated_choice(tiles_m: int, tiles_n: int, save_preact: bool, device_index: int) -> Branch:
    return choose(tiles_m, tiles_n, Epilogue.GATED_SAVED if save_preact else Epilogue.GATED, num_sms(device_index))


def _parse(value: str) -> Branch | None:
    if value == "table":
        return None
    try:
        return Branch(value)
    except ValueError:
        raise ValueError(f"{ENV}={value!r}: expected one of 'table', 'fused', 'cublas'") from None


def forced_branch() -> Branch | None:
    """The branch pinned by ``force_branch`` or ``FUSEOPS_DENSE_DISPATCH``; None: the table."""
    global _forced
    if _forced is _UNREAD:
        _forced = _parse(os.environ.get(ENV, "table"))
    return _forced  # type: ignore[return-value]


def force_branch(branch: Branch | str | None) -> None:
    """Pin ``branch`` ('fused', 'cublas') for every call the table could serve, or None /
    'table' to follow the table again."""
    global _forced
    _forced = _parse(branch) if isinstance(branch, str) else branch


def _decided_without_thresholds(dtype: torch.dtype) -> bool | None:
    """Whether cuBLAS serves a call the rows can take, where no threshold decides: a pinned
    branch, float32 (always cuBLAS), an unmeasured dtype (always fused); None: the thresholds."""
    forced = _forced if _forced is not _UNREAD else forced_branch()
    if forced is not None:
        return forced is Branch.CUBLAS
    if dtype not in MEASURED_DTYPES:
        return dtype == torch.float32
    return None


def prefers_cublas(
    a: torch.Tensor,
    b: torch.Tensor,
    *,
    bias: torch.Tensor | None = None,
    act: AnyActivation = Activation.IDENTITY,
    alpha: float = 1.0,
    save_preact: bool = False,
    act_grad_input: torch.Tensor | None = None,
    residual: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
) -> bool:
    """Whether a ``dense.gemm`` call goes to cuBLAS + one elementwise kernel (module
    docstring): O(1), the decision cached per (tile grid, epilogue class, device)."""
    dtype = a.dtype
    # Operands the cuBLAS branch takes as they are.
    if (out is not None or (bias is not None and bias.dtype != dtype)
            or (residual is not None and residual.dtype != dtype)):
        return False
    # ``b`` row-major (dense.gemm without B_TRANS): ``dy @ W``, W the forward's weight as it is. Its
    # measured epilogues: act'(z) (BackwardActivationLinear) or a residual (BackwardExtraOutputLinear),
    # one of them, no bias. The forward orientation: every epilogue but act'(z).
    dgrad = b.stride(1) == 1
    if dgrad:
        if (bias is not None or save_preact or (act_grad_input is None) == (residual is None)
                or (act_grad_input is not None and act_grad_input.dtype != dtype)):
            return False
    elif act_grad_input is not None:
        return False
    decided = _decided_without_thresholds(dtype)
    if decided is not None:
        return decided
    # Ceiling divisions inline: this runs on every forward GEMM call on sm_90.
    tiles_m, tiles_n = -(-a.shape[0] // TILE), -(-b.shape[1] // TILE)
    if dgrad:
        branch = _dgrad_choice(tiles_m, tiles_n, act_grad_input is not None, a.get_device())
    else:
        branch = _choice(tiles_m, tiles_n, act is not Activation.IDENTITY, residual is not None, a.get_device())
    return branch is Branch.CUBLAS


def prefers_cublas_gated(
    a: torch.Tensor,
    b: torch.Tensor,
    *,
    bias: torch.Tensor | None = None,
    act: AnyActivation,
    interleaved: bool = False,
    clamped: bool = False,
    limit: float = 7.0,
    alpha: float = 1.0,
    save_preact: bool = False,
    out: torch.Tensor | None = None,
) -> bool:
    """Whether a ``dense_gated.gemm_gated`` call goes to cuBLAS + the gated activation kernel
    (``dense_cublas.gemm_gated``; the rule in the module docstring): O(1), cached per tile grid
    and device."""
    dtype = a.dtype
    if (b.stride(1) == 1 or (bias is not None and bias.dtype != dtype)
            or (out is not None and (out.dtype != dtype or out.stride(1) != 1))):
        return False
    decided = _decided_without_thresholds(dtype)
    if decided is not None:
        return decided
    tiles_m, tiles_n = -(-a.shape[0] // TILE), -(-b.shape[1] // (2 * TILE))
    return _gated_choice(tiles_m, tiles_n, bool(save_preact), a.get_device()) is Branch.CUBLAS
