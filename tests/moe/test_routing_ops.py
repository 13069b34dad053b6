"""The routing's traced operators (``fuseops/moe/routing_ops.py``) pass ``torch.library.opcheck``
(schema, fake implementation, traced dispatch) and return what the eager calls return, bit for bit;
under ``torch.compile`` the routing runs through them (a compiled layer equal to the eager one).
Their graph states under compile: ``tests/moe/test_routing_graphs.py``."""

from __future__ import annotations

import pytest
import torch

from fuseops import moe
from fuseops.kernels.moe import traceable
from fuseops.moe import routing_ops
from tests.helpers import assert_bitwise
from tests.kernels.moe.test_permute import routing

E, K, H = 4, 2, 8


def _routed(T: int, dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Tokens, their experts and the row map permute makes of them."""
    torch.manual_seed(T)
    x, ids = torch.randn(T, H, dtype=dtype), routing(T, E, K)
    return x, ids, traceable.permute(x, ids, E)[2]


@pytest.mark.parametrize("T", [0, 5])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_permute(T, dtype):
    x, ids, _ = _routed(T, dtype)
    torch.library.opcheck(routing_ops._permute_op, (x, ids, E))
    for got, want in zip(routing_ops.traced("permute", (x, ids), (E,)), traceable.permute(x, ids, E), strict=True):
        assert_bitwise(got, want, "permute")


@pytest.mark.parametrize("T", [0, 5])
def test_permute_backward(T):
    _, _, row_map = _routed(T)
    dx_sorted = torch.randn(T * K, H, dtype=torch.bfloat16)
    torch.library.opcheck(routing_ops._permute_backward_op, (dx_sorted, row_map))
    (dx,) = routing_ops.traced("permute_backward", (dx_sorted, row_map))
    assert_bitwise(dx, traceable.unpermute(dx_sorted, row_map, None), "permute_backward")


@pytest.mark.parametrize("T", [0, 5])
@pytest.mark.parametrize("weighted", [False, True])
def test_unpermute(T, weighted):
    _, _, row_map = _routed(T)
    y_sorted = torch.randn(T * K, H, dtype=torch.bfloat16)
    weights = torch.rand(T, K) if weighted else None
    torch.library.opcheck(routing_ops._unpermute_op, (y_sorted, row_map, weights))
    (y,) = routing_ops.traced("unpermute", (y_sorted, row_map, weights))
    assert_bitwise(y, traceable.unpermute(y_sorted, row_map, weights), "unpermute")


@pytest.mark.parametrize("T", [0, 5])
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("want_dweights", [False, True])
def test_unpermute_backward(T, weighted, want_dweights):
    _, _, row_map = _routed(T)
    dy = torch.randn(T, H, dtype=torch.bfloat16)
    weights = torch.rand(T, K, dtype=torch.bfloat16) if weighted else None
    y_sorted = torch.randn(T * K, H, dtype=torch.bfloat16) if want_dweights else None
    torch.library.opcheck(routing_ops._unpermute_backward_op, (dy, row_map, weights, y_sorted))
    got = routing_ops.traced("unpermute_backward", (dy, row_map, weights, y_sorted))
    want = traceable.unpermute_bwd(dy, row_map, weights, y_sorted)
    assert (got[1] is None) == (not want_dweights)
    for a, b in zip(got, want, strict=True):
        if b is not None:
            assert_bitwise(a, b, "unpermute_backward")


def test_an_unknown_call_is_refused():
    with pytest.raises(ValueError, match="got 'gather'"):
        routing_ops.traced("gather", ())


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_compiled_layer_equals_eager(backend):
    """permute -> doubled -> unpermute, compiled with ``fullgraph=True`` at two token counts in a
    row, with a NaN and an infinity: output and gradients bit for bit the eager layer's (the
    doubling is exact, so the compiler's own kernels round nothing)."""
    def layer(x, ids, weights):
        x_sorted, _, row_map = moe.permute(x, ids, E)
        return moe.unpermute(x_sorted * 2, row_map, weights)

    torch._dynamo.reset()
    compiled = torch.compile(layer, backend=backend, fullgraph=True)
    for T in (7, 3):
        x, ids, _ = _routed(T)
        x[0, 1], x[-1, 2] = float("nan"), float("inf")
        weights = torch.rand(T, K)
        runs = []
        for fn in (layer, compiled):
            leaves = [t.clone().requires_grad_() for t in (x, weights)]
            y = fn(leaves[0], ids, leaves[1])
            y.backward(torch.linspace(-1, 1, y.numel()).view(y.shape))
            runs.append([y.detach(), *(t.grad for t in leaves)])
        for i, (got, want) in enumerate(zip(runs[1], runs[0], strict=True)):
            assert_bitwise(got, want, f"T={T} tensor {i}")
