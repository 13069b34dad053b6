"""The three GEMMs of a linear layer on quantized storages (dense and grouped).

``linear_forward(x, w)`` = x @ w^T, ``linear_dgrad(dy, w)`` = dy @ w, ``linear_wgrad(dy, x)`` =
dy^T @ x. Each takes the copies the GEMM reduces over: the forward the row-wise copies of x and
w, dgrad dy's row-wise and w's column-wise copy, wgrad the column-wise copies of dy and x. A
``GroupedQuantizedTensor`` x / dy with a stacked weight [G, N, K] runs the grouped kernels
(offsets on device, no host sync). CUDA storages (and CPU ones inside
``interpreted_kernels()``) run the Triton kernels, other CPU storages the torch references.
"""

from __future__ import annotations

import torch

from fuseops.kernels.dispatch import Kernel
from fuseops.kernels.quantized_ops import quantized_launcher
from fuseops.quant.storage import GroupedQuantizedTensor, QuantizedTensor

__all__ = ["linear_dgrad", "linear_forward", "linear_wgrad"]


def _need(name: str, q: QuantizedTensor, *, rowwise: bool = False, columnwise: bool = False, why: str) -> None:
    if rowwise and not q.has_rowwise:
        raise ValueError(f"{name}: {why} needs the row-wise copy; quantize it with rowwise=True")
    if columnwise and not q.has_columnwise:
        raise ValueError(f"{name}: {why} needs the column-wise copy; quantize it with columnwise=True")


def _same_scaling(a: QuantizedTensor, b: QuantizedTensor, names: str) -> None:
    if a.format.scaling != b.format.scaling:
        raise ValueError(f"{names}: expected one recipe's formats, got {a.format.scaling.name} and {b.format.scaling.name}")


def _grouped(a: QuantizedTensor, w: QuantizedTensor, names: str) -> bool:
    grouped = isinstance(a, GroupedQuantizedTensor)
    if grouped != w.stacked:
        raise ValueError(f"{names}: a grouped input goes with stacked weights [G, N, K] (and a dense one with a 2-dim weight)")
    return grouped


def _rows_times_weight(a_q: QuantizedTensor, w_q: QuantizedTensor, names: tuple[str, str], why: str, *,
                       columnwise: bool, out_dtype: torch.dtype | None,
                       bias: torch.Tensor | None = None) -> torch.Tensor:
    """``a_q``'s row-wise copy times the weight's row-wise copy transposed (forward) or its
    column-wise copy (dgrad), dense or grouped; the result keeps ``a_q``'s leading dims."""
    _need(names[0], a_q, rowwise=True, why=why)
    _need(names[1], w_q, rowwise=not columnwise, columnwise=columnwise, why=why)
    _same_scaling(a_q, w_q, ", ".join(names))
    a, b = a_q.rowwise_operand(), (w_q.columnwise_operand() if columnwise else w_q.rowwise_operand())
    kwargs = {"scaling": a_q.format.scaling, "out_dtype": out_dtype or a_q.dtype, "bias": bias}
    if _grouped(a_q, w_q, ", ".join(names)):
        return quantized_launcher(Kernel.GROUPED_GEMM_SCALED, a.data)(a, b, a_q.offsets, **kwargs)
    y = quantized_launcher(Kernel.GEMM_SCALED, a.data)(a, b, **kwargs)
    return y.view(*a_q.shape[:-1], y.shape[-1])


def linear_forward(x: QuantizedTensor, weight: QuantizedTensor, *, bias: torch.Tensor | None = None,
                   out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """``y = x @ weight^T (+ bias)``.

    Args:
        x: [..., K] (or grouped [M, K]), row-wise copy.
        weight: [N, K] (or stacked [G, N, K]), row-wise copy.
        bias: [N] (grouped: [G, N]) or None.
        out_dtype: dtype of y; default x's high-precision dtype.
    Returns:
        y [..., N] (grouped: [M, N]).
    """
    return _rows_times_weight(x, weight, ("x", "weight"), "the forward GEMM", columnwise=False,
                              out_dtype=out_dtype, bias=bias)


def linear_dgrad(dy: QuantizedTensor, weight: QuantizedTensor, *, out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """``dx = dy @ weight``.

    Args:
        dy: [..., N] (or grouped [M, N]), row-wise copy.
        weight: [N, K] (or stacked [G, N, K]), column-wise copy.
        out_dtype: dtype of dx; default dy's high-precision dtype.
    Returns:
        dx [..., K] (grouped: [M, K]).
    """
    return _rows_times_weight(dy, weight, ("dy", "weight"), "the input-gradient GEMM", columnwise=True,
                              out_dtype=out_dtype)


def linear_wgrad(dy: QuantizedTensor, x: QuantizedTensor, *, out_dtype: torch.dtype | None = None,
                 main_grad: torch.Tensor | None = None) -> torch.Tensor:
    """``dw = dy^T @ x`` (grouped: per group, [G, N, K]).

    Args:
        dy: [..., N] (or grouped [M, N]), column-wise copy.
        x: [..., K] (or grouped [M, K], the same offsets), column-wise copy.
        out_dtype: dtype of dw; default x's high-precision dtype.
        main_grad: float32 [N, K] ([G, N, K]) to add dw into and return, or None.
    Returns:
        dw [N, K] (grouped: [G, N, K]), or ``main_grad``.
    """
    _need("dy", dy, columnwise=True, why="the weight-gradient GEMM")
    _need("x", x, columnwise=True, why="the weight-gradient GEMM")
    _same_scaling(dy, x, "dy, x")
    out_dtype = out_dtype or x.dtype
    a, b = dy.columnwise_operand(), x.columnwise_operand()
    scaling = dy.format.scaling
    if isinstance(dy, GroupedQuantizedTensor):
        launch = quantized_launcher(Kernel.GROUPED_GEMM_SCALED_WGRAD, a.data)
        return launch(a, b, dy.offsets, scaling=scaling, out_dtype=out_dtype, main_grad=main_grad)
    launch = quantized_launcher(Kernel.GEMM_SCALED, a.data)
    return launch(a, b, scaling=scaling, out_dtype=out_dtype, main_grad=main_grad)
