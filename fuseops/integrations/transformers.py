"""Hugging Face transformers experts backend: ``"fuseops"`` in transformers' ``ExpertsInterface``.

    import fuseops.integrations.transformers
    fuseops.integrations.transformers.register()
    model.set_experts_implementation("fuseops")   # or from_pretrained(..., experts_implementation="fuseops")

``register()`` adds ``"fuseops"`` through transformers' own ``ExpertsInterface.register`` (nothing
is patched). Each experts module then runs as ``permute -> Sequential(GroupedLinear, activation,
GroupedLinear) -> unpermute``, which the fuser runs as one fused grouped MLP
(``fuseops.fusions.grouped_mlp``).

Weights stay the model's parameters, in its layout: ``gate_up_proj`` [E, 2F, H] and
``down_proj`` [E, H, F] already are GroupedLinear's [G, out, in]; experts marked transposed
([E, H, 2F], gpt-oss) are read through ``transpose(1, 2)`` views (no copy in forward; autograd
transposes the weight gradient back). Biases [E, out] are used as they are; concatenated or
interleaved gate/up halves are the gated op's ``interleaved`` flag. For gated experts without
biases the routing weights scale FC1's activation (``scaled=True``); otherwise unpermute applies
them.

The activation comes from the module: ``act_fn(gate) * up`` with SiLU, GELU (exact or tanh),
ReLU or squared ReLU, gpt-oss's clamped SwiGLU and its relatives, or a plain activation for
ungated experts. Whatever the integration does not implement (another gate function, a
post-expert norm, expert parallelism) runs transformers' own ``grouped_mm`` experts with a
one-time warning, never a different computation. Experts classes outside transformers' experts
interface (llama4's ``Llama4TextExperts``, jetmoe's ``JetMoeParallelExperts``) keep their own
code, which ``enable(model)`` says with a warning.
"""

import functools
import warnings
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from fuseops import ops
from fuseops.exported_names import exported_dir
from fuseops.moe import permute, unpermute
from fuseops.ops.op import BasicOp
from fuseops.sequential import Sequential

__all__ = ["NAME", "enable", "experts_forward", "experts_sequential", "register"]

NAME = "fuseops"

_GELU = (functools.partial(ops.GeGLU, "none"), functools.partial(ops.GELU, "none"))
_GELU_TANH = (functools.partial(ops.GeGLU, "tanh"), functools.partial(ops.GELU, "tanh"))

# An experts module's ``act_fn`` (by its class's "module.qualname") -> (its gated op for
# ``act_fn(gate) * up``, its plain op for ungated experts); None where fuseops has none.
_ACTIVATIONS: dict[str, tuple[Callable[..., BasicOp] | None, Callable[[], BasicOp]]] = {
    "transformers.activations.SiLUActivation": (ops.SwiGLU, ops.SiLU),
    "torch.nn.modules.activation.SiLU": (ops.SwiGLU, ops.SiLU),
    "transformers.activations.GELUActivation": _GELU,
    "transformers.activations.GELUTanh": _GELU_TANH,
    "transformers.activations.NewGELUActivation": _GELU_TANH,
    "transformers.activations.FastGELUActivation": _GELU_TANH,
    "torch.nn.modules.activation.ReLU": (ops.ReGLU, ops.ReLU),
    "transformers.activations.ReLUSquaredActivation": (ops.SReGLU, ops.SReLU),
    "torch.nn.modules.activation.Sigmoid": (None, ops.Sigmoid),
}


@dataclass(frozen=True)
class _ClampedGate:
    """A gate computing ``ClampedSwiGLU``: the module attributes holding its constants."""

    limit: str
    alpha: str
    interleaved: bool


# Experts classes whose own ``_apply_gate`` is gpt-oss's clamped SwiGLU
# (``(up.clamp(-l, l) + 1) * g * sigmoid(alpha * g)`` with ``g = gate.clamp(max=l)``).
_CLAMPED_GATES = {
    "transformers.models.gpt_oss.modeling_gpt_oss.GptOssExperts._apply_gate":
        _ClampedGate("limit", "alpha", interleaved=True),
    "transformers.models.openai_privacy_filter.modeling_openai_privacy_filter.OpenAIPrivacyFilterExperts._apply_gate":
        _ClampedGate("limit", "alpha", interleaved=False),
    "transformers.models.minimax_m3_vl.modeling_minimax_m3_vl.MiniMaxM3VLExperts._apply_gate":
        _ClampedGate("swiglu_limit", "swiglu_alpha", interleaved=False),
}


def register() -> None:
    """Register ``"fuseops"`` as an experts implementation in transformers (idempotent).

    Afterwards ``model.set_experts_implementation("fuseops")`` runs the experts of any
    model whose experts class uses transformers' experts interface on fuseops.

    Raises:
        ImportError: transformers is not installed, or older than 5.7 (the first release
            whose ``set_experts_implementation`` accepts registered implementations).
    """
    try:
        import transformers
        from packaging.version import Version
        from transformers.integrations.moe import ExpertsInterface
    except ImportError as e:
        raise ImportError(
            "fuseops.integrations.transformers.register(): transformers>=5.7 is not installed "
            "(pip install 'fuseops[transformers]')"
        ) from e
    if Version(transformers.__version__).release < (5, 7):
        raise ImportError(
            f"fuseops.integrations.transformers.register(): expected transformers>=5.7, got "
            f"{transformers.__version__} (pip install 'fuseops[transformers]')"
        )
    ExpertsInterface.register(NAME, experts_forward)


def enable(model: torch.nn.Module) -> list[str]:
    """``register()``, then ``model.set_experts_implementation("fuseops")``, and a one-time
    warning for each experts class the call cannot reach (it does not use transformers'
    experts interface, so it keeps its own code).

    Args:
        model: a transformers model (or any module holding experts modules).
    Returns:
        The names of the submodules that keep their own code (empty when every experts module
        runs through the interface).
    Raises:
        TypeError: ``model`` is not a ``torch.nn.Module``.
    """
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model: expected a torch.nn.Module (a transformers model), got {type(model).__name__}")
    register()
    if hasattr(model, "set_experts_implementation"):
        model.set_experts_implementation(NAME)
    outside = []
    for name, module in model.named_modules():
        if _looks_like_experts(module) and not hasattr(module, "has_gate"):
            _warn_fallback(type(module), "its class does not use transformers' experts interface "
                                         "(set_experts_implementation does not reach it): it runs its own code")
            outside.append(name)
    return outside


def _looks_like_experts(module: torch.nn.Module) -> bool:
    # Experts classes are named so across transformers (MixtralExperts, Llama4TextExperts,
    # JetMoeParallelExperts); the shared-expert MLPs are not ("SharedExpert", "SharedMLP").
    return type(module).__name__.endswith("Experts")


def experts_forward(
    self: torch.nn.Module,
    hidden_states: torch.Tensor,
    top_k_index: torch.Tensor,
    top_k_weights: torch.Tensor,
) -> torch.Tensor:
    """An experts module's forward on fuseops (what ``register()`` registers).

    Args:
        self: an experts module of a class decorated with transformers'
            ``use_experts_implementation``.
        hidden_states: [T, H] token rows.
        top_k_index: [T, K] the experts chosen for each token.
        top_k_weights: [T, K] their routing weights.
    Returns:
        [T, H]: ``sum_k top_k_weights[t, k] * expert_{top_k_index[t, k]}(hidden_states[t])``,
        in ``hidden_states``' dtype.
    """
    # Expert parallelism changes at runtime: its sentinel ids (>= num_experts) are for
    # transformers' own kernels to skip.
    runner = "expert parallelism (sentinel expert ids) is not implemented" if getattr(
        self, "_is_expert_parallel", False) else _runner(self)
    if isinstance(runner, str):
        _warn_fallback(type(self), runner)
        from transformers.integrations.moe import grouped_mm_experts_forward

        return grouped_mm_experts_forward(self, hidden_states, top_k_index, top_k_weights)
    return runner(self, hidden_states, top_k_index, top_k_weights)


def experts_sequential(experts: torch.nn.Module) -> Sequential | None:
    """The ``fuseops.Sequential`` that runs ``experts`` (to read its ``plan``), or None
    when it has not run on fuseops (not yet, or it falls back to ``grouped_mm``)."""
    runner = _RUNNERS.get(experts)
    return runner.mlp if isinstance(runner, _ExpertsRunner) else None


@dataclass(frozen=True)
class _Binding:
    """GroupedLinear parameter ``op.<param>`` is the experts module's ``<attr>``."""

    op: BasicOp
    param: str
    attr: str
    transposed: bool


@dataclass
class _ExpertsRunner:
    """How one experts module runs on fuseops."""

    mlp: Sequential
    bindings: tuple[_Binding, ...]
    # Routing weights as the gated activation's probs (else in unpermute).
    scaled: bool
    views: dict[str, torch.Tensor] = field(default_factory=dict)

    def __call__(self, experts, hidden_states, top_k_index, top_k_weights) -> torch.Tensor:
        for b in self.bindings:
            # The GroupedLinears are built on the meta device: these entries are their only
            # storage. Views are not Parameters, so they go into _parameters directly (as
            # torch.func.functional_call does).
            b.op._parameters[b.param] = self._tensor(experts, b)
        fc1 = self.mlp[0]
        x = hidden_states.to(fc1.weight.dtype)
        x_sorted, split_sizes, row_map = permute(x, top_k_index, fc1.num_groups)
        w = top_k_weights if top_k_weights.dtype in (x.dtype, torch.float32) else top_k_weights.float()
        if self.scaled:
            # probs[row_map[t, k]] = w[t, k]: the weights in x_sorted's row order.
            probs = w.new_empty(row_map.numel()).scatter(0, row_map.reshape(-1), w.reshape(-1))
            y = unpermute(self.mlp(x_sorted, split_sizes, probs, split_sizes), row_map, None)
        else:
            y = unpermute(self.mlp(x_sorted, split_sizes, split_sizes), row_map, w)
        return y.to(hidden_states.dtype)

    def _tensor(self, experts: torch.nn.Module, b: _Binding) -> torch.Tensor:
        p = getattr(experts, b.attr)
        if not b.transposed:
            return p
        # Reuse the view while it still aliases p: the plan's backward matches parameter
        # gradients to the tensors given in forward by identity, so a forward must not
        # replace the tensor another forward's pending backward holds.
        view = self.views.get(b.attr)
        if view is None or view._base is not p or view.data_ptr() != p.data_ptr() or (
            view.requires_grad != p.requires_grad
        ):
            with torch.enable_grad():
                view = p.transpose(1, 2)
            self.views[b.attr] = view
        return view


_RUNNERS: weakref.WeakKeyDictionary[torch.nn.Module, _ExpertsRunner | str] = weakref.WeakKeyDictionary()


def _runner(experts: torch.nn.Module) -> _ExpertsRunner | str:
    """The module's runner, built on its first call; a string says why it falls back."""
    runner = _RUNNERS.get(experts)
    if runner is None:
        runner = _build(experts)
        _RUNNERS[experts] = runner
    return runner


def _build(experts: torch.nn.Module) -> _ExpertsRunner | str:
    if getattr(experts, "has_post_expert_norm", False):
        return f"its post-expert norm ({_name(type(getattr(experts, 'post_expert_norm', None)))}) is not implemented"
    has_gate, has_bias, transposed = experts.has_gate, experts.has_bias, experts.is_transposed
    scaled = has_gate and not has_bias
    act = _activation(experts, scaled)
    if isinstance(act, str):
        return act
    fc1_attr = "gate_up_proj" if has_gate else "up_proj"
    linears = []
    for attr in (fc1_attr, "down_proj"):
        num_groups, a, b = getattr(experts, attr).shape
        out_features, in_features = (b, a) if transposed else (a, b)
        linears.append(ops.GroupedLinear(num_groups, in_features, out_features, bias=has_bias, device="meta"))
    fc1, fc2 = linears
    bindings = [_Binding(fc1, "weight", fc1_attr, transposed), _Binding(fc2, "weight", "down_proj", transposed)]
    if has_bias:
        bindings += [_Binding(fc1, "bias", fc1_attr + "_bias", False), _Binding(fc2, "bias", "down_proj_bias", False)]
    return _ExpertsRunner(Sequential(fc1, act, fc2), tuple(bindings), scaled)


def _activation(experts: torch.nn.Module, scaled: bool) -> BasicOp | str:
    """The fuseops op of the module's gate (or activation), or why there is none."""
    if not experts.has_gate:
        plain = _activation_ops(experts.act_fn)
        return plain[1]() if plain else f"its activation {_name(type(experts.act_fn))} has no fuseops op"
    from transformers.integrations import moe

    gate = type(experts)._apply_gate
    if gate is getattr(moe, "_default_apply_gate", None):
        gated = _activation_ops(experts.act_fn)
        if gated is None or gated[0] is None:
            return f"its gate activation {_name(type(experts.act_fn))} has no fuseops gated op"
        return gated[0](scaled=scaled)
    clamped = _CLAMPED_GATES.get(_name(gate))
    if clamped is None:
        return f"its gate function {_name(gate)} has no fuseops equivalent"
    limit, alpha = getattr(experts, clamped.limit), getattr(experts, clamped.alpha)
    return ops.ClampedSwiGLU(limit, alpha, interleaved=clamped.interleaved, scaled=scaled)


def _activation_ops(act_fn: object) -> tuple[Callable[..., BasicOp] | None, Callable[[], BasicOp]] | None:
    name = _name(type(act_fn))
    # torch.nn.GELU carries its approximation per instance.
    if name == "torch.nn.modules.activation.GELU":
        return _GELU_TANH if act_fn.approximate == "tanh" else _GELU
    return _ACTIVATIONS.get(name)


def _name(obj: object) -> str:
    return f"{obj.__module__}.{obj.__qualname__}"


@functools.cache
def _warn_fallback(experts_class: type, reason: str) -> None:
    # Cached: one warning per experts class and reason, however many layers and calls.
    warnings.warn(
        f"fuseops experts: {experts_class.__name__} runs on transformers' grouped_mm experts "
        f"instead: {reason}",
        RuntimeWarning,
        stacklevel=3,
    )


def __dir__() -> list[str]:
    return exported_dir(globals(), __all__)
