"""fuseops as transformers' experts implementation: tiny random MoE models (built from
config objects, nothing downloaded) give the same logits and the same gradients for every
parameter with ``"fuseops"`` as with ``"eager"``; experts modules of every supported
layout and gate match at the module level; unsupported gates fall back with one warning."""

from __future__ import annotations

import importlib
import warnings

import pytest
import torch

transformers = pytest.importorskip("transformers")
pytest.importorskip("transformers.integrations.moe")

import fuseops.integrations.transformers as fx  # noqa: E402
from fuseops.kernels._triton import INTERPRET, interpreted_kernels  # noqa: E402
from tests.helpers import REL_TOL, assert_close_rel, cuda_or_skip, rel_err  # noqa: E402

COMMON = dict(
    vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
    max_position_embeddings=64, bos_token_id=1, eos_token_id=2, pad_token_id=0,
)


def _config(name: str, layers: int):
    """(model class, config) of a tiny random model with ``layers`` MoE layers."""
    T = transformers
    common = {**COMMON, "num_hidden_layers": layers}
    if name == "mixtral":
        return T.MixtralForCausalLM, T.MixtralConfig(
            **common, intermediate_size=24, num_local_experts=8, num_experts_per_tok=2)
    if name == "qwen2_moe":
        return T.Qwen2MoeForCausalLM, T.Qwen2MoeConfig(
            **common, intermediate_size=40, moe_intermediate_size=24, shared_expert_intermediate_size=40,
            num_experts=8, num_experts_per_tok=2, norm_topk_prob=False)
    if name == "qwen3_moe":
        return T.Qwen3MoeForCausalLM, T.Qwen3MoeConfig(
            **common, head_dim=8, intermediate_size=40, moe_intermediate_size=24, num_experts=8,
            num_experts_per_tok=3, norm_topk_prob=True)
    if name == "olmoe":
        return T.OlmoeForCausalLM, T.OlmoeConfig(
            **common, intermediate_size=24, num_experts=8, num_experts_per_tok=2)
    if name == "deepseek_v3":
        # Layer 0 is dense (first_k_dense_replace=1); MLA wants as many KV heads as heads.
        common.update(num_hidden_layers=layers + 1, num_key_value_heads=4)
        return T.DeepseekV3ForCausalLM, T.DeepseekV3Config(
            **common, intermediate_size=40, moe_intermediate_size=24, n_routed_experts=8, n_shared_experts=1,
            num_experts_per_tok=2, first_k_dense_replace=1, n_group=2, topk_group=1, kv_lora_rank=16,
            q_lora_rank=24, qk_rope_head_dim=4, qk_nope_head_dim=8, v_head_dim=8,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
    if name == "gpt_oss":
        return T.GptOssForCausalLM, T.GptOssConfig(
            **common, head_dim=8, intermediate_size=24, num_local_experts=8, num_experts_per_tok=2,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
    raise ValueError(name)


MODELS = ("mixtral", "qwen2_moe", "qwen3_moe", "olmoe", "deepseek_v3", "gpt_oss")


@pytest.fixture(scope="module", autouse=True)
def _registered():
    fx.register()


def _is_experts(module: torch.nn.Module) -> bool:
    return hasattr(module, "is_transposed") and hasattr(module, "down_proj")


def _build(name: str, *, layers: int = 2, device="cpu", dtype=torch.float32):
    cls, config = _config(name, layers)
    torch.manual_seed(0)
    model = cls(config)
    # Weights big enough that activations leave their linear range.
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.3 if p.dim() > 1 else 0.1)
    for module in model.modules():
        if _is_experts(module) and hasattr(module, "limit"):
            # gpt-oss clamps at 7; a small limit makes the clamps bite (read from the module).
            module.limit = 1.0
    return model.to(device=device, dtype=dtype)


def _run(model, implementation: str, *batches: torch.Tensor):
    """Logits of each batch, and every parameter's gradient of one loss over all of them."""
    model.set_experts_implementation(implementation)
    model.zero_grad(set_to_none=True)
    outs, loss = [], 0.0
    for ids in batches:
        logits = model(ids).logits
        probe = torch.randn(logits.shape, generator=torch.Generator().manual_seed(1)).to(logits.device)
        loss = loss + (logits.float() * probe).sum()
        outs.append(logits.detach())
    loss.backward()
    return outs, {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def _assert_same(got, ref):
    """float32 logits (or outputs) and gradients within 1e-5 relative of the reference."""
    (outs, grads), (ref_outs, ref_grads) = got, ref
    for out, ref_out in zip(outs, ref_outs):
        assert_close_rel(out, ref_out, torch.float32, what="logits")
    assert grads.keys() == ref_grads.keys()
    for name in ref_grads:
        assert_close_rel(grads[name], ref_grads[name], torch.float32, what=f"grad {name}")


def _ids(n=2, seq=9, device="cpu"):
    return torch.randint(0, COMMON["vocab_size"], (n, seq)).to(device)


@pytest.mark.parametrize("name", MODELS)
def test_model_matches_eager(name):
    model = _build(name)
    ids = _ids()
    eager = _run(model, "eager", ids)
    ours = _run(model, "fuseops", ids)
    _assert_same(ours, eager)
    experts = [m for m in model.modules() if _is_experts(m)]
    assert experts
    for module in experts:
        plan = fx.experts_sequential(module).plan
        # permute -> one fused grouped MLP -> unpermute, forward and backward.
        assert [idx for _, idx in plan.forward] == [(0, 1, 2)]
        assert [idx for _, idx in plan.backward] == [(0, 1, 2)]


def test_weights_untouched_and_shared():
    model = _build("gpt_oss")
    before = {n: (p, p.data_ptr()) for n, p in model.named_parameters()}
    _run(model, "fuseops", _ids())
    after = dict(model.named_parameters())
    assert after.keys() == before.keys()
    assert all(after[n] is p and p.data_ptr() == ptr for n, (p, ptr) in before.items())
    experts = next(m for m in model.modules() if _is_experts(m))
    fc1, _, fc2 = fx.experts_sequential(experts)
    # Transposed experts: views of the model's own parameters, no copies.
    assert fc1.weight._base is experts.gate_up_proj and fc2.weight._base is experts.down_proj
    assert fc1.bias is experts.gate_up_proj_bias and fc2.bias is experts.down_proj_bias


def test_two_forwards_one_backward():
    # Every forward must hand the plan the tensors its pending backward matches grads to.
    model = _build("gpt_oss")
    batches = (_ids(seq=5), _ids(seq=7))
    _assert_same(_run(model, "fuseops", *batches), _run(model, "eager", *batches))


def test_gradient_checkpointing():
    # The layer's forward runs again inside backward.
    model = _build("gpt_oss")
    ids = _ids()
    eager = _run(model, "eager", ids)
    model.gradient_checkpointing_enable()
    model.config.use_cache = False
    _assert_same(_run(model, "fuseops", ids), eager)


def test_inference_without_grad():
    model = _build("qwen3_moe")
    ids = _ids()
    with torch.no_grad():
        model.set_experts_implementation("eager")
        ref = model(ids).logits
        model.set_experts_implementation("fuseops")
        out = model(ids).logits
    assert_close_rel(out, ref, torch.float32, what="logits")


@pytest.mark.skipif(not INTERPRET, reason="the Triton interpreter runs only where TRITON_INTERPRET=1")
@pytest.mark.parametrize("name", ["mixtral", "gpt_oss"])
def test_model_matches_eager_through_triton_kernels(name):
    # The kernels' path (scaled probs; transposed, interleaved, biased, clamped) on CPU.
    model = _build(name, layers=1)
    ids = _ids(n=1, seq=6)
    eager = _run(model, "eager", ids)
    with interpreted_kernels():
        ours = _run(model, "fuseops", ids)
    _assert_same(ours, eager)


def _experts_module(module_name: str, class_name: str, config_name: str, **config):
    """A standalone experts module; skips where this transformers lacks the model."""
    try:
        module = importlib.import_module(f"transformers.models.{module_name}.modeling_{module_name}")
        cls, config_cls = getattr(module, class_name), getattr(transformers, config_name)
    except (ImportError, AttributeError):
        pytest.skip(f"transformers {transformers.__version__} has no {class_name}")
    torch.manual_seed(0)
    experts = cls(config_cls(**config))
    with torch.no_grad():
        for p in experts.parameters():
            p.normal_(0.0, 0.3 if p.dim() > 2 else 0.1)
    return experts


def _run_experts(experts, implementation, x, ids, weights):
    experts.config._experts_implementation = implementation
    experts.zero_grad(set_to_none=True)
    x, weights = x.detach().requires_grad_(), weights.detach().requires_grad_()
    y = experts(x, ids, weights)
    probe = torch.randn(y.shape, generator=torch.Generator().manual_seed(2)).to(y)
    (y * probe).sum().backward()
    grads = {n: p.grad for n, p in experts.named_parameters()}
    return [y.detach()], {"x": x.grad, "weights": weights.grad, **grads}


def _routing(tokens, num_experts, top_k):
    ids = torch.randn(tokens, num_experts).topk(top_k, dim=-1).indices
    return ids, torch.rand(tokens, top_k) + 0.1


def _mixtral_experts(act):
    return _experts_module("mixtral", "MixtralExperts", "MixtralConfig", hidden_size=16, intermediate_size=12,
                           num_local_experts=6, hidden_act=act)


EXPERTS = {
    # Default gate with each activation that has a fuseops gated op.
    "swiglu": lambda: _mixtral_experts("silu"),
    "geglu": lambda: _mixtral_experts("gelu"),
    "geglu_tanh": lambda: _mixtral_experts("gelu_pytorch_tanh"),
    "reglu": lambda: _mixtral_experts("relu"),
    "sreglu": lambda: _mixtral_experts("relu2"),
    # Clamped SwiGLU with concatenated halves, constants under two attribute names.
    "privacy_filter": lambda: _experts_module(
        "openai_privacy_filter", "OpenAIPrivacyFilterExperts", "OpenAIPrivacyFilterConfig",
        hidden_size=16, intermediate_size=12, num_local_experts=6),
    "minimax_m3": lambda: _experts_module(
        "minimax_m3_vl", "MiniMaxM3VLExperts", "MiniMaxM3VLTextConfig",
        hidden_size=16, intermediate_size=12, num_local_experts=6, swiglu_limit=1.0, swiglu_alpha=1.5),
    # Ungated experts (up_proj, squared ReLU): the weights go to unpermute.
    "nemotron_h": lambda: _experts_module(
        "nemotron_h", "NemotronHExperts", "NemotronHConfig",
        hidden_size=16, moe_intermediate_size=12, n_routed_experts=6, mlp_hidden_act="relu2"),
}


@pytest.mark.parametrize("kind", list(EXPERTS))
def test_experts_module_matches_eager(kind):
    experts = EXPERTS[kind]()
    x = torch.randn(11, 16)
    ids, weights = _routing(11, 6, 2)
    eager = _run_experts(experts, "eager", x, ids, weights)
    ours = _run_experts(experts, "fuseops", x, ids, weights)
    _assert_same(ours, eager)
    assert fx.experts_sequential(experts) is not None


def test_all_tokens_to_one_expert():
    experts = _mixtral_experts("silu")
    x = torch.randn(9, 16)
    ids, weights = torch.full((9, 1), 4), torch.rand(9, 1)
    _assert_same(_run_experts(experts, "fuseops", x, ids, weights), _run_experts(experts, "eager", x, ids, weights))


FALLBACKS = {
    "quick_gelu": lambda: _mixtral_experts("quick_gelu"),
    # Clamped SiLU without gpt-oss's alpha and +1: no fuseops gated op computes it.
    "hy_v4": lambda: _experts_module(
        "hy_v4", "HYV4Experts", "HYV4Config",
        hidden_size=16, moe_intermediate_size=12, num_experts=6, swiglu_limit=1.0),
}


@pytest.mark.parametrize("kind", list(FALLBACKS))
def test_unsupported_gate_falls_back_to_grouped_mm_with_one_warning(kind):
    fx._warn_fallback.cache_clear()
    experts = FALLBACKS[kind]()
    x = torch.randn(11, 16)
    ids, weights = _routing(11, 6, 2)
    eager = _run_experts(experts, "eager", x, ids, weights)
    with pytest.warns(RuntimeWarning, match="grouped_mm experts instead") as record:
        ours = _run_experts(experts, "fuseops", x, ids, weights)
    assert sum("fuseops experts" in str(w.message) for w in record) == 1
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        again = _run_experts(experts, "fuseops", x, ids, weights)
    _assert_same(ours, eager)
    _assert_same(again, eager)
    assert fx.experts_sequential(experts) is None


@pytest.mark.gpu
@pytest.mark.parametrize("name", MODELS)
def test_model_bf16_on_gpu(name):
    # One MoE layer, so both runs route identically; each bf16 run is measured against
    # the float32 eager model with the same (bf16-rounded) weights.
    device = cuda_or_skip()
    model = _build(name, layers=1, device=device, dtype=torch.bfloat16)
    ids = _ids(n=4, seq=64, device=device)
    eager = _run(model, "eager", ids)
    ours = _run(model, "fuseops", ids)
    ref = _run(model.float(), "eager", ids)
    pairs = [("logits", ours[0][0], eager[0][0], ref[0][0])]
    pairs += [(f"grad {n}", ours[1][n], eager[1][n], ref[1][n]) for n in ref[1]]
    for what, got, theirs, exact in pairs:
        err, eager_err = rel_err(got, exact), rel_err(theirs, exact)
        assert err <= max(2 * eager_err, REL_TOL[torch.bfloat16]), f"{what}: {err:.2e} (eager bf16 {eager_err:.2e})"
