"""Shared test helpers: float64 references, dtype tolerances, poisoned outputs, SQNR, CUDA-graph capture."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator
from typing import TypeVar
from unittest import mock

import pytest
import torch

from benchmarks.float32_precision import float32_matmul_precision  # noqa: F401 - the tests' import point
from fuseops.kernels import dispatch
from fuseops.kernels._triton import INTERPRET, runs_triton
from fuseops.kernels.dispatch import Backend

DTYPES = (torch.float32, torch.float16, torch.bfloat16)

# Relative tolerance against a float64 reference, by the dtype of the computation
# (DESIGN.md). Norm-wise: ||out - ref|| / ||ref||.
REL_TOL = {torch.float32: 1e-5, torch.float16: 1e-3, torch.bfloat16: 1e-2, torch.float64: 1e-12}

# Accuracy floors of one quantized Linear (DESIGN.md), by recipe class: signal-to-quantization
# noise in dB against float64 of its output, input gradient and weight gradient.
SQNR_FLOORS_DB = {
    "FP8CurrentScaling": (27.0, 23.0, 21.0),
    "FP8Blockwise": (27.0, 23.0, 21.0),
    "MXFP8": (26.5, 23.0, 21.0),
    "NVFP4": (14.0, 12.0, 12.0),
}


def quantized_rel_tol(recipe: object) -> float:
    """The norm-wise relative error against float64 that the lowest of ``recipe``'s SQNR floors
    allows (``10 ** (-dB / 20)``: NVFP4's 12 dB is 0.25, the FP8 formats' 21 dB 0.089): what one
    rounding to the format may cost where the test cannot tell a GEMM's output from its gradients."""
    return 10 ** (-min(SQNR_FLOORS_DB[type(recipe).__name__]) / 20)

T = TypeVar("T")


def cuda_or_skip() -> torch.device:
    import pytest

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    return torch.device("cuda")


@contextlib.contextmanager
def kernels_on(kernels: str) -> Iterator[torch.device]:
    """The device a test's ``kernels`` variant runs on: "reference" runs the torch references
    on CPU; "triton" runs the Triton kernels, on the GPU where there is one and through the
    interpreter on CPU-only machines (the interpreter cannot start once triton is imported
    without it)."""
    if kernels == "reference":
        yield torch.device("cpu")
    elif torch.cuda.is_available():
        yield torch.device("cuda")
    else:
        from fuseops.kernels._triton import interpreted_kernels

        with interpreted_kernels():
            yield torch.device("cpu")


def is_sm90() -> bool:
    """A Hopper GPU: the warp-specialized Gluon kernels' target."""
    return torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)


# The marks of a test module for the Gluon kernels: GPU only, and sm_90 only.
SM90_ONLY = [pytest.mark.gpu, pytest.mark.skipif(not is_sm90(), reason="needs an sm_90 GPU")]


# Group sizes of the Gluon kernels' tests: empty groups, a 1-row group, groups across tile and
# step edges, one group holding every row, and many groups.
HOPPER_SPLITS = {
    "ragged": [300, 0, 1, 64, 129, 0, 511, 63],
    "one_holds_all": [0, 1000, 0],
    "many": [7 * (g % 5) for g in range(130)],
}


def reroutable(T: int, E: int, K: int, device) -> tuple[torch.Tensor, torch.Tensor, Callable[[int], None]]:
    """MoE routing inputs that a captured CUDA graph can replay with new values: expert ids
    [T, K] (int64), router weights [T, K] (float32, a leaf), and ``route(seed)``, which fills
    both in place with the top-K of seeded random logits and their softmax."""
    ids = torch.empty(T, K, device=device, dtype=torch.int64)
    weights = torch.empty(T, K, device=device).requires_grad_()

    def route(seed: int) -> None:
        logits = torch.randn(T, E, generator=torch.Generator().manual_seed(seed))
        top, idx = logits.topk(K, dim=-1)
        with torch.no_grad():
            ids.copy_(idx)
            weights.copy_(top.softmax(-1))

    return ids, weights, route


def nudged(t: object, dtype: torch.dtype, g: torch.Generator) -> object:
    """A float tensor ``t`` with each element moved up or down by one or two units in the last
    place of ``dtype`` (by ``finfo.eps`` of itself), or kept: a third each (anything else as it
    is). A neighbouring example, for rules that compare two paths' rounding errors."""
    if not isinstance(t, torch.Tensor) or not t.is_floating_point():
        return t
    step = torch.randint(-1, 2, t.shape, generator=g).to(torch.float64) * torch.finfo(dtype).eps
    return (t.double().cpu() * (1 + step)).to(device=t.device, dtype=t.dtype)


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    out, ref = out.double(), ref.double()
    denom = ref.norm().item()
    err = (out - ref).norm().item()
    return err / denom if denom > 0 else err


def assert_close_rel(out: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype, factor: float = 1.0, what: str = ""):
    """Norm-wise relative error within the dtype's tolerance; NaN never passes."""
    assert out.shape == ref.shape, f"{what}: shape {tuple(out.shape)} != {tuple(ref.shape)}"
    assert torch.isfinite(out).all() == torch.isfinite(ref).all(), f"{what}: non-finite values differ"
    err = rel_err(out, ref)
    tol = REL_TOL[dtype] * factor
    assert err <= tol, f"{what}: relative error {err:.3e} > {tol:.1e} ({dtype})"


def near_max_row(n: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """A float32 row of magnitudes in [1e38, 2e38), signs random: its root mean square passes
    float32's 1 / smallest normal (~8.5e37), so a norm's rstd is a subnormal (bf16 holds it too)."""
    g = torch.Generator().manual_seed(n)
    signs = torch.randint(0, 2, (n,), generator=g) * 2 - 1
    return ((torch.rand(n, generator=g) + 1) * 1e38 * signs).to(device)


def sqnr_db(out: torch.Tensor, ref: torch.Tensor) -> float:
    """Signal-to-quantization-noise ratio of ``out`` against ``ref``, in dB."""
    ref = ref.double()
    noise = (out.double() - ref).square().sum().item()
    signal = ref.square().sum().item()
    return math.inf if noise == 0 else 10 * math.log10(signal / noise)


def poison_(t: torch.Tensor) -> torch.Tensor:
    """Fill with NaN (or the max value for integers) so unwritten outputs show."""
    if t.is_floating_point():
        return t.fill_(float("nan"))
    return t.fill_(torch.iinfo(t.dtype).max)


def groups_far_apart(groups: int, rows: int, cols: int, dtype: torch.dtype, device="cpu") -> torch.Tensor:
    """A [groups, rows, cols] view (random values, unit last stride) whose groups lie 2**30
    elements apart, so that the last starts past 2**31: a kernel that multiplies a 32-bit group
    index by the group stride writes or reads elsewhere. Of the span's storage (gigabytes,
    allocated and never touched) only the groups' pages are written."""
    stride = 2**30
    storage = torch.empty(stride * (groups - 1) + rows * cols, dtype=dtype, device=device)
    view = storage.as_strided((groups, rows, cols), (stride, cols, 1))
    for g in range(groups):
        view[g].copy_(torch.randn(rows, cols, dtype=dtype))
    return view


def assert_bitwise(out: torch.Tensor | None, ref: torch.Tensor | None, what: str = "") -> None:
    """Same presence, shape, dtype and bits (float8 and E8M0 compared as their bytes)."""
    assert (out is None) == (ref is None), f"{what}: presence differs"
    if out is None:
        return
    assert out.shape == ref.shape and out.dtype == ref.dtype, f"{what}: {out.shape} {out.dtype} vs {ref.shape} {ref.dtype}"
    # As integers of the element's size: NaN has bits too (and equals itself here).
    ints = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
    ob = out.view(ints[out.element_size()]) if out.is_floating_point() or out.element_size() == 1 else out
    rb = ref.view(ints[ref.element_size()]) if ref.is_floating_point() or ref.element_size() == 1 else ref
    bad = (ob != rb).sum().item()
    assert bad == 0, f"{what}: {bad} of {out.numel()} differ"


def capture_cuda_graph(step: Callable[[], T], warmup: int = 2, *, fresh_grads: tuple[torch.Tensor, ...] = (),
                       error_mode: str = "global") -> tuple[torch.cuda.CUDAGraph, T]:
    """``step`` run ``warmup`` times on a side stream (lazy allocations and compiles happen
    outside the capture), then captured: ``(graph, what the captured call returned)``, whose
    tensors the graph's replays overwrite. ``fresh_grads``: tensors whose ``.grad`` is set to
    None before the capture, so the captured backward writes (not accumulates) them in graph
    memory. ``error_mode``: ``torch.cuda.graph``'s ``capture_error_mode`` ("thread_local" where
    another thread, such as NCCL's watchdog, queries events during the capture)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(warmup):
            step()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    for t in fresh_grads:
        t.grad = None
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, capture_error_mode=error_mode):
        out = step()
    return graph, out


def assert_replay_equals_eager(run: Callable[[], torch.Tensor], route: Callable[[int], None],
                               leaves: list[torch.Tensor]) -> None:
    """``run`` (a forward+backward returning its output) eagerly on the inputs ``route(1)``
    writes, then captured on ``route(2)``'s and replayed on ``route(1)``'s: the replay's output
    and the ``leaves``' gradients equal the eager step's bit for bit."""
    route(1)
    ref = [run().detach()] + [t.grad.clone() for t in leaves]
    route(2)
    graph, y_static = capture_cuda_graph(run)
    route(1)
    graph.replay()
    torch.cuda.synchronize()
    for a, b in zip([y_static] + [t.grad for t in leaves], ref, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def dispatched(kernel):
    """``kernel``'s launcher as ops call it: chosen by the dispatch table from the first
    argument (a tensor, or a quantized operand's data) at each call."""
    from fuseops.kernels.dispatch import launcher

    def run(first, *args, **kwargs):
        return launcher(kernel, first if isinstance(first, torch.Tensor) else first.data)(first, *args, **kwargs)

    return run


def run_python(*args: str, timeout: float = 300):
    """``python *args`` in a fresh process from the repository's root, which is put on its path;
    returns the CompletedProcess, text output captured."""
    import os
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, PYTHONPATH=root + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run([sys.executable, *args], cwd=root, capture_output=True, text=True, env=env,
                          timeout=timeout, check=False)


def run_device_assert(code: str):
    """Run ``code`` in a fresh Python process (a device-side assert poisons the CUDA context
    of the process it fires in); returns the CompletedProcess, text output captured."""
    return run_python("-c", code)


def grouped_swiglu_reference(experts, sizes):
    """Plain torch of ``Sequential(GroupedLinear, SwiGLU, GroupedLinear)`` (no biases) with
    ``sizes`` rows per group: each group's rows through its own two weights."""
    w1, w2 = experts[0].weight, experts[2].weight

    def reference(x):
        outs = []
        for rows, a, b in zip(x.split(sizes), w1, w2):
            gate, up = (rows @ a.T).chunk(2, -1)
            outs.append((torch.nn.functional.silu(gate) * up) @ b.T)
        return torch.cat(outs)
    return reference


def routed_tokens(device, dtype, *, E: int, T: int, K: int = 2, seed: int = 0):
    """``(x [T, 8], expert_ids [T, K], weights [T, K])``: each token's K distinct experts of E."""
    torch.manual_seed(seed)
    x = torch.randn(T, 8, device=device, dtype=dtype)
    ids = torch.stack([torch.randperm(E, device=device)[:K] for _ in range(T)])
    weights = torch.rand(T, K, device=device, dtype=dtype)
    return x, ids, weights


def cpu_and_cuda():
    """Test devices: the CPU, and CUDA (a ``gpu`` test, skipped without one)."""
    return ["cpu", _CUDA]


def kernel_devices():
    """Where the Triton kernels run: the CPU through the interpreter (``TRITON_INTERPRET=1``,
    ``interpreted_kernels()``), and CUDA."""
    interpreter = pytest.mark.skipif(not INTERPRET, reason="the interpreter runs on CPU-only machines")
    return [pytest.param("cpu", marks=interpreter), _CUDA]


_CUDA = pytest.param("cuda", marks=[pytest.mark.gpu,
                                    pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA")])


@contextlib.contextmanager
def sm90_routes() -> Iterator[None]:
    """Work the Triton kernels run (``interpreted_kernels``) routed as on an H100: the dispatch
    table's sm_90 rows first. The dense GEMM rows (``dense_dispatch``: cuBLAS + one elementwise
    kernel, or the fused kernel, by tile count and dtype) decide as on the GPU, with the
    interpreter's 4 SMs; the Gluon rows ask ``on_sm90`` themselves and decline on the CPU."""
    def backend_of(t: torch.Tensor) -> Backend:
        return Backend.SM90 if runs_triton(t) else Backend.TORCH

    with mock.patch.object(dispatch, "backend_of", backend_of):
        yield
