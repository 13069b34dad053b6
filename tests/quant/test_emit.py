"""A producer's emitted storage is ``fuseops.quantize`` of its output, bit for bit: every recipe,
float dtype, dense and grouped rows, with and without the column-wise copy, through the Triton
kernels (interpreter) and the torch references."""

import contextlib

import pytest
import torch

import fuseops
from fuseops.kernels._triton import INTERPRET, interpreted_kernels
from fuseops.kernels.dispatch import Kernel, launcher
from fuseops.kernels.elementwise.activation_math import Activation
from fuseops.quant import recipes
from fuseops.quant.emit import EmitPlan, emitted_storage
from fuseops.quant.storage import GroupedQuantizedTensor
from tests.helpers import DTYPES, assert_bitwise, cuda_or_skip

RECIPES = [recipes.FP8CurrentScaling(), recipes.FP8Blockwise(), recipes.MXFP8(), recipes.NVFP4()]
IDS = [type(r).__name__ for r in RECIPES]
# Groups: empty first and middle, one across a 128-row boundary, a 1-row group.
SPLITS = [0, 5, 0, 130, 1]
PATHS = ["reference"] + (["kernels"] if INTERPRET else [])


def _producers(x):
    """(name, launch(x, **kernel_args) -> Emitted): an RMSNorm and a gated activation."""
    weight = torch.randn(x.shape[1], dtype=x.dtype)
    norm = launcher(Kernel.RMSNORM_QUANTIZE_FWD, x)
    gated = launcher(Kernel.GATED_QUANTIZE_FWD, x)
    return [
        ("rmsnorm", lambda **kw: norm(x, weight, 1e-5, **kw)[0]),
        ("swiglu", lambda **kw: gated(x, Activation.SILU, **kw)),
    ]


def _assert_same_storage(got, want, what):
    assert type(got) is type(want) and got.shape == want.shape and got.dtype == want.dtype, what
    assert got.format == want.format, what
    for name in ("data", "scale", "data_t", "scale_t", "tensor_scale"):
        assert_bitwise(getattr(got, name), getattr(want, name), f"{what} {name}")
    if isinstance(want, GroupedQuantizedTensor):
        assert torch.equal(got.offsets, want.offsets), what


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("recipe", RECIPES, ids=IDS)
def test_emitted_storage_is_quantize_of_the_output(recipe, dtype, path):
    x = (torch.randn(sum(SPLITS), 96) * 2).to(dtype)
    offsets = torch.tensor([0] + torch.tensor(SPLITS).cumsum(0).tolist())
    with interpreted_kernels() if path == "kernels" else contextlib.nullcontext():
        for name, produce in _producers(x):
            fmt = recipe.format(fuseops.quant.TensorRole.INPUT)
            # The producer's y, by the same kernel (y is written only where a pass needs it).
            y = produce(scaling=fmt.scaling, element=fmt.element, store_y=True).y
            for columnwise in (False, True):
                plan = EmitPlan(recipe, columnwise)
                emitted = produce(**plan.kernel_args)
                # Grouped rows change only the per-tensor scales and the transposed layout.
                for offs in (None, offsets) if dtype == torch.bfloat16 else (None,):
                    got = emitted_storage(plan, emitted, dtype=dtype, offsets=offs)
                    want = fuseops.quantize(y, recipe, role="input", columnwise=columnwise, offsets=offs)
                    _assert_same_storage(got, want, f"{name} columnwise={columnwise} grouped={offs is not None}")


@pytest.mark.parametrize("recipe", RECIPES, ids=IDS)
def test_single_pass_only_for_block_formats_without_the_transpose(recipe):
    block = isinstance(recipe, (recipes.FP8Blockwise, recipes.MXFP8))
    assert EmitPlan(recipe, columnwise=False).single_pass == block
    assert not EmitPlan(recipe, columnwise=True).single_pass
    assert EmitPlan(recipe, columnwise=False).kernel_args["store_y"] == (not block)


@pytest.mark.gpu
@pytest.mark.parametrize("recipe", [recipes.FP8CurrentScaling(), recipes.NVFP4()], ids=["FP8CurrentScaling", "NVFP4"])
def test_gpu_group_amax_from_row_amaxes_many_groups(recipe):
    """128 groups of random sizes (some empty), as an MoE layer's: the group amaxes the amax
    kernel takes from the producer's row amaxes give ``quantize``'s storage bit for bit."""
    device = cuda_or_skip()
    torch.manual_seed(0)
    sizes = torch.randint(0, 300, (128,))
    sizes[::17] = 0
    offsets = torch.cat([sizes.new_zeros(1), sizes.cumsum(0)]).to(device)
    x = (torch.randn(int(sizes.sum()), 384, device=device) * 3).to(torch.bfloat16)
    produce = launcher(Kernel.GATED_QUANTIZE_FWD, x)
    fmt = recipe.format(fuseops.quant.TensorRole.INPUT)
    y = produce(x, Activation.SILU, scaling=fmt.scaling, element=fmt.element, store_y=True).y
    for columnwise in (False, True):
        plan = EmitPlan(recipe, columnwise)
        got = emitted_storage(plan, produce(x, Activation.SILU, **plan.kernel_args), dtype=x.dtype, offsets=offsets)
        want = fuseops.quantize(y, recipe, role="input", columnwise=columnwise, offsets=offsets)
        _assert_same_storage(got, want, f"columnwise={columnwise}")
