import pytest
import torch

from fuseops import moe
from fuseops.kernels._triton import INTERPRET, interpreted_kernels
from tests.helpers import DTYPES, assert_close_rel, capture_cuda_graph, cuda_or_skip
from tests.kernels.moe.test_permute import loop_permute, loop_unpermute, routing


def _layer(x, ids, E, weights, scale):
    """permute -> a per-row "expert" (a scale, so every path is differentiable) -> unpermute."""
    x_sorted, split_sizes, row_map = moe.permute(x, ids, E)
    return moe.unpermute(x_sorted * scale, row_map, weights), split_sizes, row_map


def _oracle(x, ids, E, weights, scale):
    x_sorted, split_sizes, row_map = loop_permute(x, ids, E)
    return loop_unpermute(x_sorted * scale.double(), row_map, weights), split_sizes, row_map


def _leaves(T, H, E, K, dtype, w_dtype):
    x = torch.randn(T, H).to(dtype).requires_grad_()
    w = None if w_dtype is None else torch.rand(T, K).to(w_dtype).requires_grad_()
    scale = torch.randn(T * K, 1).to(dtype).requires_grad_()
    return x, routing(T, E, K, torch.int32), w, scale


def _check_against_oracle(T, H, E, K, dtype, w_dtype):
    x, ids, w, scale = _leaves(T, H, E, K, dtype, w_dtype)
    y, split_sizes, row_map = _layer(x, ids, E, w, scale)
    assert y.dtype == dtype and not split_sizes.requires_grad and not row_map.requires_grad
    dy = torch.randn(T, H).to(dtype)
    leaves = [x, scale] + ([w] if w is not None else [])
    grads = torch.autograd.grad(y, leaves, dy)

    x64, s64 = x.detach().double().requires_grad_(), scale.detach().double().requires_grad_()
    w64 = None if w is None else w.detach().double().requires_grad_()
    y64, sizes64, map64 = _oracle(x64, ids, E, w64, s64)
    grads64 = torch.autograd.grad(
        y64, [x64, s64] + ([w64] if w is not None else []), dy.double(), allow_unused=True, materialize_grads=True
    )
    assert torch.equal(split_sizes, sizes64) and torch.equal(row_map, map64)
    assert_close_rel(y, y64, dtype, what="y")
    for name, g, g64 in zip(("dx", "dscale", "dweights"), grads, grads64):
        assert g.dtype == (w.dtype if name == "dweights" else dtype)
        # dscale sums H products per row: twice the room of the others.
        assert_close_rel(g, g64, dtype, factor=2.0, what=name)


# Kernels on CPU tensors run through the interpreter, which is off where CUDA runs (the gpu
# tests below cover the kernels there).
interpreter_only = pytest.mark.skipif(not INTERPRET, reason="the interpreter runs only on CPU-only machines")


@interpreter_only
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("w_dtype", ["float32", "data", None])
def test_triton_path_matches_loop(dtype, w_dtype):
    w_dtype = {"float32": torch.float32, "data": dtype, None: None}[w_dtype]
    with interpreted_kernels():
        _check_against_oracle(23, 40, 6, 3, dtype, w_dtype)


@interpreter_only
@pytest.mark.parametrize("shape", [(1, 8, 4, 2), (30, 16, 5, 1), (0, 8, 3, 2)], ids=str)
def test_small_and_empty_shapes(shape):
    with interpreted_kernels():
        _check_against_oracle(*shape, torch.float32, torch.float32)


def test_reference_path_matches_loop():
    # CPU tensors outside interpreted_kernels() take the torch references.
    _check_against_oracle(23, 40, 6, 3, torch.float32, torch.float32)


@interpreter_only
@pytest.mark.parametrize("dtype", DTYPES)
def test_triton_grads_match_reference(dtype):
    """The same graph through the kernels and through the references."""
    x, ids, w, scale = _leaves(37, 70, 9, 4, dtype, torch.float32)
    dy = torch.randn(37, 70).to(dtype)

    def run():
        y = _layer(x, ids, 9, w, scale)[0]
        return (y, *torch.autograd.grad(y, [x, scale, w], dy))

    with interpreted_kernels():
        got = run()
    ref = run()
    for name, a, b in zip(("y", "dx", "dscale", "dweights"), got, ref):
        assert_close_rel(a, b, dtype, what=name)


def test_gradcheck_float64():
    T, H, E, K = 7, 5, 4, 3
    x = torch.randn(T, H, dtype=torch.float64, requires_grad=True)
    ids = routing(T, E, K)
    w = torch.rand(T, K, dtype=torch.float64, requires_grad=True)
    scale = torch.randn(T * K, 1, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x, w, s: _layer(x, ids, E, w, s)[0], (x, w, scale))
    assert torch.autograd.gradcheck(lambda x, s: _layer(x, ids, E, None, s)[0], (x, scale))
    _, _, row_map = moe.permute(x, ids, E)
    y_sorted = torch.randn(T * K, H, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda y, w: moe.unpermute(y, row_map, w), (y_sorted, w))


def test_out_of_range_ids_raise_on_cpu():
    x = torch.randn(3, 4)
    for bad in ([[0, 4]], [[-1, 0]]):
        ids = torch.tensor(bad * 3)
        with pytest.raises(ValueError, match=r"expert_ids: expected values in \[0, 4\)"):
            moe.permute(x, ids, 4)


@pytest.fixture
def kernels_check(monkeypatch):
    """The CUDA path's range checks on CPU: kernels through the interpreter set the flags,
    ``torch._assert_async`` reads them (on CPU it raises at once), and the torch-op check
    must not run beside them."""
    from fuseops.moe import routing as r

    monkeypatch.setattr(r, "range_check", lambda t: r.KERNELS)

    def torch_ops_check(*args):
        raise AssertionError("the torch-op range check ran beside the kernels' flag")
    monkeypatch.setattr(r, "_assert_in_range_async", torch_ops_check)
    with interpreted_kernels():
        yield


@interpreter_only
@pytest.mark.parametrize("bad", [4, -1, 2**40])
def test_kernels_flag_out_of_range_ids(kernels_check, bad):
    ids = torch.tensor([[0, 1], [2, 3], [1, bad]])
    with pytest.raises(RuntimeError, match=r"expert_ids: expected values in \[0, 4\) \(num_experts=4\)"):
        moe.permute(torch.randn(3, 8), ids, 4)


@interpreter_only
@pytest.mark.parametrize("bad", [8, -1])
def test_kernels_flag_out_of_range_rows(kernels_check, bad):
    row_map = ROW_MAP.clone()
    row_map[2, 1] = bad
    with pytest.raises(RuntimeError, match=r"row_map: expected values in \[0, 8\) \(rows of y_sorted, as returned by permute\)"):
        moe.unpermute(Y_SORTED, row_map, None)


@interpreter_only
def test_kernels_check_passes_good_routing_and_matches_the_host_path(kernels_check):
    x, ids, w = torch.randn(9, 8, requires_grad=True), routing(9, 5, 2), torch.rand(9, 2)
    x_sorted, sizes, row_map = moe.permute(x, ids, 5)
    y = moe.unpermute(x_sorted * 2, row_map, w)
    y.sum().backward()
    ref_sorted, ref_sizes, ref_map = loop_permute(x.detach(), ids, 5)
    assert torch.equal(sizes, ref_sizes) and torch.equal(row_map, ref_map)
    assert_close_rel(y, loop_unpermute(ref_sorted * 2, ref_map, w), torch.float32)
    assert_close_rel(x.grad, 2 * w.sum(1, keepdim=True).expand(9, 8), torch.float32)


X, IDS = torch.randn(4, 8), torch.zeros(4, 2, dtype=torch.int64)
ROW_MAP = torch.arange(8).view(4, 2)
Y_SORTED = torch.randn(8, 8)


@pytest.mark.parametrize(
    "call, error, match",
    [
        (lambda: moe.permute(X.numpy(), IDS, 4), TypeError, "x: expected a torch.Tensor, got ndarray"),
        (lambda: moe.permute(X.int(), IDS, 4), TypeError, "x: expected float32.*got torch.int32"),
        (lambda: moe.permute(X[0], IDS, 4), ValueError, r"x: expected a 2-D tensor.*got shape \[8\]"),
        (lambda: moe.permute(X, IDS.float(), 4), TypeError, "expert_ids: expected an integer dtype, got torch.float32"),
        (lambda: moe.permute(X, IDS.bool(), 4), TypeError, "expert_ids: expected an integer dtype, got torch.bool"),
        (lambda: moe.permute(X, IDS[:3], 4), ValueError, r"expert_ids: expected shape \[4, top_k\].*got \[3, 2\]"),
        (lambda: moe.permute(X, IDS[:, :0], 4), ValueError, r"expert_ids: .*top_k >= 1.*got \[4, 0\]"),
        (lambda: moe.permute(X, IDS.flatten(), 4), ValueError, r"expert_ids: expected shape.*got \[8\]"),
        (lambda: moe.permute(X, IDS.to("meta"), 4), ValueError,
         "expert_ids: expected a tensor on x's device cpu, got meta"),
        (lambda: moe.permute(X, IDS, 0), ValueError, "num_experts: expected an int >= 1, got 0"),
        (lambda: moe.permute(X, IDS, 2.0), ValueError, "num_experts: expected an int >= 1, got 2.0"),
        (lambda: moe.unpermute(Y_SORTED.long(), ROW_MAP, None), TypeError,
         "y_sorted: expected float32.*got torch.int64"),
        (lambda: moe.unpermute(Y_SORTED, ROW_MAP.int(), None), TypeError, "row_map: expected int64.*got torch.int32"),
        (lambda: moe.unpermute(Y_SORTED, ROW_MAP.flatten(), None), ValueError,
         r"row_map: expected shape \[tokens, top_k\].*= 8.*got \[8\]"),
        (lambda: moe.unpermute(Y_SORTED[:6], ROW_MAP, None), ValueError,
         r"row_map: .*tokens \* top_k = 6.*got \[4, 2\]"),
        (lambda: moe.unpermute(Y_SORTED, ROW_MAP, torch.rand(4, 3)), ValueError,
         r"weights: expected shape \[4, 2\].*got \[4, 3\]"),
        (lambda: moe.unpermute(Y_SORTED.half(), ROW_MAP, torch.rand(4, 2).double()), TypeError,
         "weights: expected float32 or y_sorted's dtype torch.float16, got torch.float64"),
        (lambda: moe.unpermute(Y_SORTED, ROW_MAP, [[1.0] * 2] * 4), TypeError,
         "weights: expected a torch.Tensor, got list"),
    ],
)
def test_errors_name_the_argument(call, error, match):
    with pytest.raises(error, match=match):
        call()


@pytest.mark.gpu
def test_gpu_no_host_sync_and_matches_reference(monkeypatch):
    dev = cuda_or_skip()
    monkeypatch.delenv("FUSEOPS_DEBUG", raising=False)
    T, H, E, K = 1000, 256, 64, 8
    x = torch.randn(T, H, device=dev, dtype=torch.bfloat16, requires_grad=True)
    ids = routing(T, E, K, torch.int64, dev)
    w = torch.rand(T, K, device=dev, requires_grad=True)
    scale = torch.randn(T * K, 1, device=dev, dtype=torch.bfloat16, requires_grad=True)
    dy = torch.randn(T, H, device=dev, dtype=torch.bfloat16)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        y = _layer(x, ids, E, w, scale)[0]
        grads = torch.autograd.grad(y, [x, scale, w], dy)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    leaves = [t.detach().cpu().double().requires_grad_() for t in (x, scale, w)]
    y64 = _oracle(leaves[0], ids.cpu(), E, leaves[2], leaves[1])[0]
    grads64 = torch.autograd.grad(y64, leaves, dy.cpu().double())
    assert_close_rel(y.cpu(), y64, torch.bfloat16, what="y")
    for name, g, g64 in zip(("dx", "dscale", "dweights"), grads, grads64):
        assert_close_rel(g.cpu(), g64, torch.bfloat16, factor=2.0, what=name)


@pytest.mark.gpu
def test_gpu_debug_env_checks_range(monkeypatch):
    dev = cuda_or_skip()
    monkeypatch.setenv("FUSEOPS_DEBUG", "1")
    with pytest.raises(ValueError, match="expert_ids"):
        moe.permute(torch.randn(2, 8, device=dev), torch.tensor([[0], [5]], device=dev), 4)


@pytest.mark.gpu
def test_gpu_fwd_bwd_captures_in_cuda_graph():
    dev = cuda_or_skip()
    T, H, E, K = 512, 128, 16, 4
    x = torch.randn(T, H, device=dev, dtype=torch.bfloat16, requires_grad=True)
    ids = routing(T, E, K, torch.int32, dev)
    w = torch.rand(T, K, device=dev, requires_grad=True)
    scale = torch.randn(T * K, 1, device=dev, dtype=torch.bfloat16, requires_grad=True)
    dy = torch.randn(T, H, device=dev, dtype=torch.bfloat16)

    def step():
        y, split_sizes, _ = _layer(x, ids, E, w, scale)
        return (y, split_sizes, *torch.autograd.grad(y, [x, scale, w], dy))

    graph, captured = capture_cuda_graph(step)
    # New routing and data, same buffers: the replay must follow them.
    ids.copy_(routing(T, E, K, torch.int32, dev))
    with torch.no_grad():
        x.copy_(torch.randn_like(x))
    graph.replay()
    torch.cuda.synchronize()
    eager = step()
    for a, b in zip(captured, eager):
        assert torch.equal(a, b)


@pytest.mark.parametrize("bad", [[[0, 1], [2, 8], [3, 4], [5, 6]], [[0, 1], [2, -1], [3, 4], [5, 6]]])
def test_out_of_range_row_map_raises_on_cpu(bad):
    with pytest.raises(ValueError, match=r"row_map: expected values in \[0, 8\) \(rows of y_sorted.*got values in \[-?\d+, \d+\]"):
        moe.unpermute(Y_SORTED, torch.tensor(bad), None)


def _assert_fails_on_the_stream(code: str, name: str) -> None:
    # A device-side assert leaves the CUDA context unusable: its own process.
    from tests.helpers import run_device_assert

    out = run_device_assert("import torch\nfrom fuseops import moe\n" + code + "torch.cuda.synchronize()\n")
    # The assert fires on the device and surfaces at the next CUDA call, as torch's indexing
    # kernels' do (the H100 run: at the Triton launch after it): under sync-debug "error" no
    # call on the way synchronised, and the message names the argument.
    assert out.returncode != 0 and "device-side assert" in out.stderr, (name, out.stderr)
    assert name in out.stderr and "called a synchronizing CUDA operation" not in out.stderr, out.stderr


@pytest.mark.gpu
@pytest.mark.parametrize("bad", [4, -1])
def test_gpu_out_of_range_ids_fail_loudly_without_a_host_sync(bad):
    _assert_fails_on_the_stream(
        "x = torch.randn(3, 8, device='cuda')\n"
        f"ids = torch.tensor([[0, 1], [2, {bad}], [3, 0]], device='cuda')\n"
        "torch.cuda.set_sync_debug_mode('error')\n"
        "moe.permute(x, ids, 4)\n"
        "torch.cuda.set_sync_debug_mode('default')\n", "expert_ids")


@pytest.mark.gpu
def test_gpu_out_of_range_row_map_fails_loudly_without_a_host_sync():
    _assert_fails_on_the_stream(
        "y = torch.randn(8, 8, device='cuda')\n"
        "row_map = torch.tensor([[0, 1], [2, 9], [3, 4], [5, 6]], device='cuda')\n"
        "torch.cuda.set_sync_debug_mode('error')\n"
        "moe.unpermute(y, row_map, None)\n"
        "torch.cuda.set_sync_debug_mode('default')\n", "row_map")


@pytest.mark.gpu
def test_gpu_range_checks_capture_in_a_cuda_graph():
    dev = cuda_or_skip()
    x = torch.randn(6, 8, device=dev)
    ids = torch.tensor([[0, 1], [2, 3], [1, 0], [3, 3], [2, 1], [0, 0]], device=dev)
    moe.permute(x, ids, 4)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        x_sorted, _, row_map = moe.permute(x, ids, 4)
        y = moe.unpermute(x_sorted, row_map, None)
    g.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(y, 2 * x)


@interpreter_only
@pytest.mark.parametrize("lean", [False, True])
def test_expert_layer_kernels_flag_out_of_range_ids(kernels_check, lean):
    from tests.moe.test_expert_layer import make_experts

    experts = make_experts(3, 16, 8)
    x, ids = torch.randn(5, 16), torch.tensor([[0, 1], [2, 0], [1, 3], [0, 2], [1, 1]])
    with pytest.raises(RuntimeError, match=r"expert_ids: expected values in \[0, 3\) \(num_experts=3\)"):
        moe.expert_layer(x, ids, torch.rand(5, 2), experts, lean=lean)


@interpreter_only
@pytest.mark.parametrize("lean", [False, True])
def test_repeated_calls_still_flag_out_of_range_ids_and_rows(kernels_check, lean):
    """After good calls of one signature, a call with bad ids or a bad row map still carries the
    kernels' range checks (the same error as a first call's), and good calls repeat their
    results bit for bit."""
    from tests.moe.test_expert_layer import make_experts

    experts = make_experts(3, 16, 8)
    x, w = torch.randn(5, 16), torch.rand(5, 2)
    good = torch.tensor([[0, 1], [2, 0], [1, 2], [0, 2], [1, 1]])
    bad = torch.tensor([[0, 1], [2, 0], [1, 3], [0, 2], [1, 1]])
    outs = [moe.expert_layer(x, good, w, experts, lean=lean) for _ in range(3)]
    for _ in range(3):
        sorted_, _, row_map = moe.permute(x, good, 3)
        moe.unpermute(sorted_, row_map, w)
    assert torch.equal(outs[2], outs[0])
    with pytest.raises(RuntimeError, match=r"expert_ids: expected values in \[0, 3\) \(num_experts=3\)"):
        moe.expert_layer(x, bad, w, experts, lean=lean)
    with pytest.raises(RuntimeError, match=r"expert_ids: expected values in \[0, 3\) \(num_experts=3\)"):
        moe.permute(x, bad, 3)
    broken = row_map.clone()
    broken[2, 1] = sorted_.shape[0]
    with pytest.raises(RuntimeError, match=r"row_map: expected values in \[0, 10\) \(rows of y_sorted, as returned by permute\)"):
        moe.unpermute(sorted_, broken, w)
