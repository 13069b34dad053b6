"""The routing's calls while ``torch.compile`` traces: one custom operator each, whose
implementation is the eager call's graph state (issue 20).

Eagerly, each call of ``permute`` and ``unpermute``, forward and backward, goes through a state
of ``routing_graphs`` (one CUDA graph per layer and call where the host is the bound). Traced,
they ran the routing kernels' own operators (``kernels/moe/traceable.py``) one launcher at a
time, never graphed: the compiled MoE composition at T=1024 ran at 0.91-0.98x of torch.compile
of the torch layer where the eager one ran at 1.17-1.36x the faster torch (session 29, Qwen3 and
OLMoE). Here each call is one operator (``fuseops::routed_permute``, ``routed_permute_backward``,
``routed_unpermute``, ``routed_unpermute_backward``) whose implementation is the graph-state
call, as ``expert_layer``'s are (``expert_layer_steps.py``): a compiled layer replays the
graphs an eager one does. The states are the eager calls' rules and guarantees; their key names
these calls apart from eager ones (``TRACED``).

Where no state serves (CPU tensors, graphs off, saved-tensor hooks) they call the kernels' own
operators, whose calls ``op_programs`` records per layout, as a traced call did before.

The range checks stay outside, in torch ops the compiler fuses (``routing.OPS``); the kernels
clamp. The operators are functional (no input written, no output aliasing one), not recorded by
``op_programs`` themselves (a record would skip the graph states), and return an empty tensor for
an absent result. Their fake implementations are the kernels' operators' (the same results, from the
input shapes alone), so row counts stay dynamic.

Also here, the bodies those calls run (eagerly too, by ``routing.py``).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import torch

from fuseops.kernels.custom_op import fuseops_op
from fuseops.kernels.moe import traceable
from fuseops.moe import routing_graphs

# The static key of the traced calls' states (the eager calls' carry their range-check mode).
TRACED = "traced"


def sum_rows(dx_sorted: torch.Tensor, row_map: torch.Tensor) -> tuple[torch.Tensor]:
    """permute's backward: each token's gradient is the plain sum of its K rows' gradients.
    (Made contiguous inside the routed call: in a graph, a gradient expanded from one element
    is copied in as that element.)"""
    return (traceable.unpermute(dx_sorted.contiguous(), row_map, None),)


def unpermute_plain(y_sorted: torch.Tensor, row_map: torch.Tensor, weights: torch.Tensor | None
                    ) -> tuple[torch.Tensor]:
    """unpermute without the kernels' range flag (checked outside, or on the host)."""
    return (traceable.unpermute(y_sorted, row_map, weights),)


def unpermute_backward(dy: torch.Tensor, row_map: torch.Tensor, weights: torch.Tensor | None,
                       y_sorted: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``(dy_sorted, dweights)``, ``dweights`` None without ``y_sorted``."""
    return traceable.unpermute_bwd(dy.contiguous(), row_map, weights, y_sorted)


# The bodies above through the kernels' operators (``_through_states``).
def _sum_rows_by_op(dx_sorted: torch.Tensor, row_map: torch.Tensor) -> tuple[torch.Tensor]:
    return (torch.ops.fuseops.unpermute.default(dx_sorted.contiguous(), row_map, None),)


def _unpermute_by_op(y_sorted: torch.Tensor, row_map: torch.Tensor, weights: torch.Tensor | None
                     ) -> tuple[torch.Tensor]:
    return (torch.ops.fuseops.unpermute.default(y_sorted, row_map, weights),)


def _unpermute_backward_by_op(dy: torch.Tensor, row_map: torch.Tensor, weights: torch.Tensor | None,
                              y_sorted: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.ops.fuseops.unpermute_bwd.default(dy.contiguous(), row_map, weights, y_sorted)


def _through_states(name: str, body: Callable[..., tuple], kernels: Callable[..., tuple], inputs: tuple,
                    static: tuple, row_map: torch.Tensor | None = None) -> tuple:
    """``body(*inputs)`` through the call's graph state; where none serves (CPU tensors, graphs off,
    saved-tensor hooks) ``kernels(*inputs)``, the same results through the kernels' own operators,
    whose calls ``op_programs`` records per layout (a compiled call ran them so before these
    operators: ~10 % of a compiled CPU step at E=16 H=256 top-4 T=512 under autocast)."""
    if routing_graphs.applies(inputs[0].device):
        return routing_graphs.call(name, body, inputs, (*static, TRACED), row_map)
    return kernels(*inputs)


@fuseops_op("routed_permute(Tensor x, Tensor expert_ids, int num_experts) -> (Tensor, Tensor, Tensor)",
            recorded=False)
def _permute_op(x: torch.Tensor, expert_ids: torch.Tensor, num_experts: int) -> tuple:
    return _through_states("permute", partial(traceable.permute, num_experts=num_experts),
                           partial(torch.ops.fuseops.permute.default, num_experts=num_experts), (x, expert_ids),
                           (num_experts,))


@torch.library.register_fake("fuseops::routed_permute")
def _(x, expert_ids, num_experts):
    return torch.ops.fuseops.permute.default(x, expert_ids, num_experts)


@fuseops_op("routed_permute_backward(Tensor dx_sorted, Tensor row_map) -> Tensor", recorded=False)
def _permute_backward_op(dx_sorted: torch.Tensor, row_map: torch.Tensor) -> torch.Tensor:
    (dx,) = _through_states("permute_backward", sum_rows, _sum_rows_by_op, (dx_sorted, row_map), (), row_map)
    return dx


@torch.library.register_fake("fuseops::routed_permute_backward")
def _(dx_sorted, row_map):
    return torch.ops.fuseops.unpermute.default(dx_sorted, row_map, None)


@fuseops_op("routed_unpermute(Tensor y_sorted, Tensor row_map, Tensor? weights) -> Tensor", recorded=False)
def _unpermute_op(y_sorted: torch.Tensor, row_map: torch.Tensor, weights: torch.Tensor | None) -> torch.Tensor:
    (y,) = _through_states("unpermute", unpermute_plain, _unpermute_by_op, (y_sorted, row_map, weights), (), row_map)
    return y


@torch.library.register_fake("fuseops::routed_unpermute")
def _(y_sorted, row_map, weights):
    return torch.ops.fuseops.unpermute.default(y_sorted, row_map, weights)


@fuseops_op("routed_unpermute_backward(Tensor dy, Tensor row_map, Tensor? weights, Tensor? y_sorted) "
            "-> (Tensor, Tensor)", recorded=False)
def _unpermute_backward_op(dy: torch.Tensor, row_map: torch.Tensor, weights: torch.Tensor | None,
                           y_sorted: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    dy_sorted, dweights = _through_states("unpermute_backward", unpermute_backward, _unpermute_backward_by_op,
                                          (dy, row_map, weights, y_sorted), (), row_map)
    return dy_sorted, dweights if dweights is not None else dy.new_empty(0)


@torch.library.register_fake("fuseops::routed_unpermute_backward")
def _(dy, row_map, weights, y_sorted):
    return torch.ops.fuseops.unpermute_bwd.default(dy, row_map, weights, y_sorted)


def traced(name: str, inputs: tuple, static: tuple = ()) -> tuple:
    """The routed call ``name`` (``routing_graphs``' names) on ``inputs`` as its operator, for a
    trace: the results ``routing.py``'s eager call returns (``static``: permute's expert count)."""
    if name == "permute":
        return _permute_op(*inputs, *static)
    if name == "permute_backward":
        return (_permute_backward_op(*inputs),)
    if name == "unpermute":
        return (_unpermute_op(*inputs),)
    if name == "unpermute_backward":
        dy_sorted, dweights = _unpermute_backward_op(*inputs)
        return dy_sorted, dweights if inputs[3] is not None else None
    raise ValueError(f"name: expected permute, permute_backward, unpermute or unpermute_backward, got {name!r}")
