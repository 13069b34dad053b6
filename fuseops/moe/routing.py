"""Mixture-of-experts routing helpers: ``permute`` groups token rows by expert for
``GroupedLinear``, ``unpermute`` combines the experts' outputs back per token::

    x_sorted, split_sizes, row_map = fuseops.moe.permute(x, expert_ids, E)
    y_sorted = experts(x_sorted, split_sizes)
    y = fuseops.moe.unpermute(y_sorted, row_map, weights)

Both are differentiable (in ``x``; in ``y_sorted`` and ``weights``), run on the device
without host syncs (Triton kernels on CUDA, the torch references on CPU and for float64),
and capture in the caller's CUDA graph. Under ``torch.compile`` each kernel is one custom
operator (``kernels/moe/traceable.py``). Out-of-range expert ids (``permute``) and rows (``unpermute``'s ``row_map``) fail loudly:

- CPU tensors (and CUDA with ``FUSEOPS_DEBUG=1``): a ``ValueError`` naming the argument, from
  a host check that reads the values back.
- CUDA tensors: ``torch._assert_async`` on a device flag, so nothing syncs and the check
  captures in a CUDA graph. The Triton kernels set the flag themselves (``permute``'s count
  kernel, ``unpermute``'s gather: one assert launch per call rather than five torch ops);
  under torch.func transforms torch ops compute it. A bad value fails the stream as torch's own
  indexing kernels do: the next synchronising call raises ``RuntimeError`` ("device-side
  assert triggered"; the message names the argument and the range expected), and the CUDA
  context is unusable from then on.
  The kernels clamp ids and rows into range, so nothing reads or writes out of bounds before
  the assert is reported.
- Under ``torch.compile`` (where no tensor's values are known while tracing) the compiled graph
  makes the check of the two above that the call would make eagerly, when it runs
  (``kernels/run_time_check.py``): the same error, with the same values.
"""

from __future__ import annotations

import os

import torch
from torch._C._functorch import maybe_current_level

from fuseops.kernels import autodiff_state
from fuseops.kernels.dispatch import Kernel, launcher, references_forced
from fuseops.kernels.moe import traceable
from fuseops.kernels.run_time_check import registered, run_time_check
from fuseops.ops import _checks
from fuseops.ops.executor.second_backward import once_differentiable

_FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)


def _tensor(name: str, value: object) -> torch.Tensor:
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(value).__name__}")
    return value


def _float_2d(name: str, value: object, what: str) -> torch.Tensor:
    t = _tensor(name, value)
    if t.dtype not in _FLOAT_DTYPES:
        raise TypeError(f"{name}: expected float32, float16, bfloat16 or float64, got {t.dtype}")
    if t.dim() != 2:
        raise ValueError(f"{name}: expected a 2-D tensor {what}, got shape {_checks.shown(t.shape)}")
    return t


def _same_device(name: str, t: torch.Tensor, ref_name: str, ref: torch.Tensor) -> None:
    if t.device != ref.device:
        raise ValueError(f"{name}: expected a tensor on {ref_name}'s device {ref.device}, got {t.device}")


# Where the ids' and rows' range checks run (module docstring); decided once per public call.
HOST = "host"  # read back to the host: a ValueError (CPU tensors, CUDA with FUSEOPS_DEBUG=1)
KERNELS = "kernels"  # a flag the permute / gather kernels set, one torch._assert_async (CUDA)
OPS = "ops"  # torch ops and torch._assert_async (compiling, torch.func: the references run)


def range_check(t: torch.Tensor) -> str:
    """``HOST``, ``KERNELS`` or ``OPS`` for tensors on ``t``'s device now; under torch.compile
    always on the device (values unknown)."""
    if torch.compiler.is_compiling():
        return OPS
    if _read_back(t):
        return HOST
    return KERNELS if maybe_current_level() is None else OPS


def _read_back(t: torch.Tensor) -> bool:
    """Whether ``t``'s range is checked by reading it back (``HOST``): CPU tensors, and CUDA with
    ``FUSEOPS_DEBUG=1``."""
    return not t.is_cuda or os.environ.get("FUSEOPS_DEBUG") == "1"


def _check_range_on_host(name: str, t: torch.Tensor, bound: int, what: str) -> None:
    """``0 <= t < bound``, reading ``t`` back to the host (CPU tensors, or CUDA when
    debugging on request)."""
    if t.numel() == 0:
        return
    lo, hi = (int(v) for v in torch.aminmax(t))  # one reduction for both ends
    if lo < 0 or hi >= bound:
        raise ValueError(f"{_range_expected(name, bound, what)}, got values in [{lo}, {hi}]")


def _range_expected(name: str, bound: int, what: str) -> str:
    """The range check's message, but the values (which a device check cannot name)."""
    return f"{name}: expected values in [0, {bound}) ({what})"


# What the bound of each range check is, in its messages.
EXPERTS = "num_experts={}"
ROWS = "rows of y_sorted, as returned by permute"


# One flag per (check, CUDA device), kept: it is only ever written on a failure, which leaves
# the CUDA context unusable, so a kept flag is 1 whenever it is read. Never kept on CPU (the
# tests' interpreter path, where a failed assert raises and the process goes on) nor from
# inside a CUDA graph capture (its fill would run only on replay).
_FLAGS: dict[tuple[str, torch.device], torch.Tensor] = {}


def _range_flag(name: str, device: torch.device) -> torch.Tensor:
    flag = _FLAGS.get((name, device))
    if flag is None:
        flag = torch.ones(1, dtype=torch.int32, device=device)
        if device.type == "cuda" and not torch.cuda.is_current_stream_capturing():
            _FLAGS[name, device] = flag
    return flag


def _permute_flagged(x: torch.Tensor, expert_ids: torch.Tensor, ok: torch.Tensor, num_experts: int
                     ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    out = launcher(Kernel.PERMUTE, x)(x, expert_ids, num_experts, ids_ok=ok)
    torch._assert_async(ok, _range_expected("expert_ids", num_experts, EXPERTS.format(num_experts)))
    return out


def permute_rows(x: torch.Tensor, expert_ids: torch.Tensor, num_experts: int, check: str
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The ``PERMUTE`` kernel of arguments ``check_routing`` passed, with the range check it
    chose; ``KERNELS``: the ids' range check rides in the count kernel."""
    if check == KERNELS:
        return _permute_flagged(x, expert_ids, _range_flag("expert_ids", x.device), num_experts)
    return traceable.permute(x, expert_ids, num_experts)


def _unpermute_flagged(y_sorted: torch.Tensor, row_map: torch.Tensor, weights: torch.Tensor | None,
                       ok: torch.Tensor) -> tuple[torch.Tensor]:
    y = launcher(Kernel.UNPERMUTE, y_sorted)(y_sorted, row_map, weights, rows_ok=ok)
    torch._assert_async(ok, _range_expected("row_map", y_sorted.shape[0], ROWS))
    return (y,)


def sum_rows(dx_sorted: torch.Tensor, row_map: torch.Tensor) -> torch.Tensor:
    """permute's backward: each token's gradient is the plain sum of its K rows' gradients."""
    return traceable.unpermute(dx_sorted.contiguous(), row_map, None)


def _backward_call(run, *inputs):
    """``run(*inputs)`` for a backward; the references where torch's older vmap batched the
    cotangent (``inputs[0]``: ``is_grads_batched=True``), which no kernel can read."""
    if not autodiff_state.batched_cotangents(inputs[0]):
        return run(*inputs)
    with references_forced():
        return run(*inputs)


def _unpermute_backward(dy: torch.Tensor, row_map: torch.Tensor, weights: torch.Tensor | None,
                        y_sorted: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``(dy_sorted, dweights)``, ``dweights`` None without ``y_sorted``."""
    return traceable.unpermute_bwd(dy.contiguous(), row_map, weights, y_sorted)


def _assert_in_range_async(name: str, t: torch.Tensor, bound: int, what: str) -> None:
    """Device-side check of ``0 <= t < bound`` without a host sync (module docstring); ``what``
    says what the bound is. While torch.compile traces, the check the call would make eagerly,
    by the compiled graph when it runs (``_range_at_run_time``): ``bound`` may be symbolic
    there, and a message naming it would pin the graph to one row count."""
    if torch.compiler.is_compiling():
        run_time_check(RANGE, t, bound, name, what)
    else:
        _assert_in_range_on_device(name, t, bound, what)


def _assert_in_range_on_device(name: str, t: torch.Tensor, bound: int, what: str) -> None:
    if t.numel():
        torch._assert_async(((t >= 0) & (t < bound)).all(), _range_expected(name, bound, what))


RANGE = "routing_range"


@registered(RANGE)
def _range_at_run_time(t: torch.Tensor, bound: int, name: str, what: str) -> None:
    """``0 <= t < bound`` checked as an eager call checks it: read back where ``range_check``
    says so (the CPU, ``FUSEOPS_DEBUG=1``), else asserted on the device."""
    if _read_back(t):
        _check_range_on_host(name, t, bound, what)
    else:
        _assert_in_range_on_device(name, t, bound, what)


class _Permute(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, expert_ids, num_experts, check):
        x_sorted, split_sizes, row_map = permute_rows(x, expert_ids, num_experts, check)
        ctx.mark_non_differentiable(split_sizes, row_map)
        ctx.save_for_backward(row_map)
        return x_sorted, split_sizes, row_map

    @staticmethod
    @once_differentiable
    def backward(ctx, dx_sorted, _split_sizes, _row_map):
        (row_map,) = ctx.saved_tensors
        return _backward_call(sum_rows, dx_sorted, row_map), None, None, None


class _Unpermute(torch.autograd.Function):
    @staticmethod
    def forward(ctx, y_sorted, row_map, weights, check):
        if check == KERNELS:
            (y,) = _unpermute_flagged(y_sorted, row_map, weights, _range_flag("row_map", y_sorted.device))
        else:
            y = traceable.unpermute(y_sorted, row_map, weights)
        # y_sorted is needed only for the weights' gradient.
        keep = y_sorted if ctx.needs_input_grad[2] else None
        ctx.save_for_backward(row_map, weights, keep)
        return y

    @staticmethod
    @once_differentiable
    def backward(ctx, dy):
        row_map, weights, y_sorted = ctx.saved_tensors
        dy_sorted, dweights = _backward_call(_unpermute_backward, dy, row_map, weights, y_sorted)
        return (dy_sorted if ctx.needs_input_grad[0] else None), None, dweights, None


def check_routing(x: object, expert_ids: object, num_experts: object) -> tuple[torch.Tensor, torch.Tensor, str]:
    """``permute``'s arguments checked (ids range-checked: module docstring); ``(x, expert_ids,
    check)``, the tensors contiguous. With ``check == KERNELS`` the range check is left to the
    count kernel: permute them through ``permute_rows`` with that ``check``."""
    x = _float_2d("x", x, "[tokens, hidden]")
    expert_ids = _tensor("expert_ids", expert_ids)
    if expert_ids.dtype.is_floating_point or expert_ids.dtype.is_complex or expert_ids.dtype == torch.bool:
        raise TypeError(f"expert_ids: expected an integer dtype, got {expert_ids.dtype}")
    if expert_ids.dim() != 2 or expert_ids.shape[0] != x.shape[0] or expert_ids.shape[1] < 1:
        raise ValueError(
            f"expert_ids: expected shape [{_checks.shown(x.shape[0])}, top_k] with top_k >= 1 (x has "
            f"{_checks.shown(x.shape[0])} rows), got {_checks.shown(expert_ids.shape)}"
        )
    _same_device("expert_ids", expert_ids, "x", x)
    if isinstance(num_experts, bool) or not isinstance(num_experts, int) or num_experts < 1:
        raise ValueError(f"num_experts: expected an int >= 1, got {num_experts!r}")
    check = range_check(x)
    if check == HOST:
        _check_range_on_host("expert_ids", expert_ids, num_experts, EXPERTS.format(num_experts))
    elif check == OPS:
        _assert_in_range_async("expert_ids", expert_ids, num_experts, EXPERTS.format(num_experts))
    return x.contiguous(), expert_ids.contiguous(), check


def check_weights(weights: object, shape: torch.Size, shape_of: str, rows: torch.Tensor, rows_name: str
                  ) -> torch.Tensor | None:
    """Router weights of ``shape`` [T, K] (``shape_of``'s) in float32 or the dtype of ``rows``
    (the tensor they weight, called ``rows_name``), on its device, or None; contiguous."""
    if weights is None:
        return None
    weights = _tensor("weights", weights)
    if weights.dtype not in (torch.float32, rows.dtype):
        raise TypeError(f"weights: expected float32 or {rows_name}'s dtype {rows.dtype}, got {weights.dtype}")
    if weights.shape != shape:
        raise ValueError(f"weights: expected shape {_checks.shown(shape)} ({shape_of}), "
                         f"got {_checks.shown(weights.shape)}")
    _same_device("weights", weights, rows_name, rows)
    return weights.contiguous()


def permute(
    x: torch.Tensor, expert_ids: torch.Tensor, num_experts: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Group the rows of ``x`` by expert, one row per (token, chosen expert).

    Args:
        x: [T, H] float32, float16, bfloat16 or float64.
        expert_ids: [T, K] any integer dtype, on ``x``'s device: token t's K experts.
        num_experts: E >= 1.
    Returns:
        ``(x_sorted, split_sizes, row_map)``: ``x_sorted`` [T*K, H] in ``x``'s dtype, rows
        grouped by expert ascending and, within an expert, in (token, choice) order;
        ``split_sizes`` [E] int64 on the device (rows per expert, for ``GroupedLinear``);
        ``row_map`` [T, K] int64: the row of ``x_sorted`` holding (t, k), for ``unpermute``.
        Differentiable in ``x``.
    """
    try:
        x, expert_ids, check = check_routing(x, expert_ids, num_experts)
    except (ValueError, TypeError) as error:
        # Eagerly raised at once; while tracing, by the compiled graph (``_checks.refused_while_tracing``).
        x = x if isinstance(x, torch.Tensor) else torch.empty(0)
        empty = x.new_empty(0, dtype=torch.int64)
        return _checks.refused_while_tracing(error, (x, empty, empty.view(0, 0)))
    return permute_checked(x, expert_ids, num_experts, check)


def permute_checked(x: torch.Tensor, expert_ids: torch.Tensor, num_experts: int, check: str
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``permute`` of arguments ``check_routing`` already passed, with the ``check`` it returned
    (no second range check)."""
    if differentiated_by_torch(check):
        if check == KERNELS:
            _assert_in_range_async("expert_ids", expert_ids, num_experts, EXPERTS.format(num_experts))
        with references_forced():
            return traceable.permute(x, expert_ids, num_experts)
    return _Permute.apply(x, expert_ids, num_experts, check)


def differentiated_by_torch(check: str) -> bool:
    """Under torch.func transforms or ``torch.autograd.forward_ad``: ``permute`` and ``unpermute``
    run their torch references (index_select, multiply, sum) as plain torch ops, which torch
    differentiates in either mode and to any order, rather than through ``_Permute`` /
    ``_Unpermute`` (reverse-mode only, once; no ``setup_context`` form for torch.func). Never
    while torch.compile traces (``check`` is ``OPS`` then: nothing more is read, no guard)."""
    if check == OPS and torch.compiler.is_compiling():
        return False
    return autodiff_state.differentiated_by_torch()


def unpermute(
    y_sorted: torch.Tensor, row_map: torch.Tensor, weights: torch.Tensor | None
) -> torch.Tensor:
    """Sum each token's K expert outputs back into one row, weighted.

    ``y[t] = sum_k weights[t, k] * y_sorted[row_map[t, k]]``, accumulated in float32.

    Args:
        y_sorted: [T*K, H] float, rows in ``permute``'s order.
        row_map: [T, K] int64, as returned by ``permute``, on ``y_sorted``'s device.
        weights: [T, K] float32 or ``y_sorted``'s dtype (e.g. router probabilities), or
            None for a plain sum.
    Returns:
        ``y`` [T, H] in ``y_sorted``'s dtype. Differentiable in ``y_sorted`` and ``weights``.
    """
    try:
        y_sorted, row_map, weights, check = _checked_unpermute(y_sorted, row_map, weights)
    except (ValueError, TypeError) as error:
        # Eagerly raised at once; while tracing, by the compiled graph (``_checks.refused_while_tracing``).
        return _checks.refused_while_tracing(error, y_sorted if isinstance(y_sorted, torch.Tensor) else torch.empty(0))
    if differentiated_by_torch(check):
        if check == KERNELS:
            _assert_in_range_async("row_map", row_map, y_sorted.shape[0], ROWS)
        with references_forced():
            return traceable.unpermute(y_sorted.contiguous(), row_map.contiguous(), weights)
    return _Unpermute.apply(y_sorted.contiguous(), row_map.contiguous(), weights, check)


def _checked_unpermute(y_sorted: object, row_map: object, weights: object
                       ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, str]:
    """``unpermute``'s arguments checked: ``(y_sorted, row_map, weights, check)``, ``check`` where
    the rows' range check runs (``range_check``; done here on the host or by torch ops)."""
    y_sorted = _float_2d("y_sorted", y_sorted, "[tokens * top_k, hidden]")
    row_map = _tensor("row_map", row_map)
    if row_map.dtype != torch.int64:
        raise TypeError(f"row_map: expected int64 (as returned by permute), got {row_map.dtype}")
    if row_map.dim() != 2 or row_map.numel() != y_sorted.shape[0]:
        raise ValueError(
            f"row_map: expected shape [tokens, top_k] with tokens * top_k = {_checks.shown(y_sorted.shape[0])} "
            f"(the rows of y_sorted), got {_checks.shown(row_map.shape)}"
        )
    _same_device("row_map", row_map, "y_sorted", y_sorted)
    check = range_check(y_sorted)
    if check == HOST:
        _check_range_on_host("row_map", row_map, y_sorted.shape[0], ROWS)
    elif check == OPS:  # else the gather kernel flags it (_Unpermute)
        _assert_in_range_async("row_map", row_map, y_sorted.shape[0], ROWS)
    weights = check_weights(weights, row_map.shape, "row_map's", y_sorted, "y_sorted")
    return y_sorted, row_map, weights, check
