"""grouped_gemm_gated (FC1 + gate) and grouped_gemm_dgrad_gated (FC2 dgrad + gate backward)
against their torch references in float64.

On CPU the kernels run through Triton's interpreter; 16-bit aligned shapes take the TMA path
(descriptors, sliced epilogue), odd shapes and float32 the masked-pointer path.
"""

from __future__ import annotations

import contextlib
import dataclasses

import pytest
import torch

from fuseops.kernels.elementwise.activation_math import Activation
from fuseops.kernels.gemm import grouped_gated as ggg
from fuseops.kernels.gemm import grouped_gated_bwd as ggg_bwd
from fuseops.kernels.gemm.grouped import group_offsets
from fuseops.kernels.gemm.grouped_gated import grouped_gemm_gated, reference_grouped_gemm_gated
from fuseops.kernels.gemm.grouped_gated_bwd import grouped_gemm_dgrad_gated, reference_grouped_gemm_dgrad_gated
from tests.helpers import DTYPES, assert_close_rel, poison_

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"

# Empty groups first, in the middle and last; sizes off the interpreter's 32-row tiles.
SPLITS = {
    "mixed": [5, 0, 40, 1, 33, 0],
    "one_holds_all": [0, 0, 71, 0],
    "empty_ends": [0, 17, 64, 0],
    "all_empty": [0, 0, 0],
}
# (K, F): 16-byte-aligned rows (TMA for 16-bit dtypes; F spans two column tiles, so dprobs
# takes the two-stage sum) and odd ones (masked pointers, one column tile).
SHAPES = {"aligned": (48, 48), "odd": (37, 29)}
# The gpt-oss gate: clamped SwiGLU with alpha 1.702; a limit inside the values' range.
CLAMPED = dict(act=Activation.SILU, clamped=True, limit=1.5, alpha=1.702)


def _offsets(sizes):
    return group_offsets(torch.tensor(sizes, device=DEVICE))


def _randn(*shape, dtype, scale=1.0):
    return (torch.randn(*shape, device=DEVICE) * scale).to(dtype)


@contextlib.contextmanager
def _config(module, cfg):
    """Every table entry of ``module._configs()`` replaced by ``cfg`` inside the block."""
    table = module._configs
    module._configs = lambda: dict.fromkeys(table(), cfg)
    try:
        yield
    finally:
        module._configs = table


def _double(kw):
    return {k: v.double() if isinstance(v, torch.Tensor) else v for k, v in kw.items()}


def _forward(sizes, K, F, dtype, *, fc1_layout="forward", save_preact=True, **kw):
    """FC1 into a poisoned ``h``; returns the kernel's and the float64 reference's outputs."""
    G, M = len(sizes), sum(sizes)
    offsets = _offsets(sizes)
    a = _randn(M, K, dtype=dtype)
    if fc1_layout == "forward":
        b = _randn(G, 2 * F, K, dtype=dtype, scale=K**-0.5).transpose(1, 2)
    else:
        b = _randn(G, K, 2 * F, dtype=dtype, scale=K**-0.5)
    out = poison_(torch.empty(M, F, device=DEVICE, dtype=dtype))
    h, z = grouped_gemm_gated(a, b, offsets, save_preact=save_preact, out=out, **kw)
    assert h is out
    h_ref, z_ref = reference_grouped_gemm_gated(a.double(), b.double(), offsets,
                                                save_preact=save_preact, **_double(kw))
    return (h, z), (h_ref, z_ref)


def _dgrad(sizes, K, F, dtype, *, fc2_layout="weight", want_h=True, **kw):
    """FC2 dgrad through the gate into a poisoned ``dz``; kernel and float64 reference."""
    G, M = len(sizes), sum(sizes)
    offsets = _offsets(sizes)
    dy = _randn(M, K, dtype=dtype)
    z = _randn(M, 2 * F, dtype=dtype, scale=2.0)
    if fc2_layout == "weight":
        b = _randn(G, K, F, dtype=dtype, scale=K**-0.5)
    else:
        b = _randn(G, F, K, dtype=dtype, scale=K**-0.5).transpose(1, 2)
    out = poison_(torch.empty(M, 2 * F, device=DEVICE, dtype=dtype))
    got = grouped_gemm_dgrad_gated(dy, b, offsets, z, want_h=want_h, out=out, **kw)
    assert got[0] is out
    ref = reference_grouped_gemm_dgrad_gated(dy.double(), b.double(), offsets, z.double(),
                                             want_h=want_h, **_double(kw))
    return got, ref


def _check(got, ref, names, dtype):
    for name, g, r in zip(names, got, ref):
        assert (g is None) == (r is None), f"{name}: presence differs"
        if g is not None:
            assert_close_rel(g, r, dtype, what=name)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("shape", SHAPES)
def test_forward_clamped_bias_probs(shape, interleaved, dtype):
    K, F = SHAPES[shape]
    M = sum(SPLITS["mixed"])
    kw = dict(CLAMPED, interleaved=interleaved, bias=_randn(6, 2 * F, dtype=dtype),
              probs=torch.rand(M, device=DEVICE))
    got, ref = _forward(SPLITS["mixed"], K, F, dtype, **kw)
    assert got[1].dtype == dtype
    _check(got, ref, ["h", "z"], dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("shape", SHAPES)
def test_dgrad_clamped_probs_h(shape, interleaved, dtype):
    K, F = SHAPES[shape]
    M = sum(SPLITS["mixed"])
    kw = dict(CLAMPED, interleaved=interleaved, probs=torch.rand(M, device=DEVICE))
    got, ref = _dgrad(SPLITS["mixed"], K, F, dtype, **kw)
    assert got[1].dtype == torch.float32 and got[2].dtype == dtype
    _check(got, ref, ["dz", "dprobs", "h"], dtype)


@pytest.mark.parametrize("split", ["one_holds_all", "empty_ends", "all_empty"])
@pytest.mark.parametrize("interleaved", [False, True])
def test_splits_without_probs(split, interleaved):
    """Plain SwiGLU, no bias, no probs: h and z, then dz alone."""
    K, F = SHAPES["aligned"]
    kw = dict(act=Activation.SILU, interleaved=interleaved)
    got, ref = _forward(SPLITS[split], K, F, torch.bfloat16, **kw)
    _check(got, ref, ["h", "z"], torch.bfloat16)
    got, ref = _dgrad(SPLITS[split], K, F, torch.bfloat16, want_h=False, **kw)
    assert got[1] is None and got[2] is None
    _check(got, ref, ["dz"], torch.bfloat16)


@pytest.mark.parametrize("act", [Activation.GELU, Activation.GELU_TANH, Activation.RELU, Activation.SRELU])
def test_gate_functions(act):
    K, F = SHAPES["aligned"]
    M = sum(SPLITS["empty_ends"])
    probs = torch.rand(M, device=DEVICE, dtype=torch.float16)
    got, ref = _forward(SPLITS["empty_ends"], K, F, torch.float16, act=act, probs=probs)
    _check(got, ref, ["h", "z"], torch.float16)
    # probs in the activations' dtype: dprobs comes back in it.
    got, ref = _dgrad(SPLITS["empty_ends"], K, F, torch.float16, act=act, probs=probs)
    assert got[1].dtype == torch.float16
    _check(got, ref, ["dz", "dprobs", "h"], torch.float16)


@pytest.mark.parametrize("interleaved", [False, True])
def test_other_weight_layouts(interleaved):
    """FC1's b N-contiguous and FC2's b K-contiguous (the transposes of the MLP's layouts)."""
    K, F = SHAPES["aligned"]
    kw = dict(act=Activation.SILU, interleaved=interleaved)
    got, ref = _forward(SPLITS["mixed"], K, F, torch.bfloat16, fc1_layout="n_contiguous", **kw)
    _check(got, ref, ["h", "z"], torch.bfloat16)
    probs = torch.rand(sum(SPLITS["mixed"]), device=DEVICE)
    got, ref = _dgrad(SPLITS["mixed"], K, F, torch.bfloat16, fc2_layout="k_contiguous", probs=probs, **kw)
    _check(got, ref, ["dz", "dprobs", "h"], torch.bfloat16)


def _moe_sizes(G=8, seed=1):
    sizes = torch.randint(0, 700, (G,), generator=torch.Generator().manual_seed(seed))
    sizes[1] = 0
    return sizes.tolist()


@pytest.mark.gpu
@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("gate", ["swiglu", "clamped"])
def test_gpu_bf16_mid_size(interleaved, gate):
    sizes, K, F = _moe_sizes(), 512, 384
    gate_kw = CLAMPED if gate == "clamped" else dict(act=Activation.SILU)
    kw = dict(gate_kw, interleaved=interleaved, probs=torch.rand(sum(sizes), device=DEVICE))
    got, ref = _forward(sizes, K, F, torch.bfloat16, bias=_randn(8, 2 * F, dtype=torch.bfloat16), **kw)
    _check(got, ref, ["h", "z"], torch.bfloat16)
    got, ref = _dgrad(sizes, K, F, torch.bfloat16, **kw)
    _check(got, ref, ["dz", "dprobs", "h"], torch.bfloat16)


@pytest.mark.gpu
def test_gpu_no_host_sync():
    sizes, K, F = _moe_sizes(), 512, 384
    M = sum(sizes)
    split_sizes = torch.tensor(sizes, device="cuda")
    x = _randn(M, K, dtype=torch.bfloat16)
    w1 = _randn(8, 2 * F, K, dtype=torch.bfloat16, scale=K**-0.5)
    w2 = _randn(8, K, F, dtype=torch.bfloat16, scale=F**-0.5)
    probs = torch.rand(M, device="cuda")
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        offsets = group_offsets(split_sizes)
        h, z = grouped_gemm_gated(x, w1.transpose(1, 2), offsets, act=Activation.SILU, probs=probs,
                                  save_preact=True)
        grouped_gemm_dgrad_gated(torch.randn_like(x), w2, offsets, z, act=Activation.SILU,
                                 probs=probs, want_h=True)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()


@pytest.mark.parametrize("loads, stores", [(False, False), (False, True), (True, False)])
@pytest.mark.parametrize("interleaved", [False, True])
def test_tma_operands_pointer_epilogue(loads, stores, interleaved):
    """TMA-fed main loops whose epilogue loads z / stores z, h and dz through pointers (a
    config choice on Hopper, where Triton fences every TMA copy of a column slice)."""
    K, F = SHAPES["aligned"]
    sizes = SPLITS["mixed"]
    probs = torch.rand(sum(sizes), device=DEVICE)
    kw = dict(CLAMPED, interleaved=interleaved, probs=probs)
    fwd_cfg = dataclasses.replace(ggg.pick_config(ggg._configs(), torch.bfloat16, True, interleaved),
                                  tma_epilogue_stores=stores)
    with _config(ggg, fwd_cfg):
        got, ref = _forward(sizes, K, F, torch.bfloat16, **kw)
    _check(got, ref, ["h", "z"], torch.bfloat16)
    dgrad_cfg = dataclasses.replace(ggg_bwd._configs()["tma"], tma_epilogue_loads=loads,
                                    tma_epilogue_stores=stores)
    with _config(ggg_bwd, dgrad_cfg):
        got, ref = _dgrad(sizes, K, F, torch.bfloat16, **kw)
    _check(got, ref, ["dz", "dprobs", "h"], torch.bfloat16)


def _gathered_rows(rows: int, source_rows: int, seed: int) -> torch.Tensor:
    """[rows] int64 indices into ``source_rows`` rows: some read twice or more, some never."""
    return torch.randint(0, max(source_rows - 1, 1), (rows,), generator=torch.Generator().manual_seed(seed)).to(DEVICE)


def _gathered_case(sizes, K, dtype, seed):
    """``(G, M, offsets, src, rows)``: groups of ``sizes`` rows whose operand is ``src[rows]``,
    ``src`` [M // 2 + 3, K] (``_gathered_rows``)."""
    G, M = len(sizes), sum(sizes)
    src = _randn(M // 2 + 3, K, dtype=dtype)
    return G, M, _offsets(sizes), src, _gathered_rows(M, src.shape[0], seed=M + seed)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("split", ["mixed", "one_holds_all", "all_empty"])
@pytest.mark.parametrize("shape", SHAPES)
def test_forward_gathers_rows_of_a(shape, split, interleaved, dtype):
    """``a_rows``: grouped row i is ``a[a_rows[i]]`` (the MoE layer's tokens read in place),
    equal to FC1 of the gathered copy, h and z, with bias and probs."""
    K, F = SHAPES[shape]
    G, M, offsets, a, a_rows = _gathered_case(SPLITS[split], K, dtype, seed=K)
    b = _randn(G, 2 * F, K, dtype=dtype, scale=K**-0.5).transpose(1, 2)
    kw = dict(CLAMPED, interleaved=interleaved, bias=_randn(G, 2 * F, dtype=dtype), probs=torch.rand(M, device=DEVICE))
    out = poison_(torch.empty(M, F, device=DEVICE, dtype=dtype))
    got = grouped_gemm_gated(a, b, offsets, save_preact=True, out=out, a_rows=a_rows, **kw)
    ref = reference_grouped_gemm_gated(a.double().index_select(0, a_rows), b.double(), offsets, save_preact=True,
                                       **_double(kw))
    _check(got, ref, ["h", "z"], dtype)
    reference = reference_grouped_gemm_gated(a, b, offsets, save_preact=True, a_rows=a_rows, **kw)
    _check(reference, ref, ["reference h", "reference z"], dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("interleaved", [False, True])
def test_gpu_gathered_rows_bf16_mid_size(interleaved):
    """FC1 reading a token's rows through the row map, and FC2's dgrad its gradient's, as the MoE
    layer's lean mode calls them: through the library's entry points (the dispatch table), at a
    mid size with an empty expert."""
    from fuseops.kernels import library

    sizes, K, F = _moe_sizes(), 512, 384
    G, M = len(sizes), sum(sizes)
    offsets = _offsets(sizes)
    x = _randn(M // 4 + 1, K, dtype=torch.bfloat16)
    rows = _gathered_rows(M, x.shape[0], seed=5)
    w1 = _randn(G, 2 * F, K, dtype=torch.bfloat16, scale=K**-0.5)
    probs = torch.rand(M, device=DEVICE)
    kw = dict(act=Activation.SILU, interleaved=interleaved, probs=probs)
    got = library.grouped_gemm_gated(x, w1.transpose(1, 2), offsets, save_preact=True, a_rows=rows, **kw)
    ref = reference_grouped_gemm_gated(x.double().index_select(0, rows), w1.double().transpose(1, 2), offsets,
                                       save_preact=True, **_double(kw))
    _check(got, ref, ["h", "z"], torch.bfloat16)
    # FC2's dgrad reading the output gradient's rows the same way (dz, dprobs, h).
    dy, w2 = _randn(x.shape[0], K, dtype=torch.bfloat16), _randn(G, K, F, dtype=torch.bfloat16, scale=F**-0.5)
    z = got[1]
    got = library.grouped_gemm_dgrad_gated(dy, w2, offsets, z, want_h=True, dy_rows=rows, **kw)
    ref = reference_grouped_gemm_dgrad_gated(dy.double().index_select(0, rows), w2.double(), offsets, z.double(),
                                             want_h=True, **_double(kw))
    _check(got, ref, ["dz", "dprobs", "h"], torch.bfloat16)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("split", ["mixed", "empty_ends"])
@pytest.mark.parametrize("shape", SHAPES)
def test_dgrad_gathers_rows_of_dy(shape, split, interleaved, dtype):
    """``dy_rows``: grouped row i of FC2's upstream gradient is ``dy[dy_rows[i]]`` (the MoE
    layer's per-token gradient read in place), equal to the dgrad of the gathered copy: dz,
    dprobs and h."""
    K, F = SHAPES[shape]
    G, M, offsets, dy, dy_rows = _gathered_case(SPLITS[split], K, dtype, seed=F)
    b = _randn(G, K, F, dtype=dtype, scale=F**-0.5)
    z = _randn(M, 2 * F, dtype=dtype)
    kw = dict(CLAMPED, interleaved=interleaved, probs=torch.rand(M, device=DEVICE), want_h=True)
    got = grouped_gemm_dgrad_gated(dy, b, offsets, z, dy_rows=dy_rows, **kw)
    ref = reference_grouped_gemm_dgrad_gated(dy.double().index_select(0, dy_rows), b.double(), offsets, z.double(),
                                             **_double(kw))
    _check(got, ref, ["dz", "dprobs", "h"], dtype)
    reference = reference_grouped_gemm_dgrad_gated(dy, b, offsets, z, dy_rows=dy_rows, **kw)
    _check(reference, ref, ["reference dz", "reference dprobs", "reference h"], dtype)
