"""Our custom operators through recorded programs (``fuseops/ops/executor/op_programs.py``): a
compiled MoE layer's steps bit for bit the operators' implementations run as they are (the Triton
launchers through the interpreter, and the CPU references, whose host reads refuse a recording);
scalar arguments and strides are part of a layout; each layout its own program."""

from __future__ import annotations

import contextlib
import itertools

import pytest
import torch

from benchmarks import sizes
from fuseops import compiled_sequential
from fuseops.kernels import custom_op, library
from fuseops.kernels._triton import INTERPRET, interpreted_kernels
from fuseops.kernels.elementwise.activation_math import Activation
from fuseops.kernels.gemm.grouped import group_offsets
from fuseops.ops.executor import op_programs, replay
from tests.helpers import assert_bitwise, cuda_or_skip

MOE_OPS = {"permute", "grouped_gemm_gated", "grouped_gemm", "unpermute", "unpermute_bwd",
           "grouped_gemm_dgrad_gated", "grouped_gemm_wgrad"}
# Never recorded themselves: they go through the routing's graph states, or where none serves (here,
# on the CPU) through the routing kernels' operators above (routing_ops.py).
ROUTED_OPS = {"routed_permute", "routed_permute_backward", "routed_unpermute", "routed_unpermute_backward"}
ROUTING_KERNEL_OPS = {"permute", "unpermute", "unpermute_bwd"}


@pytest.fixture
def fresh_programs(monkeypatch):
    monkeypatch.setattr(op_programs, "_programs", {})
    # The experts traced op by op, as a Sequential is where its two operators do not apply
    # (``compiled_sequential.applies``: a 3-D input, module hooks, a recipe): their kernels'
    # operators are then what op programs record.
    monkeypatch.setattr(compiled_sequential, "applies", lambda *args: False)


def _kernels(kind):
    if kind == "interpreted":
        if not INTERPRET:
            pytest.skip("the interpreter runs only on CPU-only machines")
        return interpreted_kernels()
    return contextlib.nullcontext()


def _compiled_steps(device, tokens, poison, steps=4):
    """``steps`` compiled forward+backward steps of ``sizes.FuseopsMoE`` (E=4, H=32, I=16, top-2):
    per step the output and every gradient."""
    torch.manual_seed(0)
    model = sizes.FuseopsMoE(4, 32, 16).to(device)
    x, ids, weights = sizes.moe_args(tokens, 4, 32, 2, device=device, dtype=torch.float32)
    if poison and tokens:
        with torch.no_grad():
            x[0, 1], x[-1, 2] = float("nan"), float("inf")
    compiled = torch.compile(model, backend="aot_eager", fullgraph=True)
    leaves = [x, weights, *model.parameters()]
    out = []
    for _ in range(steps):
        for t in leaves:
            t.grad = None
        y = compiled(x, ids, weights)
        y.square().sum().backward()
        out.append([y.detach().clone(), *[t.grad.clone() for t in leaves]])
    return out


def _same_as_the_implementations(monkeypatch, steps_of):
    monkeypatch.setattr(custom_op, "calling", None)
    want = steps_of()
    monkeypatch.setattr(custom_op, "calling", op_programs.call)
    before = replay.counts["replayed"]
    got = steps_of()
    for i, (a, b) in enumerate(zip(want, got, strict=True)):
        for j, (u, v) in enumerate(zip(a, b, strict=True)):
            assert_bitwise(v, u, f"step {i} tensor {j}")
    return replay.counts["replayed"] - before


@pytest.mark.parametrize("tokens, poison", [(8, False), (8, True), (1, False)], ids=["plain", "non_finite", "one_token"])
@pytest.mark.parametrize("kind", ["interpreted", "references"])
def test_a_compiled_moe_layer_equals_the_implementations(kind, tokens, poison, fresh_programs, monkeypatch):
    """Interpreted kernels: every kernel operator of the step recorded and replayed. References:
    the grouped GEMMs walk the offsets on the host, so their recordings are refused and they run
    as they are; the routing kernels' operators replay. The routing's own operators are never
    recorded: without graph states (the CPU) they call the routing kernels' operators."""
    with _kernels(kind):
        replays = _same_as_the_implementations(monkeypatch, lambda: _compiled_steps("cpu", tokens, poison))
    assert replays > 0
    held = {name: {type(p).__name__ for p in op_programs.programs(name).values()} for name in MOE_OPS | ROUTED_OPS}
    assert all(held[name] == set() for name in ROUTED_OPS), held
    if kind == "interpreted":
        assert all(held[name] == {"Program"} for name in MOE_OPS), held
    else:
        assert held["permute"] == {"Program"} and held["grouped_gemm"] == {"Refusal"}, held


def _grouped_gemm_args(transposed=False):
    torch.manual_seed(0)
    a = torch.randn(8, 32)
    b = torch.randn(3, 16, 32).transpose(1, 2) if transposed else torch.randn(3, 32, 16)
    return a, b, group_offsets(torch.tensor([3, 0, 5]))


def _reference(a, b, offsets, alpha):
    """``silu`` with sigmoid slope ``alpha`` of each group's product, in float64."""
    bounds = offsets.tolist()
    z = torch.cat([a[s:e].double() @ b[g].double() for g, (s, e) in enumerate(itertools.pairwise(bounds))])
    return z * torch.sigmoid(alpha * z)


def test_scalar_arguments_and_strides_are_part_of_a_layout(fresh_programs):
    """SiLU's slope alpha 1, 2 and -0 (a float a kernel specializes by its sign) and the weight as
    it lies or transposed: each its own program, each call right."""
    with _kernels("interpreted"):
        for _ in range(3):  # seen, recorded, replayed
            for transposed in (False, True):
                a, b, offsets = _grouped_gemm_args(transposed)
                for alpha in (1.0, 2.0, -0.0):
                    y, _ = library._grouped_gemm_op(a, b, offsets, None, None, int(Activation.SILU), alpha,
                                                    False, None)
                    torch.testing.assert_close(y.double(), _reference(a, b, offsets, alpha), rtol=1e-4, atol=1e-4)
    held = op_programs.programs("grouped_gemm")
    assert len(held) == 6 and all(p.__class__ is replay.Program for p in held.values())


def test_layouts_are_bounded(fresh_programs, monkeypatch):
    """Past ``MAX_LAYOUTS`` an operator's new layouts run the implementation, and stay right."""
    monkeypatch.setattr(op_programs, "MAX_LAYOUTS", 2)
    with _kernels("interpreted"):
        for rows in (4, 5, 6, 4, 5, 6, 4, 5, 6):
            y = torch.randn(rows * 2, 8)
            row_map = torch.randperm(rows * 2).view(rows, 2)
            out = torch.ops.fuseops.unpermute(y, row_map, None)
            torch.testing.assert_close(out, y[row_map].sum(1))
    assert len(op_programs.programs("unpermute")) == 2


def test_one_tensor_passed_twice_is_a_layout_of_its_own(fresh_programs):
    """A record names a tensor passed as two arguments once: a layout with it (``x`` as both of the
    weight gradient's operands) and the same shapes with two tensors are two programs, each right."""
    torch.manual_seed(0)
    offsets = group_offsets(torch.tensor([3, 0, 5]))
    x, other = torch.randn(8, 16), torch.randn(8, 16)
    with _kernels("interpreted"):
        for dy in (x, x, x, other, other, other):  # recorded with x as both, then replayed
            dw = library._wgrad_op(dy, x, offsets, torch.float32, None)
            want = torch.stack([dy[s:e].double().T @ x[s:e].double() for s, e in ((0, 3), (3, 3), (3, 8))])
            torch.testing.assert_close(dw.double(), want, rtol=1e-4, atol=1e-4)
    assert len(op_programs.programs("grouped_gemm_wgrad")) == 2


def test_arguments_without_a_layout_run_the_implementation(fresh_programs):
    """A meta tensor or a list of tensors (which a record cannot name): the implementation runs,
    nothing is kept."""
    for args in ((torch.empty(2, device="meta"),), ([torch.zeros(1), torch.ones(1)], 3)):
        assert op_programs.layout(args) is None
        for _ in range(3):
            assert op_programs.call("probe", lambda *a: "ran", args) == "ran"
    assert op_programs.programs("probe") == {}


@pytest.mark.gpu
def test_gpu_compiled_moe_layer_equals_the_implementations(fresh_programs, monkeypatch):
    """On the GPU the routing's operators run its graph states (``routing_ops.py``), whose bodies
    launch the routing kernels themselves: neither they nor the routing kernels' operators are
    recorded. The experts' kernel operators are, and replay."""
    device = cuda_or_skip()
    replays = _same_as_the_implementations(monkeypatch, lambda: _compiled_steps(device, 64, True))
    assert replays > 0
    held = {name: {type(p).__name__ for p in op_programs.programs(name).values()} for name in MOE_OPS | ROUTED_OPS}
    unrecorded = ROUTED_OPS | ROUTING_KERNEL_OPS
    assert held == {name: set() if name in unrecorded else {"Program"} for name in held}, held
