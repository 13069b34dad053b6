import contextlib

import pytest
import torch

import fuseops
from fuseops import ops
from fuseops.kernels._triton import INTERPRET, interpreted_kernels
from tests.helpers import DTYPES, assert_close_rel, capture_cuda_graph
from tests.ops.harness import devices


def _loop_reference(x, weight, bias, sizes):
    """Per-group float64 loop: the spec."""
    outs, start = [], 0
    for g, n in enumerate(sizes):
        y = x[start : start + n] @ weight[g].T
        outs.append(y + bias[g] if bias is not None else y)
        start += n
    return torch.cat(outs)


def _check(device, dtype, sizes, bias, split_kind, in_features=12, out_features=7):
    G = len(sizes)
    op = ops.GroupedLinear(G, in_features, out_features, bias=bias, device=device, dtype=dtype)
    x = torch.randn(sum(sizes), in_features, device=device, dtype=dtype, requires_grad=True)
    split = {
        "list": list(sizes),
        "tuple": tuple(sizes),
        "cpu": torch.tensor(sizes, dtype=torch.int32),
        "device": torch.tensor(sizes, dtype=torch.int64, device=device),
    }[split_kind]
    y = fuseops.Sequential(op)(x, split)
    dy = torch.randn_like(y)
    y.backward(dy)

    x64 = x.detach().double().requires_grad_()
    w64 = op.weight.detach().double().requires_grad_()
    b64 = op.bias.detach().double().requires_grad_() if bias else None
    y64 = _loop_reference(x64, w64, b64, sizes)
    y64.backward(dy.double())
    assert_close_rel(y.detach(), y64.detach(), dtype, what="output")
    assert_close_rel(x.grad, x64.grad, dtype, what="dx")
    assert_close_rel(op.weight.grad, w64.grad, dtype, what="dweight")
    for g, n in enumerate(sizes):
        if n == 0:
            assert (op.weight.grad[g] == 0).all(), "empty groups get exactly zero weight grad"
    if bias:
        assert_close_rel(op.bias.grad, b64.grad, dtype, what="dbias")


SIZES = [[3, 0, 5, 1], [9], [0, 0, 4], [2, 2, 2, 2, 2, 2]]


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("sizes", SIZES)
@pytest.mark.parametrize("bias", [False, True])
def test_grouped_linear_matches_per_group_loop(device, dtype, sizes, bias):
    _check(device, dtype, sizes, bias, "list")


@pytest.mark.parametrize("split_kind", ["list", "tuple", "cpu", "device"])
def test_split_size_forms(split_kind):
    _check("cpu", torch.float32, [4, 0, 3], True, split_kind)


@pytest.mark.skipif(not INTERPRET, reason="interpreter only on CPU machines")
@pytest.mark.parametrize("dtype", DTYPES)
def test_grouped_linear_through_triton_kernels(dtype):
    with interpreted_kernels():
        _check("cpu", dtype, [5, 0, 17, 1], True, "device", in_features=20, out_features=9)


def test_leading_dims_are_flattened():
    op = ops.GroupedLinear(2, 4, 3)
    y = fuseops.Sequential(op)(torch.randn(2, 3, 4), [4, 2])
    assert y.shape == (2, 3, 3)


def test_accumulate_into_main_grad():
    op = ops.GroupedLinear(3, 4, 5, accumulate_into_main_grad=True)
    op.weight.main_grad = torch.ones(3, 5, 4)
    x, dy = torch.randn(6, 4), torch.randn(6, 5)
    fuseops.Sequential(op)(x, [2, 0, 4]).backward(dy)
    expected = torch.ones(3, 5, 4)
    expected[0] += dy[:2].T @ x[:2]
    expected[2] += dy[2:].T @ x[2:]
    torch.testing.assert_close(op.weight.main_grad, expected)
    assert op.weight.grad is None


@pytest.mark.parametrize("kernels", [
    pytest.param(contextlib.nullcontext, id="reference"),
    pytest.param(interpreted_kernels, id="kernels",
                 marks=pytest.mark.skipif(not INTERPRET, reason="Triton interpreter (CPU) only")),
])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_main_grad_of_two_micro_batches_is_twice_one(kernels, dtype):
    """``accumulate_into_main_grad`` adds each micro-batch's finished float32 gradient, as
    ``main_grad.add_`` would: two identical micro-batches give twice one bit for bit, also where a
    group spans several of the interpreted wgrad's 32-row slabs (where a sum started from
    main_grad would not)."""
    torch.manual_seed(0)
    op = ops.GroupedLinear(2, 16, 8, accumulate_into_main_grad=True, dtype=dtype)
    x, dy, split = torch.randn(150, 16, dtype=dtype), torch.randn(150, 8, dtype=dtype), [80, 70]
    op.weight.main_grad = torch.zeros(2, 8, 16)
    with kernels():
        fuseops.Sequential(op)(x, split).backward(dy)
        once = op.weight.main_grad.clone()
        op.weight.main_grad.zero_()
        for _ in range(2):
            fuseops.Sequential(op)(x, split).backward(dy)
    expected = torch.stack([dy[:80].double().T @ x[:80].double(), dy[80:].double().T @ x[80:].double()])
    assert_close_rel(once, expected, dtype, what="main_grad")
    assert torch.equal(op.weight.main_grad, 2 * once)
    assert op.weight.grad is None


@pytest.mark.parametrize(
    "split, error, match",
    [
        ([1, 2], ValueError, r"expected 3 sizes, got 2"),
        ([1, -1, 6], ValueError, "non-negative"),
        ([1, 2, 2], ValueError, r"summing to the 6 input rows"),
        ([1.0, 2, 3], TypeError, "expected ints"),
        (torch.tensor([1, 2, 3.0]), TypeError, "integer dtype"),
        (torch.tensor([[1, 2, 3]]), ValueError, r"expected shape \[3\]"),
        ("123", TypeError, "expected a list"),
    ],
)
def test_bad_split_sizes(split, error, match):
    model = fuseops.Sequential(ops.GroupedLinear(3, 4, 5))
    with pytest.raises(error, match=match):
        model(torch.randn(6, 4), split)


def test_bad_constructor_arguments():
    with pytest.raises(ValueError, match="num_groups"):
        ops.GroupedLinear(0, 4, 4)


@pytest.mark.gpu
def test_device_split_sizes_read_on_the_host_in_debug_mode(monkeypatch):
    """With ``FUSEOPS_DEBUG=1`` device split sizes are read on the host: a ``ValueError`` before
    any launch (without it, a device assert that leaves the CUDA context unusable:
    ``tests/test_compile_bad_input.py`` runs that in a process of its own)."""
    model = fuseops.Sequential(ops.GroupedLinear(2, 4, 4, device="cuda"))
    x, bad = torch.randn(6, 4, device="cuda"), torch.tensor([1, 2], device="cuda")
    monkeypatch.setenv("FUSEOPS_DEBUG", "1")
    with pytest.raises(ValueError, match="summing"):
        model(x, bad)


@pytest.mark.gpu
def test_no_host_sync_with_device_split_sizes():
    op = ops.GroupedLinear(4, 64, 32, bias=True, device="cuda", dtype=torch.bfloat16)
    model = fuseops.Sequential(op)
    x = torch.randn(100, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    split = torch.tensor([30, 0, 50, 20], device="cuda")
    model(x, split).sum().backward()  # warm-up: plans, compiles
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        model(x, split).float().sum().backward()
    finally:
        torch.cuda.set_sync_debug_mode("default")


@pytest.mark.gpu
def test_cuda_graph_capture_and_replay_with_new_split_sizes():
    torch.manual_seed(0)
    op = ops.GroupedLinear(4, 64, 48, bias=True, device="cuda", dtype=torch.bfloat16)
    model = fuseops.Sequential(op)
    x = torch.randn(128, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    dy = torch.randn(128, 48, device="cuda", dtype=torch.bfloat16)
    split = torch.tensor([32, 32, 32, 32], device="cuda")

    def step():
        x.grad, op.weight.grad, op.bias.grad = None, None, None
        y = model(x, split)
        y.backward(dy)
        return y

    graph, y_static = capture_cuda_graph(step)
    grads_static = (x.grad, op.weight.grad, op.bias.grad)
    for sizes in ([10, 0, 100, 18], [128, 0, 0, 0], [1, 2, 3, 122]):
        split.copy_(torch.tensor(sizes))
        graph.replay()
        torch.cuda.synchronize()
        captured = [y_static.clone()] + [g.clone() for g in grads_static]
        eager_y = step()
        eager = [eager_y] + [x.grad, op.weight.grad, op.bias.grad]
        for a, b in zip(captured, eager):
            torch.testing.assert_close(a, b)
