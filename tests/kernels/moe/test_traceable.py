"""The routing custom ops (kernels/moe/traceable.py) pass ``torch.library.opcheck``: schema,
fake implementation (shapes and dtypes) and traced dispatch agree with the launchers; under
``torch.compile`` the routing runs through them."""

from __future__ import annotations

import collections

import pytest
import torch
from functorch.compile import make_boxed_func
from torch._functorch.aot_autograd import aot_module_simplified

import fuseops
from fuseops.kernels.moe import traceable


def _routing(T: int, E: int, K: int, ids_dtype: torch.dtype) -> torch.Tensor:
    """[T, K] distinct experts per token."""
    g = torch.Generator().manual_seed(T)
    rows = [torch.randperm(E, generator=g)[:K] for _ in range(T)]
    return (torch.stack(rows) if rows else torch.empty(0, K, dtype=torch.int64)).to(ids_dtype)


@pytest.mark.parametrize("T", [0, 5])
@pytest.mark.parametrize("ids_dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_permute_op(T, ids_dtype, dtype):
    x = torch.randn(T, 8, dtype=dtype)
    torch.library.opcheck(traceable._permute_op, (x, _routing(T, 4, 2, ids_dtype), 4))


@pytest.mark.parametrize("T", [0, 5])
@pytest.mark.parametrize("weighted", [False, True])
def test_unpermute_op(T, weighted):
    _, _, row_map = traceable.permute(torch.randn(T, 8), _routing(T, 4, 2, torch.int64), 4)
    y_sorted = torch.randn(T * 2, 8, dtype=torch.bfloat16)
    weights = torch.rand(T, 2) if weighted else None
    torch.library.opcheck(traceable._unpermute_op, (y_sorted, row_map, weights))


@pytest.mark.parametrize("T", [0, 5])
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("want_dweights", [False, True])
def test_unpermute_bwd_op(T, weighted, want_dweights):
    _, _, row_map = traceable.permute(torch.randn(T, 8), _routing(T, 4, 2, torch.int64), 4)
    dy = torch.randn(T, 8, dtype=torch.bfloat16)
    weights = torch.rand(T, 2, dtype=torch.bfloat16) if weighted else None
    y_sorted = torch.randn(T * 2, 8, dtype=torch.bfloat16) if want_dweights else None
    torch.library.opcheck(traceable._unpermute_bwd_op, (dy, row_map, weights, y_sorted))
    dy_sorted, dweights = traceable.unpermute_bwd(dy, row_map, weights, y_sorted)
    assert dy_sorted.shape == (T * 2, 8)
    assert (dweights is None) == (not want_dweights)


def test_compiled_routing_runs_the_custom_ops():
    """The traced graphs hold the routing kernels' operators, not their torch references (sort,
    index_put, index_add: what made the compiled layer slower than the eager one on the GPU)."""
    seen: collections.Counter = collections.Counter()

    def backend(gm, inputs):
        def count(g, _):
            seen.update(str(n.target) for n in g.graph.nodes if n.op == "call_function")
            return make_boxed_func(g)
        return aot_module_simplified(gm, inputs, fw_compiler=count, bw_compiler=count)

    def layer(x, ids, weights):
        x_sorted, _, row_map = fuseops.moe.permute(x, ids, 4)
        return fuseops.moe.unpermute(x_sorted * 2, row_map, weights)

    x = torch.randn(6, 8, requires_grad=True)
    weights = torch.rand(6, 2, requires_grad=True)
    ids = _routing(6, 4, 2, torch.int64)
    torch._dynamo.reset()
    torch.compile(layer, backend=backend, fullgraph=True)(x, ids, weights).sum().backward()
    for op in ("fuseops.permute.default", "fuseops.unpermute.default", "fuseops.unpermute_bwd.default"):
        assert seen[op] >= 1, dict(seen)
    for reference_op in ("aten.sort.stable", "aten.index_put.default", "aten.index_add.default"):
        assert seen[reference_op] == 0, dict(seen)
