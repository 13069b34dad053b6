"""Byte accounting of one MoE expert layer's forward+backward: which large tensors are alive
at each stage, per implementation, and the peak above the step's start (inputs, weights and
the upstream gradient already allocated; weight gradients, the output and every
intermediate counted). Pure arithmetic on shapes: ``expert_layer`` picks its backward plan
from it (``backward_plan``: the weight gradients' order, both modes; the default's x_sorted
whole or in column slices), and ``benchmarks/moe_memory_model.py`` prints it.

Tensors with a row per (token, choice) are ``N = T*K`` rows: the permuted input ``x_sorted``
[N, H], the pre-activation ``z`` [N, 2F] (its gradient ``dz`` is written over it), the
activation ``h`` [N, F], FC2's output ``y_sorted`` [N, H], the upstream gradient in sorted
order ``dy_sorted`` [N, H], FC1's input gradient ``dx_sorted`` [N, H]. Per token: the output
``y`` and input gradient ``dx`` [T, H]. Weight gradients ``dw1`` [E, 2F, H], ``dw2`` [E, H, F].
Small tensors (routing maps, router weights, offsets) are left out: O(N) elements.

The stage lists mirror the code: ``torch_stages`` benchmarks/moe_layer.py's plain torch
composition, ``composed_stages`` fuseops' permute -> fused Sequential -> unpermute (what
``expert_layer`` falls back to), ``layer_stages`` ``fuseops.moe.expert_layer`` in either mode.
Checked against the H100 (``python -m benchmarks.moe_layer``, peak above the start): torch 7.12
/ 4.09 GB measured, 7.12 / 4.10 modelled; composed 5.37 / 4.23 measured, 5.36 / 4.23 modelled
(Qwen3-30B-A3B / Mixtral-8x7B).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

Stage = tuple[str, tuple[str, ...]]


@dataclass(frozen=True)
class LayerShape:
    tokens: int
    top_k: int
    hidden: int
    ffn: int
    experts: int
    itemsize: int = 2

    def bytes_of(self, name: str) -> int:
        """Bytes of tensor ``name``; ``name/n``: its widest column slice of ``column_parts``
        into ``n``."""
        if "/" in name:
            whole, parts = name.split("/")
            start, stop = column_parts(self.hidden, int(parts))[0]
            return self.bytes_of(whole) // self.hidden * (stop - start)
        N, T, H, F, E = self.tokens * self.top_k, self.tokens, self.hidden, self.ffn, self.experts
        elements = {
            "x_sorted": N * H, "y_sorted": N * H, "dy_sorted": N * H, "dx_sorted": N * H,
            "z": N * 2 * F, "dz": N * 2 * F, "h": N * F, "dh": N * F,
            # torch's SwiGLU keeps silu(gate) and the product apart; its combine's temporaries.
            "silu": N * F, "act": N * F, "dy_sorted_weighted": N * H, "dweights_tmp": N * H,
            "y": T * H, "dx": T * H, "dw1": E * 2 * F * H, "dw2": E * H * F,
        }
        return elements[name] * self.itemsize


def torch_stages() -> list[Stage]:
    """argsort, gather, _grouped_mm, chunk, silu * up, _grouped_mm, ``* weights``, index_add_:
    each op's saved tensors live until its own backward has run."""
    saved = ("x_sorted", "z", "silu", "act", "y_sorted")
    return [
        ("forward end", saved + ("y",)),
        # mul's backward: grad * weights and grad * y (then summed), beside index_add_'s grad.
        ("combine backward", saved + ("y", "dy_sorted", "dy_sorted_weighted", "dweights_tmp")),
        ("FC2 backward", ("x_sorted", "z", "silu", "act", "y", "dy_sorted_weighted", "dh", "dw2")),
        ("FC1 input grad", ("x_sorted", "dz", "y", "dw2", "dx_sorted")),
        ("FC1 weight grad", ("x_sorted", "dz", "y", "dw2", "dx_sorted", "dw1")),
    ]


def composed_stages() -> list[Stage]:
    """permute -> Sequential(GroupedLinear, SwiGLU(scaled), GroupedLinear) -> unpermute: the
    Sequential saves x_sorted and z; unpermute's gradient dy_sorted, an input of the
    Sequential's backward, lives through all of it."""
    return [
        ("forward FC2", ("x_sorted", "z", "h", "y_sorted")),
        ("FC2 grads", ("x_sorted", "dz", "y", "dy_sorted", "h", "dw2")),
        ("FC1 input grad", ("x_sorted", "dz", "y", "dy_sorted", "dw2", "dx_sorted")),
        ("FC1 weight grad", ("x_sorted", "dz", "y", "dy_sorted", "dw2", "dx_sorted", "dw1")),
    ]


def column_parts(columns: int, parts: int) -> list[tuple[int, int]]:
    """``[start, stop)`` of ``parts`` column slices of a row of ``columns``, each but the last
    a multiple of 8 columns wide (slices of a 16-bit or float32 row start 16-byte aligned, as
    TMA needs); none for no columns."""
    step = -(-columns // parts)
    step = max(8, -(-step // 8) * 8)
    return [(start, min(columns, start + step)) for start in range(0, columns, step)]


def layer_stages(lean: bool, fc1_weight_grad_first: bool, x_parts: int = 1) -> list[Stage]:
    """expert_layer. Either mode: dx_sorted is reduced to dx before FC1's weight gradient.
    Default (``lean`` False): z saved; x_sorted made for FC1 alone in the forward and for FC1's
    weight gradient alone in the backward (``x_parts`` column slices of it, one alive at a
    time), which makes dy_sorted too. Lean: nothing of size N saved, and neither x_sorted nor
    dy_sorted made: the backward recomputes z, and every GEMM gathers x's and dy's rows in its
    loads.

    Backward order: FC2's weight gradient right after FC2's dgrad (dy_sorted and h freed
    early, dw2 held meanwhile), or with ``fc1_weight_grad_first`` last, after dz is released
    (h and dy_sorted held meanwhile instead of dw2). The default mode can release its saved z
    early only when the backward frees the graph and no saved-tensor hooks hold it
    (``expert_layer`` checks; else it runs the first order)."""
    xs = () if lean else ("x_sorted" if x_parts == 1 else f"x_sorted/{x_parts}",)
    dys = () if lean else ("dy_sorted",)
    forward = [("forward FC1", ("x_sorted", "z", "h")), ("forward FC2", ("z", "h", "y_sorted")),
               ("forward combine", ("z", "y_sorted", "y"))]
    if lean:
        forward = [("forward FC2", ("h", "y_sorted")), ("forward combine", ("y_sorted", "y")),
                   ("recompute z", ("z", "y"))]
    if not fc1_weight_grad_first:
        return forward + [
            ("FC2 grads", dys + ("dz", "y", "h", "dw2")),
            ("FC1 input grad", ("dz", "y", "dw2", "dx_sorted", "dx")),
            ("FC1 weight grad", xs + ("dz", "y", "dw2", "dx", "dw1")),
        ]
    return forward + [
        ("FC2 input grad", dys + ("dz", "y", "h")),
        ("FC1 input grad", dys + ("dz", "y", "h", "dx_sorted", "dx")),
        ("FC1 weight grad", xs + dys + ("dz", "y", "h", "dx", "dw1")),
        ("FC2 weight grad", dys + ("y", "h", "dx", "dw1", "dw2")),
    ]


def stage_bytes(shape: LayerShape, stages: list[Stage]) -> list[tuple[str, int]]:
    return [(name, sum(shape.bytes_of(t) for t in alive)) for name, alive in stages]


def peak_bytes(shape: LayerShape, stages: list[Stage]) -> int:
    return max(b for _, b in stage_bytes(shape, stages))


X_PARTS = (1, 2, 4)


@functools.cache
def backward_plan(shape: LayerShape, lean: bool) -> tuple[bool, int]:
    """``(fc1_weight_grad_first, x_parts)`` of ``layer_stages`` that peaks lowest at ``shape``
    (among equal peaks the fewest parts, then FC2's weight gradient first): FC1's weight
    gradient first at wide experts with few choices (Mixtral's shape), FC2's first at many
    narrow experts (Qwen3's), where dy_sorted, dx_sorted and x_sorted are the large tensors;
    x_sorted in parts where it would otherwise make the peak. Cached: a backward asks once per
    shape."""
    plans = [(first, parts) for first in (False, True) for parts in ((1,) if lean else X_PARTS)]
    return min(plans, key=lambda plan: (peak_bytes(shape, layer_stages(lean, *plan)), plan[1], plan[0]))
