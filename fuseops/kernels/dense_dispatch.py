"""Shape-aware dispatch of the dense GEMMs with an epilogue (the forward's, the gated one, the
dgrad's): fused, or cuBLAS + one elementwise kernel. The measured tables behind the dispatch
table's ``GEMM`` and ``GEMM_GATED`` rows for sm_90: the forward epilogues first, then "The gated
GEMM", "The dgrad epilogues" and "Other dtypes" below.

Source: ``benchmarks/results/session14/dense_dispatch.json`` (``python -m
benchmarks.dense_dispatch``, H100 SXM, 132 SMs, bf16): ``y = act(x @ W^T + b) (+ r)`` through
``dense.gemm`` (fused: one persistent kernel, 128x256 tiles) against ``torch.addmm`` + one
torch elementwise op, 72 cells (3 epilogues x 6 (K, N) x M in 64, 1024, 4096, 16384), GPU
time per call replayed from a CUDA graph.

The rule (``RULE``): fused where the output has at least one wave of 128x128 tiles,
``ceil(M / 128) * ceil(N / 128) >= waves * SMs`` with ``waves = 1``, else cuBLAS.
Below a wave the fused kernel leaves SMs idle and cuBLAS picks split-K or smaller tiles:
fused is 1.18-5.3x slower there (M=64, K=4096, N=1024: 43.5 against 8.9 us; M=1024, K=8192,
N=2048, 128 tiles: 79.6 against 50.6 us). From a wave on it wins or ties: bias+GELU
1.01-1.26x, bias+residual 0.98-1.41x, bias alone 0.95-1.12x (parity: cuBLAS fuses a bias).
The data puts the threshold between 128 and 256 tiles; one wave is the reason for it.

Error of the rule on the 72 cells (a cell is wrong where the branch it picks is the slower):
10 wrong, all by at most 5 % (8 bias-only cells at 1-5 %, bias+residual at M=1024 and 16384,
K=14336, N=4096 by 2 % and 0.4 %), 69 us over the 31.7 ms sum of the faster branches
(0.2 %). Always fused: 34 wrong, up to 5.3x, +875 us; always cuBLAS: 38 wrong, up to 1.41x,
+1333 us; two waves: 15 wrong, up to 1.34x; a threshold per epilogue class does no better
(bias alone: no threshold beats one wave; bias+GELU 0 wrong at one wave).

Checked on two later runs of the same cells (session 14): against torch's ops again (8 wrong,
all bias-only but one, worst 1.12x: bias at M=1024, K=4096, N=14336) and against the branch
as dispatched, ``dense_cublas.gemm``, with the rule applied by ``prefers_cublas`` itself
(``results/session14/dense_dispatch_table.json``: 9 wrong, all bias-only, worst 1.09x; the
table's sum 31.30 ms against 32.10 always fused and 31.24 for the faster per cell). For bias
alone "always cuBLAS" is as good over the three runs (8 / 8 / 7 wrong, worst 1.12 / 1.07 /
1.25x): no reason to give that class a rule of its own.

Where it applies (``prefers_cublas``, the row's ``when``): the forward orientation ``x @ W^T``
(``b`` a transposed [N, K] weight) with no activation-gradient input, or the dgrad one below;
epilogue operands and output in ``a``'s dtype, ``a`` in a measured dtype (bf16, fp16;
float32 always takes cuBLAS, below), an epilogue class with a threshold (an activation
followed by a residual was not measured: fused). CPU and other GPUs keep their routes (the table's row is
sm_90's). The eager column of the same run is the host path's business (the fused launcher's
host cost), not this table's.

The gated GEMM (``dense_gated.gemm_gated``: ``y = silu(z_a) * z_b`` of ``z = x @ W^T + b``,
SwiGLU and the other GLUs) against ``dense_cublas.gemm_gated`` (``torch.addmm``, then fuseops'
gated activation kernel, which runs at 2.8-2.9 TB/s from 1024 x 10880 on: tile configs do not
matter there, ``results/session60/gated_probe.py``). Source:
``benchmarks/results/session60/run8/dense_dispatch_gated.json`` (the same script, H100 SXM,
bf16, the two branches timed in two interleaved rounds, the faster of each): 60 cells, 6
(K, 2F) widths (896 x 9728, 1024 x 5376, 2048 x 10880, 4096 x 21760, 4096 x 28672,
8192 x 7168) x M in 64, 256, 1024, 4096, 16384, with ``z`` saved (a training forward) or not.
Tiles count the output's F columns. Two classes, two thresholds:

- ``z`` not saved (``GATED``, 2 waves): the fused kernel writes only ``y``, cuBLAS writes ``z``
  and reads it back: from 2 waves on fused runs 1.03-1.23x but at two ties (0.96x, 0.98x);
  below, cuBLAS up to 2.2x (M=64, K=1024: 13.9 against 6.3 us). 3 of 30 cells wrong, worst
  1.04x (run 5, the branches timed one after the other: 1 wrong, 1.06x).
- ``z`` saved (``GATED_SAVED``, 3 waves): both write ``z``; the fused kernel's two-accumulator
  main loop is no faster than cuBLAS's, so from 5 waves on the branches tie (0.94-1.07x) and
  below 3 cuBLAS wins or ties (1.0-2.4x; M=1024, K=1024, 2F=5376, 1.27 waves: 32.2 against
  24.8 us). 7 of 30 wrong, worst 1.07x, all at ties (run 5: 8, 1.06x). Always cuBLAS would
  err by up to 1.07-1.17x (M=16384, K=1024), always fused by up to 2.4x.

The dgrad epilogues (``dense.gemm`` on ``dy @ W``, ``W`` the forward's weight as it is: the
activation's derivative, ``dz = (dy @ W) * act'(z)`` of BackwardActivationLinear, or a branch's
gradient, ``dx = dy @ W + dbranch`` of BackwardExtraOutputLinear) against ``torch.mm`` then
fuseops' activation backward kernel or an in-place add. Sources:
``benchmarks/results/session60/run10/dense_dispatch_dgrad.json`` (GELU) and ``run11/`` (both),
30 cells each: WIDTHS' six (K, N) x M in 64, 256, 1024, 4096, 16384, interleaved rounds. Below
a wave the fused kernel is up to 5.9x slower (M=64, K=8192, N=2048: 80.8 against 13.8 us:
cuBLAS splits K, the fused kernel has 16 tiles for 132 SMs).

- act'(z) (``DGRAD_ACTIVATION``, 2 waves): between one and two waves cuBLAS still wins or ties
  (M=1024, K=8192, N=2048, 0.97 waves: 82.8 against 53.1 us; 1.94 waves: 0.96-1.04x); above,
  the two tie (0.93-1.09x). 6 of 30 cells wrong in each run, worst 1.06x / 1.07x.
- A residual (``DGRAD_RESIDUAL``, 1 wave, as the forward's): from a wave on the fused kernel
  wins (to 1.25x: it reads the residual in its epilogue, cuBLAS's add reads and writes dx
  again). 2 of 30 cells wrong, worst 1.02x.

Other dtypes (``results/session60/run13/``, ``run14/``, the same script with ``--dtype``):

- float16 (``MEASURED_DTYPES``): the bf16 thresholds hold where re-measured, bias+GELU (1 wave:
  1 of 30 cells wrong, worst 1.10x) and the gated GEMM with ``z`` saved (3 waves: 9 of 30,
  worst 1.04x); the other classes take their bf16 thresholds unmeasured (the same kernels,
  tiles and tensor-core rate).
- float32: cuBLAS on every cell, whatever the epilogue. The fused kernels multiply float32 in
  full IEEE precision (torch's default, ``allow_tf32=False``), which Triton runs off the tensor
  cores: 3.3-10.7x slower than cuBLAS's SGEMM for bias+GELU (18 cells, M in 64, 1024, 4096;
  M=4096, K=4096, N=14336: 66.1 against 9.6 ms), 3.7-7.2x for the gated GEMM (18 cells),
  1.3-6.4x for the dgrad with act'(z) (15 cells). The dgrad with a residual was not timed in
  float32: its fused epilogue saves one pass (at most 1.25x in bf16), its main loop is the
  dgrad's, 1.5-1.7x slower from M=1024 on. Under torch's TF32 setting
  (``torch.set_float32_matmul_precision("high")``) both branches multiply in TF32 (the fused
  kernels through their ``F32_DOT``, session 61), and cuBLAS stays the choice: the fused TF32
  kernels were not timed against cuBLAS's TF32 GEMMs.

Checked on an H200 (more bandwidth than the H100 the rows were fitted on, so a separate
elementwise pass costs less there): ``benchmarks/results/session68/run1/`` (the same script, bf16,
the forward and dgrad epilogues at the six widths, M in 4096, 16384; 48 cells, all from a wave on).
Graphed, the table's sum 40,191 us against 39,951 for the faster branch per cell (0.6 %), always
cuBLAS 41,046; the slower branch picked in 15 of 48 cells, worst 1.08x (dgrad + GELU, M=16384,
K=8192, N=2048), the dgrad + GELU cells 0.93-1.0x (eager 0.92-1.05x), the forward and residual
cells 0.97-1.17x. The rows stand: the dgrad + GELU class alone would run 2 % faster always on
cuBLAS (10,310 against 10,518 us summed over its 12 cells), inside the tie the H100 measured
(0.93-1.09x, above), and the two machines have the same 132 SMs for a rule to tell apart.

``FUSEOPS_DENSE_DISPATCH=table|fused|cublas`` (read at the first decision) or
``force_branch()`` pins one branch for every call these rows can serve (benchmarks, tests).
"""

from __future__ import annotations

import enum
import functools
import os

import torch

from fuseops.kernels._triton import num_sms
from fuseops.kernels.elementwise.activation_math import Activation


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
# The rules' dtypes (module docstring, "Other dtypes"); float32 always takes cuBLAS.
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
    act: Activation = Activation.IDENTITY,
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
    act: Activation,
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
