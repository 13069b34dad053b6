"""fuseops.quant.quantize and the storages it returns: layouts, validation, the kernel path
against the reference path, dequantize, and the buffer round trip the fuser relies on."""

from __future__ import annotations

import contextlib
import dataclasses

import pytest
import torch

from fuseops.kernels._triton import interpreted_kernels
from fuseops.kernels.gemm.grouped import group_offsets
from fuseops.kernels.quantization.grouped_layout import padded_rows
from fuseops.quant import GroupedQuantizedTensor, QuantizedTensor, quantize, recipes
from tests.helpers import sqnr_db

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
RECIPES = {
    "fp8_current": recipes.FP8CurrentScaling(),
    "fp8_blockwise": recipes.FP8Blockwise(),
    "mxfp8": recipes.MXFP8(),
    "nvfp4": recipes.NVFP4(),
}
# Dequantized SQNR of Gaussian data (dB): what each element type's mantissa gives, less margin.
MIN_SQNR = {"fp8_current": 29, "fp8_blockwise": 29, "mxfp8": 29, "nvfp4": 18}
SIZES = [3, 0, 130, 20]


def kernels():
    """The Triton kernels: on CUDA by default, through the interpreter on CPU."""
    return contextlib.nullcontext() if DEVICE == "cuda" else interpreted_kernels()


def bytes_of(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.uint8) if t.element_size() == 1 else t


def assert_same_storage(a: QuantizedTensor, b: QuantizedTensor) -> None:
    assert type(a) is type(b) and a.format == b.format and a.shape == b.shape
    for x, y in zip(a.data_tensors(), b.data_tensors()):
        assert x.shape == y.shape and x.dtype == y.dtype
        assert torch.equal(bytes_of(x), bytes_of(y))


@pytest.mark.parametrize("name", RECIPES)
def test_dense_activation_layout(name):
    x = torch.randn(2, 35, 96, device=DEVICE, dtype=torch.bfloat16)
    q = quantize(x, RECIPES[name], columnwise=True)
    assert q.shape == x.shape and q.dtype == torch.bfloat16 and not q.stacked
    packed = 2 if name == "nvfp4" else 1
    assert q.data.shape == (2, 35, 96 // packed)
    assert q.data_t.shape == (96, 70 // packed)
    block = RECIPES[name].format("input").block
    if block:
        assert q.scale.shape == (2, 35, -(-96 // block)) and q.scale_t.shape == (96, -(-70 // block))
    assert (q.tensor_scale is None) == (name in ("fp8_blockwise", "mxfp8"))
    assert sqnr_db(q.dequantize(), x) > MIN_SQNR[name]


def test_weight_tiles_and_stacked_weights():
    q = quantize(torch.randn(300, 200, device=DEVICE), recipes.FP8Blockwise(), role="weight", columnwise=True)
    assert q.scale.shape == (3, 2) and q.scale_t.shape == (2, 3) and q.data_t.shape == (200, 300)
    # One scale per 128x128 tile: both copies dequantize to the same values.
    assert torch.equal(q.dequantize(), q.keep(rowwise=False, columnwise=True).dequantize())
    w = torch.randn(4, 48, 80, device=DEVICE)
    s = quantize(w, recipes.FP8CurrentScaling(), role="weight", columnwise=True)
    assert s.stacked and s.data.shape == (4, 48, 80) and s.data_t.shape == (4, 80, 48)
    assert s.tensor_scale.shape == (4,)
    assert torch.equal(s.dequantize(), s.keep(rowwise=False, columnwise=True).dequantize())
    for g in range(4):
        alone = quantize(w[g], recipes.FP8CurrentScaling(), role="weight")
        assert torch.equal(bytes_of(alone.data), bytes_of(s.data[g]))


@pytest.mark.parametrize("name", RECIPES)
def test_grouped_layout(name):
    if name == "fp8_blockwise":
        pytest.skip("covered below: grouped inputs use 1x128 blocks")
    offsets = group_offsets(torch.tensor(SIZES, device=DEVICE))
    x = torch.randn(sum(SIZES), 64, device=DEVICE)
    q = quantize(x, RECIPES[name], offsets=offsets.to(torch.int32), columnwise=True)
    assert isinstance(q, GroupedQuantizedTensor) and q.num_groups == 4
    assert q.offsets.dtype == torch.int64
    assert q.data_t.shape[-1] * (2 if name == "nvfp4" else 1) == padded_rows(sum(SIZES), 4)
    rows, cols = q.dequantize(), q.keep(rowwise=False, columnwise=True).dequantize()
    assert sqnr_db(rows, x) > MIN_SQNR[name] and sqnr_db(cols, x) > MIN_SQNR[name]
    if name == "fp8_current":
        # Per-group tensor scales: each group as if quantized alone.
        assert torch.equal(rows, cols)
        alone = quantize(x[3:133], RECIPES[name])
        assert torch.equal(rows[3:133], alone.dequantize())


@pytest.mark.parametrize("name", RECIPES)
def test_grouped_rows_alone_match_rows_with_columns(name):
    """Without the column-wise copy a block format's grouped rows go through the dense kernel:
    the same bytes as the grouped kernel's row-wise copy."""
    offsets = group_offsets(torch.tensor(SIZES, device=DEVICE))
    x = torch.randn(sum(SIZES), 70, device=DEVICE).to(torch.bfloat16)
    with kernels():
        both = quantize(x, RECIPES[name], role="grad", columnwise=True, offsets=offsets)
        rows = quantize(x, RECIPES[name], role="grad", offsets=offsets)
    assert isinstance(rows, GroupedQuantizedTensor) and rows.data_t is None and rows.num_groups == 4
    for name_, kept in (("data", rows.data), ("scale", rows.scale), ("tensor_scale", rows.tensor_scale)):
        other = getattr(both, name_)
        assert (kept is None) == (other is None), name_
        if kept is not None:
            assert torch.equal(bytes_of(kept), bytes_of(other)), name_


@pytest.mark.parametrize("name", RECIPES)
@pytest.mark.parametrize("layout", ["dense", "grouped"])
def test_kernels_match_reference_path(name, layout):
    if DEVICE == "cuda":
        pytest.skip("the reference path is the CPU path")
    recipe = RECIPES[name]
    offsets = group_offsets(torch.tensor(SIZES)) if layout == "grouped" else None
    x = torch.randn(sum(SIZES), 70).to(torch.bfloat16)
    reference = quantize(x, recipe, role="grad", columnwise=True, offsets=offsets)
    with interpreted_kernels():
        kernel = quantize(x, recipe, role="grad", columnwise=True, offsets=offsets)
    assert_same_storage(kernel, reference)


def test_float64_runs_the_reference():
    x = torch.randn(40, 64, dtype=torch.float64, device=DEVICE)
    q = quantize(x, recipes.MXFP8(), columnwise=True)
    assert q.dequantize().dtype == torch.float64
    assert q.dequantize(torch.float32).dtype == torch.float32


@pytest.mark.parametrize("name", RECIPES)
def test_buffer_round_trip(name):
    offsets = group_offsets(torch.tensor(SIZES, device=DEVICE))
    for q in (quantize(torch.randn(50, 64, device=DEVICE), RECIPES[name], columnwise=True),
              quantize(torch.randn(sum(SIZES), 64, device=DEVICE), RECIPES[name], columnwise=True, offsets=offsets)):
        buffers = q.data_tensors()
        assert all(isinstance(t, torch.Tensor) for t in buffers)
        rebuilt = q.with_data_tensors([t.clone() for t in buffers])
        assert_same_storage(rebuilt, q)
        assert torch.equal(rebuilt.dequantize(), q.dequantize())
        assert len(q.keep(rowwise=False, columnwise=True).data_tensors()) < len(buffers)
        with pytest.raises(ValueError, match=f"buffers: expected {len(buffers)} tensors"):
            q.with_data_tensors(buffers[:-1])
    with pytest.raises(dataclasses.FrozenInstanceError):
        q.data = None


def test_keep_and_operands():
    q = quantize(torch.randn(3, 10, 64, device=DEVICE), recipes.MXFP8())
    assert q.rowwise_operand().data.shape == (30, 64) and q.rowwise_operand().scale.shape == (30, 2)
    with pytest.raises(ValueError, match="keep: asked rowwise=False, columnwise=True"):
        q.keep(rowwise=False, columnwise=True)


def test_errors_name_argument_given_and_expected():
    x = torch.randn(8, 64, device=DEVICE)
    fp8 = recipes.FP8CurrentScaling()
    cases = [
        (dict(x=x.int(), recipe=fp8), ValueError, "x: expected dtype float32, float16 or bfloat16.*got torch.int32"),
        (dict(x=torch.tensor(1.0), recipe=fp8), ValueError, "x: expected at least one dim"),
        (dict(x=[1.0], recipe=fp8), TypeError, "x: expected a torch.Tensor, got list"),
        (dict(x=x, recipe="fp8"), TypeError, "recipe: expected None or one of"),
        (dict(x=x, recipe=None), TypeError, "recipe: expected a fuseops.recipes instance, got None"),
        (dict(x=x, recipe=fp8, role="activation"), ValueError, "role: expected a TensorRole or one of"),
        (dict(x=x, recipe=fp8, rowwise=False), ValueError, "rowwise, columnwise: expected at least one"),
        (dict(x=x[None], recipe=fp8, offsets=torch.tensor([0, 8])), ValueError, r"x: expected \[rows, features\] with offsets, got shape \[1, 8, 64\]"),
        (dict(x=x, recipe=fp8, offsets=torch.tensor([8.0])), ValueError, r"offsets: expected an integer tensor \[G \+ 1\]"),
        (dict(x=x, recipe=recipes.FP8Blockwise(), role="weight", offsets=torch.tensor([0, 8], device=DEVICE)),
         ValueError, "offsets: 128x128 weight tiles need stacked weights"),
    ]
    for kwargs, error, message in cases:
        with pytest.raises(error, match=message):
            quantize(kwargs.pop("x"), kwargs.pop("recipe"), **kwargs)


def _paths():
    return [pytest.param(False, id="reference"), pytest.param(True, id="kernels")]


def _quantize(x, recipe, path, **kw):
    with kernels() if path else contextlib.nullcontext():
        return quantize(x, recipe, **kw)


@pytest.mark.parametrize("path", _paths())
@pytest.mark.parametrize("role", ["input", "grad"])
@pytest.mark.parametrize("name", RECIPES)
def test_non_finite_values_keep_their_element_and_erase_nothing(name, role, path):
    """Scales come from the finite values alone: the tensor with one inf equals the tensor
    with a 0 there everywhere else, bit for bit. E4M3 stores NaN for an inf (it has none),
    E5M2 the inf; NVFP4 (E2M1 has neither) marks only the block of 16 holding it NaN."""
    x = torch.randn(8, 64, device=DEVICE) * 3
    bad = [(1, 3, float("inf")), (4, 40, -float("inf")), (6, 17, float("nan"))]
    clean = x.clone()
    for r, c, v in bad:
        clean[r, c] = 0.0
        x[r, c] = v
    for columnwise in (False, True):
        q = _quantize(x, RECIPES[name], path, role=role, columnwise=columnwise, rowwise=not columnwise)
        ref = _quantize(clean, RECIPES[name], path, role=role, columnwise=columnwise, rowwise=not columnwise)
        y, y_clean = q.dequantize(), ref.dequantize()
        marked = torch.zeros_like(x, dtype=torch.bool)
        for r, c, v in bad:
            if name == "nvfp4":
                # Row-wise blocks run along columns, column-wise ones along rows.
                if columnwise:
                    marked[r // 16 * 16:(r // 16 + 1) * 16, c] = True
                else:
                    marked[r, c // 16 * 16:(c // 16 + 1) * 16] = True
            else:
                marked[r, c] = True
        assert torch.equal(~torch.isfinite(y), marked), (name, role, columnwise)
        assert torch.equal(y[~marked], y_clean[~marked])
        if name != "nvfp4" and role == "grad" and RECIPES[name].format("grad").element.name == "E5M2":
            assert y[1, 3] == float("inf") and y[4, 40] == -float("inf")
        assert y[6, 17].isnan()


@pytest.mark.parametrize("path", _paths())
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("role", ["input", "weight", "grad"])
@pytest.mark.parametrize("name", RECIPES)
def test_finite_values_at_the_dtype_max_dequantize_finite(name, role, dtype, path):
    """The dtype's maximum stays finite: a power-of-two scale then FP8 rounding up must not
    turn it into inf."""
    fmax = torch.finfo(dtype).max
    x = torch.randn(4, 256, device=DEVICE).to(dtype)
    x[0] = fmax
    x[1, ::2] = -fmax
    x[2] = fmax * 0.999
    x[3, :128] = (torch.linspace(-1, 1, 128, dtype=torch.float64) * fmax).to(dtype)
    q = _quantize(x, RECIPES[name], path, role=role, columnwise=True)
    for copy in ("rowwise", "columnwise"):
        y = q.keep(rowwise=copy == "rowwise", columnwise=copy == "columnwise").dequantize()
        assert y.dtype == dtype and torch.isfinite(y).all(), (name, role, dtype, copy)
        # The maxima stay within two FP8 steps of themselves (E2M1: within its range).
        top = torch.cat([y[0], y[1, ::2]]).float().abs()
        assert (top <= fmax).all() and (top >= fmax * (0.6 if name == "nvfp4" else 0.85)).all()


@pytest.mark.parametrize("name", RECIPES)
def test_kernels_match_reference_on_non_finite_and_huge_values(name):
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        fmax = torch.finfo(dtype).max
        x = torch.randn(5, 160, device=DEVICE).to(dtype)
        x[0, 0], x[1, 5], x[2, 7], x[3, 9], x[4] = float("inf"), -fmax, float("nan"), -float("inf"), fmax
        for role in ("input", "weight", "grad"):
            got = _quantize(x, RECIPES[name], True, role=role, columnwise=True)
            ref = _quantize(x, RECIPES[name], False, role=role, columnwise=True)
            assert_same_storage(got, ref)


@pytest.mark.parametrize("name", RECIPES)
def test_empty_last_dim_quantizes_to_empty_storage(name):
    for shape in ((4, 0), (0, 0), (2, 0, 3)):
        for path in (False, True):
            x = torch.randn(*shape, device=DEVICE)
            q = _quantize(x, RECIPES[name], path, columnwise=True)
            y = q.dequantize()
            assert y.shape == x.shape and y.dtype == x.dtype


@pytest.mark.parametrize("path", _paths())
@pytest.mark.parametrize("layout", ["dense", "grouped"])
@pytest.mark.parametrize("name", RECIPES)
def test_picked_rows_equal_quantizing_the_gathered_tensor(name, layout, path):
    """``rows=`` quantizes ``x[rows]`` without writing it out (MoE's permuted tokens): the same
    storage, bit for bit, for every copy and role, with repeated and unpicked rows, an empty
    group, and rows holding an inf and a NaN (their groups' scales come from the finite rest)."""
    x = (torch.randn(9, 160, device=DEVICE) * 3).to(torch.bfloat16)
    x[2, 7], x[5, 100] = float("inf"), float("nan")
    # More picks than rows (the per-tensor amaxes from x's row amaxes) and fewer (from the picks).
    for picked, sizes in (([3, 0, 8, 8, 1, 2, 5, 0, 3, 3, 6, 2, 7, 1], [4, 0, 7, 3]), ([8, 2, 2, 4], [2, 0, 2])):
        picked = torch.tensor(picked, device=DEVICE)
        offsets = group_offsets(torch.tensor(sizes, device=DEVICE)) if layout == "grouped" else None
        for role in ("input", "grad"):
            for rowwise, columnwise in ((True, False), (False, True), (True, True)):
                kw = dict(role=role, rowwise=rowwise, columnwise=columnwise, offsets=offsets)
                got = _quantize(x, RECIPES[name], path, rows=picked, **kw)
                assert got.shape == (len(picked), 160)
                assert_same_storage(got, _quantize(x[picked], RECIPES[name], path, **kw))


@pytest.mark.parametrize("name", RECIPES)
def test_no_picked_rows_quantize_to_empty_storage(name):
    x = torch.randn(5, 64, device=DEVICE)
    none = torch.zeros(0, dtype=torch.int64, device=DEVICE)
    for path in (False, True):
        q = _quantize(x, RECIPES[name], path, rows=none, columnwise=True,
                      offsets=torch.zeros(3, dtype=torch.int64, device=DEVICE))
        assert q.dequantize().shape == (0, 64)


def test_picked_rows_errors_name_argument_given_and_expected():
    x = torch.randn(6, 32)
    recipe = recipes.FP8CurrentScaling()
    cases = [
        (dict(rows=torch.tensor([0.0, 1.0])),
         r"rows: expected a 1-dim integer tensor \(indices of x's rows\), got torch.float32"),
        (dict(rows=torch.tensor([[0, 1]])), r"rows: expected a 1-dim integer tensor .*got torch.int64 \[1, 2\]"),
        (dict(rows=[0, 1]), r"rows: expected a 1-dim integer tensor .*got list"),
        (dict(rows=torch.tensor([0, 6])), r"rows: expected indices in \[0, 6\) \(x's rows\), got values from 0 to 6"),
        (dict(rows=torch.tensor([-1, 2])), r"rows: expected indices in \[0, 6\) \(x's rows\), got values from -1 to 2"),
        (dict(rows=torch.tensor([0, 1, 2]), offsets=torch.tensor([0, 2, 4])),
         r"offsets: expected non-decreasing row offsets from 0 to 3 \(x's rows\)"),
    ]
    for kwargs, message in cases:
        with pytest.raises(ValueError, match=message):
            quantize(x, recipe, **kwargs)
    with pytest.raises(ValueError, match=r"x: expected \[rows, features\] with rows, got shape \[2, 3, 32\]"):
        quantize(torch.randn(2, 3, 32), recipe, rows=torch.tensor([0]))
    with pytest.raises(ValueError, match="rows: 128x128 tiles quantize whole stacked weights"):
        quantize(x, recipes.FP8Blockwise(), role="weight", rows=torch.tensor([0]))


@pytest.mark.parametrize("offsets", [[0, 2, 5], [1, 2, 4], [0, 3, 2, 4], [0, 2, 3]])
def test_offsets_that_do_not_fit_the_rows_are_rejected(offsets):
    x = torch.randn(4, 32)
    with pytest.raises(ValueError, match=r"offsets: expected non-decreasing row offsets from 0 to 4 \(x's rows\), got \["):
        quantize(x, recipes.MXFP8(), offsets=torch.tensor(offsets), columnwise=True)


@pytest.mark.gpu
@pytest.mark.parametrize("argument, values, recipe", [
    ("offsets", "[0, 2, 5]", "MXFP8"),
    ("rows", "[0, 4]", "FP8CurrentScaling"),
], ids=["offsets", "rows"])
def test_gpu_bad_offsets_or_rows_fail_on_the_stream_without_a_sync(argument, values, recipe):
    # A device-side assert leaves the CUDA context unusable: run it in its own process. The bad
    # tensor is made before sync-debug mode: a copy from a Python list synchronises by itself.
    from tests.helpers import run_device_assert

    out = run_device_assert(
        "import torch; from fuseops.quant import quantize, recipes\n"
        "x = torch.randn(4, 32, device='cuda')\n"
        f"bad = torch.tensor({values}, device='cuda')\n"
        "torch.cuda.set_sync_debug_mode('error')\n"
        f"quantize(x, recipes.{recipe}(), {argument}=bad, columnwise=True)\n"
        "torch.cuda.set_sync_debug_mode('default')\n"
        "torch.cuda.synchronize()\n")
    # The assert fires on the device and surfaces at the next CUDA call: on the H100 that can
    # be the cast's own launch after the check, or the synchronize. Under
    # sync-debug "error" no call on the way synchronised, and the message names the argument.
    assert out.returncode != 0 and "device-side assert" in out.stderr, out.stderr
    assert argument in out.stderr and "called a synchronizing CUDA operation" not in out.stderr, out.stderr
