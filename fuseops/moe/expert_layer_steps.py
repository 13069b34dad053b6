"""``expert_layer``'s forward and backward bodies (``expert_layer.py`` has the layer, its autograd
Function and its checks).

Eagerly each body runs as it is. Under ``torch.compile`` each is one custom operator
(``fuseops::expert_layer_forward`` / ``fuseops::expert_layer_backward``) whose implementation is
that body: the compiled graph holds one node per direction rather than every launcher's Python.
The operators are functional (no input written: a compiled backward never overwrites or frees a
saved tensor, ``graph_freed_after_backward``) and return an empty tensor for an absent result.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from fuseops.kernels import library
from fuseops.kernels.custom_op import fuseops_op
from fuseops.kernels.dispatch import Kernel, launcher, references_forced
from fuseops.kernels.elementwise.activation_math import AnyActivation, activation_code, activation_from_code
from fuseops.moe import memory_model
from fuseops.moe.routing import permute_rows


@dataclass(frozen=True)
class Gate:
    """The gated activation between the GEMMs: its kind and the kernels' keyword arguments."""

    act: AnyActivation
    kernel_args: dict[str, Any]

    def fields(self) -> tuple:
        """The operators' gate arguments: act, interleaved, clamped, limit, alpha."""
        k = self.kernel_args
        return (activation_code(self.act), bool(k["interleaved"]), bool(k["clamped"]), float(k["limit"]),
                float(k["alpha"]))

    @staticmethod
    def of(act: int, interleaved: bool, clamped: bool, limit: float, alpha: float) -> Gate:
        kernel_args = {"interleaved": interleaved, "clamped": clamped, "limit": limit, "alpha": alpha}
        return Gate(activation_from_code(act), kernel_args)


def _gather_rows(x: torch.Tensor, row_map: torch.Tensor) -> torch.Tensor:
    """``x_sorted[row_map[t, k]] = x[t]``: permute's copy, for a known routing."""
    x_sorted, _ = launcher(Kernel.UNPERMUTE_BWD, x)(x, row_map, None, None)
    return x_sorted


def sum_token_rows(rows: torch.Tensor, row_map: torch.Tensor) -> torch.Tensor:
    """``out[t] = sum_k rows[row_map[t, k]]``, in float32, k in order (deterministic)."""
    return launcher(Kernel.UNPERMUTE, rows)(rows, row_map, None)


def token_of_rows(row_map: torch.Tensor) -> torch.Tensor:
    """[T*K] int64: the token whose row each sorted row is (``row_map``'s inverse, // K)."""
    flat = row_map.reshape(-1)
    tokens = torch.arange(flat.numel(), device=flat.device) // row_map.shape[1]
    return torch.empty_like(flat).scatter_(0, flat, tokens)


def _release(*tensors: torch.Tensor | None) -> None:
    """Free the memory of saved tensors that are dead: the autograd node would hold them to
    the end of the backward. Only for tensors this Function made, when nothing reads them again
    (the graph is freed after this backward and no saved-tensor hook holds them)."""
    for t in tensors:
        if t is not None:
            t.untyped_storage().resize_(0)


def _forward(x, weights, w1, b1, w2, expert_ids, *, gate: Gate, keep: bool, gather: bool, check: str) -> tuple:
    """``(y, row_map, z, probs, offsets)``, z None unless ``keep``. No permuted copy of x
    outlives FC1: ``gather``, FC1 reads x's rows through the row map in its loads; else it
    reads a copy made for it alone: the copy and the TMA kernel together run 0.99-1.61x the
    gathered FC1's speed over the MoE shapes measured (``python -m benchmarks.gathered_gemm``,
    benchmarks/results/gathered_gemm-h200-2026-11-29.json)."""
    if gather:
        # The routing alone (a permute of no columns).
        _, split_sizes, row_map = permute_rows(x[:, :0], expert_ids, w1.shape[0], check)
        a, a_rows = x, token_of_rows(row_map)
    else:
        a, split_sizes, row_map = permute_rows(x, expert_ids, w1.shape[0], check)
        a_rows = None
    offsets = launcher(Kernel.GROUP_OFFSETS, split_sizes)(split_sizes)
    probs = None
    if weights is not None:
        # The weights in expert row order: FC1's epilogue row scale.
        probs = weights.new_empty(row_map.numel()).scatter_(0, row_map.reshape(-1), weights.reshape(-1))
    h, z = library.grouped_gemm_gated(a, w1.transpose(1, 2), offsets, bias=b1, act=gate.act, probs=probs,
                                      save_preact=keep, a_rows=a_rows, **gate.kernel_args)
    del a
    y_sorted, _ = library.grouped_gemm(h, w2.transpose(1, 2), offsets)
    del h
    return sum_token_rows(y_sorted, row_map), row_map, z, probs, offsets


def _backward(dy, x, z, probs, row_map, offsets, w1, b1, w2, *, static: tuple,
              main_grads: tuple = (None, None)) -> tuple:
    """``(dx, dweights, dw1, db1, dw2)`` of ``_ExpertLayer``; ``static`` as its backward makes it.
    A weight gradient with a float32 buffer in ``main_grads`` (FC1's, FC2's) is added to it by
    the wgrad kernel and comes back None."""
    gate, lean, needs, overwrite, fc1_first, x_parts = static
    need_x, need_weights, need_w1, need_b1, need_w2 = needs
    main_grad1, main_grad2 = main_grads
    # ``loss.sum()``'s gradient is one element expanded: the kernels read rows of a dense tensor.
    dy = dy.contiguous()
    tokens = None
    if lean:
        # FC1 again on x's rows, gathered in its loads: no x_sorted.
        tokens = token_of_rows(row_map)
        z, _ = library.grouped_gemm(x, w1.transpose(1, 2), offsets, bias=b1, a_rows=tokens)
    # FC2's gradients read dy's rows in expert order: a sorted copy, or (lean) dy through tokens.
    dy_grouped = dy if lean else _gather_rows(dy, row_map)
    dz = dprobs = h = None
    if need_x or need_w1 or need_b1 or need_weights:
        dz, dprobs, h = library.grouped_gemm_dgrad_gated(
            dy_grouped, w2, offsets, z, act=gate.act, probs=probs, want_h=need_w2,
            out=z if overwrite else None, dy_rows=tokens, **gate.kernel_args)
    elif need_w2:
        h = launcher(Kernel.GATED_FWD, z)(z, gate.act, probs=probs, **gate.kernel_args)
    dw2 = None
    if need_w2 and not fc1_first:
        dw2 = library.grouped_gemm_wgrad(dy_grouped, h, offsets, main_grad=main_grad2, dy_rows=tokens)
    if not fc1_first:
        h = dy_grouped = None

    dx = dw1 = db1 = None
    if need_x:
        dx_sorted, _ = library.grouped_gemm(dz, w1, offsets)
        dx = sum_token_rows(dx_sorted, row_map)
        del dx_sorted
    if need_w1 and lean:
        # x's rows gathered inside the wgrad's loads: no x_sorted at this, lean's peak stage.
        dw1 = library.grouped_gemm_wgrad(dz, x, offsets, x_rows=tokens, main_grad=main_grad1)
    elif need_w1:
        dw1 = _fc1_weight_grad(dz, x, row_map, offsets, main_grad1, x_parts)
    if need_b1:
        db1 = library.grouped_bias_grad(dz, offsets)
    if fc1_first:
        if lean:
            z = dz = None
        else:
            _release(z)
        if need_w2:
            dw2 = library.grouped_gemm_wgrad(dy_grouped, h, offsets, main_grad=main_grad2, dy_rows=tokens)
    dweights = None
    if need_weights:
        dweights = dprobs.index_select(0, row_map.reshape(-1)).view(row_map.shape)
    return (dx, dweights, None if main_grad1 is not None else dw1, db1,
            None if main_grad2 is not None else dw2)


def _fc1_weight_grad(dz, x, row_map, offsets, main_grad, parts: int) -> torch.Tensor:
    """FC1's weight gradient from x's rows in expert order, made for it alone, in ``parts``
    column slices (``memory_model.column_parts``), each freed after its GEMM: the TMA wgrad
    reads a copy faster than its pointer loads gather the rows (``python -m
    benchmarks.gathered_gemm``, benchmarks/results/gathered_gemm-h200-2026-11-29.json), and a
    slice of the copy at a time keeps it off the peak where memory_model finds it there."""
    if parts == 1:
        # Out of place: a cotangent batched by vmap (backward_batched) cannot be written into an
        # unbatched dw.
        return library.grouped_gemm_wgrad(dz, _gather_rows(x, row_map), offsets, main_grad=main_grad)
    H = x.shape[1]
    dw = main_grad if main_grad is not None else x.new_empty(offsets.shape[0] - 1, dz.shape[1], H)
    for start, stop in memory_model.column_parts(H, parts):
        x_part = _gather_rows(x[:, start:stop], row_map)
        target = dw[:, :, start:stop]
        if main_grad is not None:
            library.grouped_gemm_wgrad(dz, x_part, offsets, main_grad=target)
        else:
            library.grouped_gemm_wgrad(dz, x_part, offsets, out=target)
        del x_part
    return dw


def forward(x, weights, w1, b1, w2, expert_ids, gate: Gate, keep: bool, gather: bool, check: str) -> tuple:
    """``(y, row_map, z, probs, offsets)`` (z None unless ``keep``, probs None without
    ``weights``): through the custom operator while torch.compile traces."""
    if torch.compiler.is_compiling():
        y, row_map, z, probs, offsets = _forward_op(x, weights, w1, b1, w2, expert_ids, *gate.fields(), keep, gather,
                                                    check)
        return y, row_map, z if keep else None, probs if weights is not None else None, offsets
    return _forward(x, weights, w1, b1, w2, expert_ids, gate=gate, keep=keep, gather=gather, check=check)


def backward(dy, x, z, probs, row_map, offsets, w1, b1, w2, *, gate: Gate, lean: bool,
             needs: tuple[bool, ...], overwrite: bool, may_release: bool, main_grads: tuple = (None, None)) -> tuple:
    """``(dx, dweights, dw1, db1, dw2)``, None where not needed. ``overwrite``: dz may go over z;
    ``may_release``: the default mode may free dead saved tensors (the graph is freed after this
    backward and no saved-tensor hook holds them); ``main_grads``: FC1's and FC2's float32
    buffers their weight gradients are added to (None where returned; never under torch.compile,
    where the composition runs: ``expert_layer._fallback``). Through the custom operator while
    torch.compile traces."""
    inputs = (dy, x, z, probs, row_map, offsets, w1, b1, w2)
    if torch.compiler.is_compiling():
        grads = _backward_op(*inputs, *gate.fields(), lean, list(needs), overwrite, may_release)
        return tuple(g if need else None for g, need in zip(grads, needs, strict=True))
    return _backward_eager(inputs, gate, lean, needs, overwrite, may_release, main_grads)


def backward_batched(dy, x, z, probs, row_map, offsets, w1, b1, w2, *, gate: Gate, lean: bool,
                     needs: tuple[bool, ...]) -> tuple:
    """``backward`` of a cotangent batched by torch's older vmap (``is_grads_batched=True``,
    ``jacobian(vectorize=True)``): the references, which batch, with nothing overwritten or
    freed (a batched tensor has no storage to read). Not with a ``main_grad`` to add to (the
    caller refuses)."""
    with references_forced():
        return _backward(dy, x, z, probs, row_map, offsets, w1, b1, w2,
                         static=(gate, lean, needs, False, False, 1))


def _backward_eager(inputs: tuple, gate: Gate, lean: bool, needs: tuple[bool, ...], overwrite: bool,
                    may_release: bool, main_grads: tuple = (None, None)) -> tuple:
    """The backward, freeing dead saved tensors where ``lean`` or ``may_release``, on
    ``memory_model.backward_plan``'s plan for the shape (FC1's weight gradient first only where
    dead tensors are freed early)."""
    dy, row_map, w1, w2 = inputs[0], inputs[4], inputs[6], inputs[8]
    fc1_first, x_parts = memory_model.backward_plan(
        memory_model.LayerShape(row_map.shape[0], row_map.shape[1], dy.shape[1], w2.shape[2], w1.shape[0],
                                dy.element_size()), lean)
    # Saved tensors held to the backward's end: FC2's weight gradient first. The same slices
    # either way: a checkpointed or offloaded step gives the plain step's bits.
    fc1_first = fc1_first and (lean or may_release)
    return _backward(*inputs, static=(gate, lean, tuple(needs), overwrite, fc1_first, x_parts), main_grads=main_grads)


_GATE_SCHEMA = "int act, bool interleaved, bool clamped, float limit, float alpha"


def _or_empty(t: torch.Tensor | None, like: torch.Tensor) -> torch.Tensor:
    """A custom operator cannot return None: an empty tensor stands for an absent result."""
    return t if t is not None else like.new_empty(0)


@fuseops_op(f"expert_layer_forward(Tensor x, Tensor? weights, Tensor w1, Tensor? b1, Tensor w2, Tensor expert_ids, "
            f"{_GATE_SCHEMA}, bool keep, bool gather, str check) -> (Tensor, Tensor, Tensor, Tensor, Tensor)")
def _forward_op(x, weights, w1, b1, w2, expert_ids, act, interleaved, clamped, limit, alpha, keep, gather, check):
    gate = Gate.of(act, interleaved, clamped, limit, alpha)
    y, row_map, z, probs, offsets = _forward(x, weights, w1, b1, w2, expert_ids, gate=gate, keep=keep, gather=gather,
                                             check=check)
    return y, row_map, _or_empty(z, x), _or_empty(probs, x), offsets


@torch.library.register_fake("fuseops::expert_layer_forward")
def _(x, weights, w1, b1, w2, expert_ids, act, interleaved, clamped, limit, alpha, keep, gather, check):
    (T, K), H, E, F2 = expert_ids.shape, x.shape[1], w1.shape[0], w1.shape[1]
    routed = T * K
    return (x.new_empty(T, H), x.new_empty(T, K, dtype=torch.int64),
            x.new_empty(routed, F2) if keep else x.new_empty(0),
            weights.new_empty(routed) if weights is not None else x.new_empty(0),
            x.new_empty(E + 1, dtype=torch.int64))


@fuseops_op(f"expert_layer_backward(Tensor dy, Tensor x, Tensor? z, Tensor? probs, Tensor row_map, "
            f"Tensor offsets, Tensor w1, Tensor? b1, Tensor w2, {_GATE_SCHEMA}, bool lean, bool[] needs, "
            f"bool overwrite, bool may_release) -> (Tensor, Tensor, Tensor, Tensor, Tensor)")
def _backward_op(dy, x, z, probs, row_map, offsets, w1, b1, w2, act, interleaved, clamped, limit, alpha,
                 lean, needs, overwrite, may_release):
    gate = Gate.of(act, interleaved, clamped, limit, alpha)
    grads = _backward_eager((dy, x, z, probs, row_map, offsets, w1, b1, w2), gate, lean,
                            tuple(needs), overwrite, may_release)
    return tuple(_or_empty(g, dy) for g in grads)


@torch.library.register_fake("fuseops::expert_layer_backward")
def _(dy, x, z, probs, row_map, offsets, w1, b1, w2, act, interleaved, clamped, limit, alpha, lean, needs,
      overwrite, may_release):
    need_x, need_weights, need_w1, need_b1, need_w2 = needs
    return (dy.new_empty(dy.shape) if need_x else dy.new_empty(0),
            probs.new_empty(row_map.shape) if need_weights else dy.new_empty(0),
            w1.new_empty(w1.shape) if need_w1 else dy.new_empty(0),
            b1.new_empty(b1.shape) if need_b1 else dy.new_empty(0),
            w2.new_empty(w2.shape) if need_w2 else dy.new_empty(0))
