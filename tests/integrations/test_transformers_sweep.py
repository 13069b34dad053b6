"""Every experts class the installed transformers ships (found programmatically: modeling
modules using ``@use_experts_implementation``), built from a tiny config of its own model:
on ``"fuseops"`` it either equals transformers' own eager experts (output and every gradient,
float32, CPU) or falls back to transformers' grouped_mm with one warning naming why, and then
equals eager too. Nothing in between: no silent different computation."""

from __future__ import annotations

import importlib
import inspect
import os
import warnings

import pytest
import torch

transformers = pytest.importorskip("transformers")
pytest.importorskip("transformers.integrations.moe")

import fuseops.integrations.transformers as fx
from tests.helpers import assert_close_rel

# Config fields that size an experts module, set small (whichever the config has).
SMALL = {"hidden_size": 16, "intermediate_size": 8, "moe_intermediate_size": 8, "expert_intermediate_size": 8,
         "ffn_hidden_size": 8, "moe_ffn_hidden_size": 8, "num_experts": 4, "num_local_experts": 4,
         "n_routed_experts": 4, "moe_num_experts": 4, "num_experts_per_tok": 2, "d_model": 16, "ffn_dim": 8}


def _experts_classes() -> list[tuple[str, type]]:
    from transformers import models

    root = models.__path__[0]
    found = []
    for name in sorted(os.listdir(root)):
        path = os.path.join(root, name, f"modeling_{name}.py")
        if not os.path.exists(path):
            continue
        with open(path) as f:
            if "@use_experts_implementation" not in f.read():
                continue
        module = importlib.import_module(f"transformers.models.{name}.modeling_{name}")
        for cls in vars(module).values():
            if (inspect.isclass(cls) and cls.__module__ == module.__name__ and issubclass(cls, torch.nn.Module)
                    and hasattr(cls, "_apply_gate")):
                found.append((name, cls))
    return found


EXPERTS = _experts_classes()


def _build(name: str, cls: type) -> torch.nn.Module:
    """The experts module from the first config class of its model that builds it small."""
    configs = importlib.import_module(f"transformers.models.{name}.configuration_{name}")
    errors = []
    for config_cls in vars(configs).values():
        if not (inspect.isclass(config_cls) and issubclass(config_cls, transformers.PretrainedConfig)
                and config_cls.__module__ == configs.__name__):
            continue
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                config = config_cls()
                for key, value in SMALL.items():
                    if hasattr(config, key):
                        old = getattr(config, key)
                        # Some configs hold one size per part of the model (ernie4_5_vl_moe).
                        setattr(config, key, [value] * len(old) if isinstance(old, (list, tuple)) else value)
                torch.manual_seed(0)
                module = cls(config)
            # A config of another part of the model (vision, audio) fails in its own ways.
            except Exception as e:  # noqa: BLE001
                errors.append(f"{config_cls.__name__}: {type(e).__name__}: {e}"[:200])
                continue
        if sum(p.numel() for p in module.parameters()) <= 1_000_000:
            return module
        errors.append(f"{config_cls.__name__}: too large")
    pytest.skip(f"{cls.__name__} builds from no tiny config of {name}: {errors}")


def _run(module: torch.nn.Module, implementation: str, x, index, weights):
    module.config._experts_implementation_internal = implementation
    module.zero_grad(set_to_none=True)
    x = x.clone().requires_grad_()
    w = weights.clone().requires_grad_()
    y = module(x, index, w)
    probe = torch.randn(y.shape, generator=torch.Generator().manual_seed(1))
    (y * probe).sum().backward()
    grads = {n: p.grad.clone() for n, p in module.named_parameters() if p.grad is not None}
    return y.detach(), x.grad, w.grad, grads


def test_the_sweep_finds_the_experts_classes():
    # 64 classes in transformers 5.23; the issue counted 46 model classes on an older release.
    assert len(EXPERTS) >= 40


@pytest.mark.parametrize("name, cls", EXPERTS, ids=[f"{n}-{c.__name__}" for n, c in EXPERTS])
def test_experts_equal_eager_or_fall_back_with_a_warning(name, cls):
    fx.register()
    module = _build(name, cls)
    with torch.no_grad():
        for p in module.parameters():
            p.normal_(0.0, 0.3 if p.dim() > 1 else 0.1)
    E = module.num_experts
    T, K = 7, min(2, E)
    x = torch.randn(T, module.config.hidden_size if hasattr(module.config, "hidden_size") else 16)
    x = torch.randn(T, _hidden(module))
    index = torch.stack([torch.randperm(E)[:K] for _ in range(T)])
    weights = torch.rand(T, K)
    eager = _run(module, "eager", x, index, weights)
    fx._warn_fallback.cache_clear()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ours = _run(module, "fuseops", x, index, weights)
    fell_back = [w for w in caught if "fuseops experts" in str(w.message)]
    runner = fx._RUNNERS.get(module)
    assert bool(fell_back) == isinstance(runner, str), (fell_back, runner)
    y, dx, dw, grads = ours
    assert_close_rel(y, eager[0], torch.float32, what="output")
    assert_close_rel(dx, eager[1], torch.float32, what="input grad")
    assert_close_rel(dw, eager[2], torch.float32, what="routing weights grad")
    assert grads.keys() == eager[3].keys(), "parameters with a gradient differ"
    for n in grads:
        assert_close_rel(grads[n], eager[3][n], torch.float32, what=f"grad {n}")


def _hidden(module: torch.nn.Module) -> int:
    w = module.down_proj
    return w.shape[2] if module.is_transposed else w.shape[1]


def test_expert_parallel_modules_fall_back_with_a_warning():
    fx.register()
    name, cls = next((n, c) for n, c in EXPERTS if n == "mixtral")
    module = _build(name, cls)
    x, index, weights = torch.randn(5, _hidden(module)), torch.randint(0, module.num_experts, (5, 2)), torch.rand(5, 2)
    module._is_expert_parallel = True
    # The reference: transformers' own grouped_mm experts with the same flag.
    eager = _run(module, "grouped_mm", x, index, weights)
    fx._warn_fallback.cache_clear()
    with pytest.warns(RuntimeWarning, match="expert parallelism"):
        ours = _run(module, "fuseops", x, index, weights)
    # The very computation transformers does (its CPU grouped_mm under EP included).
    torch.testing.assert_close(ours[0], eager[0], rtol=0, atol=0, equal_nan=True)
    assert fx._RUNNERS.get(module) is None


@pytest.mark.parametrize("model_name, cls_name", [("llama4", "Llama4TextExperts"), ("jetmoe", "JetMoeParallelExperts")])
def test_enable_warns_for_experts_outside_the_interface(model_name, cls_name):
    module = importlib.import_module(f"transformers.models.{model_name}.modeling_{model_name}")
    cls = getattr(module, cls_name)
    if model_name == "llama4":
        config = transformers.Llama4TextConfig(hidden_size=16, intermediate_size=8, num_local_experts=4)
        experts = cls(config)
    else:
        experts = cls(4, 16, 8)
    holder = torch.nn.ModuleDict({"experts": experts})
    fx._warn_fallback.cache_clear()
    with pytest.warns(RuntimeWarning, match=f"{cls_name} runs on transformers' .*does not use transformers' experts interface"):
        assert fx.enable(holder) == ["experts"]


def test_enable_rejects_what_is_not_a_module():
    with pytest.raises(TypeError, match="model: expected a torch.nn.Module .*got str"):
        fx.enable("mixtral")


def fallbacks() -> dict[str, str]:
    """Experts class -> why it falls back (README_SECTION.md lists them)."""
    fx.register()
    out = {}
    for name, cls in EXPERTS:
        try:
            module = _build(name, cls)
        except pytest.skip.Exception as e:
            out[cls.__name__] = f"not built: {e}"
            continue
        module.config._experts_implementation_internal = "fuseops"
        runner = fx._runner(module)
        if isinstance(runner, str):
            out[cls.__name__] = runner
    return out
