"""``fuseops.quantize(x, recipe)``: a tensor into a quantized storage, on device without host syncs.

Per-tensor formats (FP8 current scaling, NVFP4's tensor scale) run two kernels: the amax
reduction, then the cast reading the scale from device memory; block formats run the cast
alone. Either writes the row-wise and column-wise copies in the same pass. CUDA tensors
(and CPU tensors inside ``interpreted_kernels()``) go through the Triton kernels, other CPU
tensors through their torch references (bit-identical results).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from fuseops.kernels.dispatch import Kernel
from fuseops.kernels.quantization.formats import Scaling, tensor_qmax
from fuseops.kernels.quantized_ops import quantized_launcher
from fuseops.kernels.run_time_check import CHECKS, registered, run_time_check
from fuseops.quant.recipes import QuantFormat, Recipe, TensorRole, as_role, check_recipe
from fuseops.quant.storage import GroupedQuantizedTensor, QuantizedTensor

__all__ = ["quantize", "quantize_derived"]

_INPUT_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)


def _check(x: object, fmt: QuantFormat, offsets: torch.Tensor | None, rowwise: bool, columnwise: bool,
           rows: torch.Tensor | None) -> None:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x: expected a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in _INPUT_DTYPES:
        raise ValueError(f"x: expected dtype float32, float16 or bfloat16 (float64 on the reference path), got {x.dtype}")
    if x.dim() == 0:
        raise ValueError("x: expected at least one dim (the quantized last dim), got a 0-dim tensor")
    for name, value in (("rowwise", rowwise), ("columnwise", columnwise)):
        if not isinstance(value, bool):
            raise TypeError(f"{name}: expected True or False, got {value!r}")
    if not (rowwise or columnwise):
        raise ValueError("rowwise, columnwise: expected at least one of them True, got both False")
    if rows is not None:
        _check_rows(x, fmt, rows)
    if offsets is None:
        return
    if x.dim() != 2:
        raise ValueError(f"x: expected [rows, features] with offsets, got shape {list(x.shape)}")
    if not isinstance(offsets, torch.Tensor) or offsets.dim() != 1 or offsets.shape[0] < 2 or offsets.is_floating_point():
        got = list(offsets.shape) if isinstance(offsets, torch.Tensor) else type(offsets).__name__
        raise ValueError(f"offsets: expected an integer tensor [G + 1] (G >= 1), got {got}")
    if offsets.device != x.device:
        raise ValueError(f"offsets: expected a tensor on {x.device} (x's device), got {offsets.device}")
    if fmt.block_2d:
        raise ValueError("offsets: 128x128 weight tiles need stacked weights [G, N, K] (no offsets), got grouped rows")
    _check_offsets_fit(offsets, x.shape[0] if rows is None else rows.shape[0])


def _check_rows(x: torch.Tensor, fmt: QuantFormat, rows: object) -> None:
    """``rows`` picks rows of a 2-dim ``x``: a 1-dim integer tensor on ``x``'s device, each in
    [0, rows of x). The range is checked as ``_check_offsets_fit`` checks offsets: a ValueError
    on CPU (under torch.compile too, when the graph runs), ``torch._assert_async`` on a device (no
    host sync)."""
    if not isinstance(rows, torch.Tensor) or rows.dim() != 1 or rows.is_floating_point() or rows.is_complex() \
            or rows.dtype == torch.bool:
        got = f"{rows.dtype} {list(rows.shape)}" if isinstance(rows, torch.Tensor) else type(rows).__name__
        raise ValueError(f"rows: expected a 1-dim integer tensor (indices of x's rows), got {got}")
    if x.dim() != 2:
        raise ValueError(f"x: expected [rows, features] with rows, got shape {list(x.shape)}")
    if rows.device != x.device:
        raise ValueError(f"rows: expected a tensor on {x.device} (x's device), got {rows.device}")
    if fmt.block_2d:
        raise ValueError("rows: 128x128 tiles quantize whole stacked weights, not picked rows")
    if rows.numel():
        _on_the_data(ROWS_IN_RANGE, rows, x.shape[0])


def _on_the_data(check: str, t: torch.Tensor, bound: int) -> None:
    """The registered ``check`` of ``t``'s values against ``bound``: while torch.compile traces a
    CPU tensor, by the compiled graph when it runs (``run_time_check``: eager's ValueError, which
    names the values); else now (``_require``)."""
    if t.device.type == "cpu" and torch.compiler.is_compiling():
        run_time_check(check, t, bound, check)
    else:
        CHECKS[check](t, bound, check, "")


ROWS_IN_RANGE, OFFSETS_FIT = "quantize_rows", "quantize_offsets"


@registered(ROWS_IN_RANGE)
def _rows_in_range(rows: torch.Tensor, x_rows: int, *_: str) -> None:
    _require(((rows >= 0) & (rows < x_rows)).all(), rows.device,
             lambda: f"rows: expected indices in [0, {x_rows}) (x's rows), got values from "
                     f"{int(rows.min())} to {int(rows.max())}",
             "rows: expected indices in [0, x's row count)")


def _check_offsets_fit(offsets: torch.Tensor, rows: int) -> None:
    """Offsets must start at 0, never decrease and end at ``rows`` (``_require``)."""
    _on_the_data(OFFSETS_FIT, offsets, rows)


@registered(OFFSETS_FIT)
def _offsets_fit(offsets: torch.Tensor, rows: int, *_: str) -> None:
    o = offsets.to(torch.int64)
    _require((o[0] == 0) & (o[-1] == rows) & (o[1:] >= o[:-1]).all(), o.device,
             lambda: f"offsets: expected non-decreasing row offsets from 0 to {rows} (x's rows), got {o.tolist()}",
             "offsets: expected non-decreasing row offsets from 0 to x's row count")


def _require(ok: torch.Tensor, device: torch.device, message: Callable[[], str], on_device: str) -> None:
    """That the one-element bool tensor ``ok`` holds. On CPU a ValueError of ``message()`` (made
    only on failure: it reads the data; under torch.compile, when the graph runs: ``_on_the_data``);
    on a device ``torch._assert_async(ok, on_device)`` (no host sync: it fails the stream as an
    out-of-range index does, raising at the next synchronisation). ``on_device`` names no row
    count, eagerly and traced alike: formatting a traced (symbolic) one makes the compiler
    specialize the graph to it (a recompile per row count, and torch 2.11's autograd.Function
    capture then fails on the specialized size)."""
    if device.type == "cpu" and not torch.compiler.is_compiling():
        if not bool(ok):
            raise ValueError(message())
    else:
        torch._assert_async(ok, on_device)


def _amax(x: torch.Tensor, x3: torch.Tensor, offsets: torch.Tensor | None, tensors: int,
          rows: torch.Tensor | None) -> torch.Tensor:
    """float32 [tensors]: each tensor's (group's) amax of finite values. Rows picked from ``x``
    more often than ``x`` has rows (MoE's top-k permuted tokens) take their groups' maxima from
    ``x``'s row amaxes, read once, rather than from the picked rows (every pick a read): a maximum
    in any order, so the same bits."""
    if rows is None or rows.shape[0] <= x.shape[0]:
        return quantized_launcher(Kernel.AMAX, x3)(x3, offsets, tensors, rows=rows)
    picked = quantized_launcher(Kernel.ROW_AMAX, x)(x).index_select(0, rows).view(1, -1, 1)
    return quantized_launcher(Kernel.AMAX, picked)(picked, offsets, tensors)


def quantize(
    x: torch.Tensor,
    recipe: Recipe,
    *,
    role: TensorRole | str = TensorRole.INPUT,
    rowwise: bool = True,
    columnwise: bool = False,
    offsets: torch.Tensor | None = None,
    rows: torch.Tensor | None = None,
) -> QuantizedTensor:
    """Quantize ``x`` in ``recipe``'s format for ``role``.

    Args:
        x: float32/float16/bfloat16 tensor [..., C], quantized along its last dim; leading
            dims are flattened to rows. With ``role=WEIGHT`` a 3-dim ``x`` [G, N, K] holds G
            stacked weights, each its own tensor (grouped linear).
        recipe: a ``fuseops.recipes`` instance.
        role: ``TensorRole`` (or "input", "weight", "grad"): E5M2 gradients, 128x128 weight tiles.
        rowwise: keep the row-wise copy (blocks along C: the forward GEMM's operand).
        columnwise: keep the quantized transpose (blocks along rows: dgrad's weight, wgrad's
            operands).
        offsets: int [G + 1] device offsets of the row groups of a 2-dim ``x`` [M, C]
            (mixture of experts): each group gets its own tensor scale, and the column-wise
            copy a per-group padded layout. Returns a ``GroupedQuantizedTensor``.
        rows: int [R] indices of a 2-dim ``x``'s rows: quantize ``x[rows]`` [R, C] (grouped by
            ``offsets``, which then end at R) without writing it out, each row read where it
            lies in ``x``: MoE's permuted tokens, ``x`` the tokens and ``rows`` each sorted
            row's token. Bit for bit ``quantize(x[rows], ...)``; not for 128x128 tiles.
    Returns:
        The storage (``fuseops.quant.storage``); partial blocks at the edges are zero-padded.
    """
    recipe = check_recipe("recipe", recipe)
    if recipe is None:
        raise TypeError("recipe: expected a fuseops.recipes instance, got None")
    role = as_role(role)
    _check(x, recipe.format(role), offsets, rowwise, columnwise, rows)
    # Quantizing is not differentiable: the storage carries no graph, eagerly or compiled (where
    # torch's fallback for an operator without an autograd kernel would make one that gives no grad).
    x = x.detach()
    return quantize_derived(x, recipe, role=role, rowwise=rowwise, columnwise=columnwise, offsets=offsets, rows=rows)


def quantize_derived(x: torch.Tensor, recipe: Recipe, *, role: TensorRole, rowwise: bool, columnwise: bool,
                     offsets: torch.Tensor | None = None, rows: torch.Tensor | None = None) -> QuantizedTensor:
    """``quantize`` without its checks, for fuseops' own calls whose ``offsets`` and ``rows``
    fuseops made: the MoE routing's group offsets (running sums of counts) and each sorted row's
    token (``fuseops.moe.expert_layer_quantized``). Those are in range by construction, so the
    range checks, about ten small kernels a call on a device, are not run (a user's offsets or
    rows go through ``quantize``). ``recipe`` and ``role`` as ``quantize`` has checked them."""
    fmt = recipe.format(role)
    C = x.shape[-1]
    shape = x.shape
    if rows is not None:
        rows = rows.to(torch.int64)
        shape = torch.Size((rows.shape[0], C))
    stacked = role == TensorRole.WEIGHT and x.dim() == 3 and offsets is None
    if offsets is not None:
        offsets = offsets.to(torch.int64)
        x3, tensors = x[None], offsets.shape[0] - 1
    elif rows is not None:
        x3, tensors = x[None], 1
    elif stacked:
        x3, tensors = x, x.shape[0]
    else:
        # Explicit row count: a [4, 0] tensor cannot infer a -1 dim.
        x3, tensors = x.reshape(1, math.prod(x.shape[:-1]), C), 1
    encode = tensor_scale = None
    if fmt.scaling in (Scaling.TENSOR, Scaling.NVFP4):
        amax = _amax(x, x3, offsets, tensors, rows)
        scales = quantized_launcher(Kernel.TENSOR_SCALES, x3)
        encode, tensor_scale = scales(amax, tensor_qmax(fmt.scaling, fmt.element))
    # Row-wise blocks never cross rows, so without the column-wise copy (whose layout is per
    # group) a block format's grouped rows quantize as plain rows: the dense kernel's tiles
    # need not stop at group edges (H100, bf16 [16384, 4096] in 8 groups, of copy bandwidth: FP8
    # blockwise 0.73 -> 0.89, MXFP8 0.83 -> 0.92).
    kernel_offsets = None if fmt.scaling in (Scaling.BLOCK, Scaling.MX) and not columnwise else offsets
    launch = quantized_launcher(Kernel.QUANTIZE, x3)
    bufs = launch(x3, kernel_offsets, encode, scaling=fmt.scaling, element=fmt.element, block_2d=fmt.block_2d,
                  rowwise=rowwise, columnwise=columnwise, rows=rows)
    common = {"format": fmt, "shape": shape, "dtype": x.dtype, "tensor_scale": tensor_scale}
    if stacked:
        return QuantizedTensor(**common, **bufs._asdict(), stacked=True)
    data, scale, data_t, scale_t = (None if t is None else t[0] for t in bufs)
    if data is not None:
        data = data.view(*shape[:-1], data.shape[-1])
        if scale is not None and not fmt.block_2d:
            scale = scale.view(*shape[:-1], scale.shape[-1])
    buffers = {"data": data, "scale": scale, "data_t": data_t, "scale_t": scale_t}
    if offsets is not None:
        return GroupedQuantizedTensor(**common, **buffers, offsets=offsets)
    return QuantizedTensor(**common, **buffers)
