"""CUDA graphs the user makes, the torch way, around fuseops models: a whole step captured with
``torch.cuda.graph`` and replayed on new data and new routing copied into the same tensors,
``make_graphed_callables`` and ``torch.compile(mode="reduce-overhead")``, plain and under a
recipe, each equal to the eager step on the same inputs. fuseops itself captures nothing: the
eager path leaves no graph pool behind (a CPU test, below)."""

from __future__ import annotations

import copy

import pytest
import torch

import fuseops
from tests.helpers import capture_cuda_graph, rel_err
from tests.test_compile import _call, _inputs, _model, _run

KINDS = ["dense", "grouped", "moe", "layer"]


def _cuda_inputs(kind: str, rows: int, seed: int) -> tuple[torch.Tensor, ...]:
    args = tuple(a.detach().cuda() for a in _inputs(kind, rows, seed=seed))
    return tuple(a.bfloat16().requires_grad_() if a.is_floating_point() else a for a in args)


def _assert_step_equal(got: tuple, want: tuple, quantized: bool = False) -> None:
    """bf16 rounding elementwise; under a recipe, norm-wise: the graphed and the eager step may
    quantize through different (equally exact) paths, each within FP8's noise of float64."""
    y, grads = got
    y_ref, grads_ref = want
    assert len(grads) == len(grads_ref)
    for g, g_ref in zip((y, *grads), (y_ref, *grads_ref)):
        if quantized:
            assert rel_err(g, g_ref) <= 0.08, rel_err(g, g_ref)
        else:
            torch.testing.assert_close(g, g_ref, rtol=2e-2, atol=5e-2)


def _recipe(recipe: str | None):
    """A fresh ``fuseops.autocast`` context (each is entered once)."""
    return fuseops.autocast(recipe=fuseops.recipes.FP8CurrentScaling() if recipe else None)


@pytest.mark.gpu
@pytest.mark.parametrize("recipe", [None, "fp8"])
@pytest.mark.parametrize("kind", KINDS)
def test_a_whole_step_captured_with_torch_cuda_graph_replays_on_new_data(kind: str, recipe: str | None) -> None:
    """Forward and backward captured once; new inputs, split sizes and expert ids copied into the
    captured tensors; each replay's output and gradients equal an eager step on those inputs."""
    if recipe is not None and kind in ("grouped", "moe"):
        pytest.skip("the recipe rows cover a dense GEMM and the expert layer")
    torch.manual_seed(0)
    model = _model(kind).cuda().bfloat16()
    eager_model = copy.deepcopy(model)
    static = _cuda_inputs(kind, 256, seed=0)
    leaves = tuple(a for a in static if a.requires_grad)

    def step() -> torch.Tensor:
        with _recipe(recipe):
            y = _call(kind, model, static)
        y.float().square().sum().backward()
        return y

    graph, y_static = capture_cuda_graph(step, warmup=3, fresh_grads=(*leaves, *model.parameters()))

    for seed in (1, 2):
        new = _cuda_inputs(kind, 256, seed=seed)
        with torch.no_grad():
            for dst, src in zip(static, new):
                dst.copy_(src)
        graph.replay()
        got = (y_static.clone(), [t.grad.clone() for t in (*leaves, *model.parameters())])

        eager_args = tuple(a.detach().requires_grad_(a.requires_grad) for a in new)
        eager_model.zero_grad(set_to_none=True)
        with _recipe(recipe):
            y_ref = _call(kind, eager_model, eager_args)
        y_ref.float().square().sum().backward()
        want = (y_ref, [t.grad for t in (*eager_args, *eager_model.parameters()) if t.requires_grad])
        _assert_step_equal(got, want, quantized=recipe is not None)


@pytest.mark.gpu
@pytest.mark.parametrize("recipe", [None, "fp8"])
@pytest.mark.parametrize("kind", KINDS)
def test_make_graphed_callables_equals_eager(kind: str, recipe: str | None) -> None:
    torch.manual_seed(0)
    model = _model(kind).cuda().bfloat16()
    eager_model = copy.deepcopy(model)

    class Call(torch.nn.Module):
        def __init__(self, inner: torch.nn.Module) -> None:
            super().__init__()
            self.inner = inner

        def forward(self, *a: torch.Tensor) -> torch.Tensor:
            with _recipe(recipe):
                return _call(kind, self.inner, a)

    graphed = torch.cuda.make_graphed_callables(Call(model), _cuda_inputs(kind, 256, seed=0))
    reference = Call(eager_model)
    for seed in (1, 2):
        new = _cuda_inputs(kind, 256, seed=seed)
        _assert_step_equal(_run(kind, model, graphed, new), _run(kind, eager_model, reference, new),
                           quantized=recipe is not None)


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["dense", "layer"])
def test_reduce_overhead_under_a_recipe_equals_eager(kind: str) -> None:
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = _model(kind).cuda().bfloat16()
    eager_model = copy.deepcopy(model)

    def run(m: torch.nn.Module, *a: torch.Tensor) -> torch.Tensor:
        with _recipe("fp8"):
            return _call(kind, m, a)

    compiled = torch.compile(lambda *a: run(model, *a), mode="reduce-overhead")
    for step in range(3):
        args = _cuda_inputs(kind, 256, seed=step)
        _assert_step_equal(_run(kind, model, compiled, args),
                           _run(kind, eager_model, lambda *a: run(eager_model, *a), args), quantized=True)


@pytest.mark.gpu
def test_offloading_inside_a_capture_raises_a_clear_error() -> None:
    """Offloading decides on the host at every step: inside the user's capture it says so."""
    model = _model("dense").cuda().bfloat16()
    x = _cuda_inputs("dense", 256, seed=0)[0]
    def step() -> None:
        with fuseops.offload_activations(min_tensor_bytes=0):
            model(x, x).sum().backward()

    with pytest.raises(RuntimeError, match="offload_activations: a CUDA graph is being captured"):
        capture_cuda_graph(step, warmup=1)


@pytest.mark.parametrize("kind", KINDS)
def test_the_eager_path_keeps_no_tensor_between_calls(kind: str) -> None:
    """What a Sequential keeps per call signature holds no tensor: after a step and the caller's
    references are gone, the only tensors left are the parameters (nothing recorded, no graph
    pool, nothing held for a replay)."""
    import gc
    import weakref

    model = _model(kind)
    args = _inputs(kind, 12, seed=0)
    made: list[weakref.ref] = []

    class Spy(torch.utils._python_dispatch.TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for t in out if isinstance(out, (tuple, list)) else (out,):
                if isinstance(t, torch.Tensor):
                    made.append(weakref.ref(t))
            return out

    for _ in range(2):
        with Spy():
            _call(kind, model, args).square().sum().backward()
    model.zero_grad(set_to_none=True)
    for a in args:
        a.grad = None
    gc.collect()
    alive = [r() for r in made if r() is not None]
    assert alive == [], [tuple(t.shape) for t in alive]
