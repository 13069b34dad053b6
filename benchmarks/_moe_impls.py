"""The MoE layer's implementations that ``benchmarks/moe_layer.py`` times side by side, over one
``Case`` (the same tokens, routing and weights for each): fuseops' expert layer (default, lean, under
a recipe) and its composition of public ops, plain torch with ``torch._grouped_mm`` (eager and
compiled), SonicMoE (when it imports), transformers' experts and Liger-Kernel's fused MoE."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

import fuseops
from fuseops import ops
from fuseops.moe import expert_layer, permute, unpermute

IMPLS = ("fuseops", "fuseops lean", "sonicmoe", "fuseops composed", "torch", "torch.compile", "liger",
         "hf grouped_mm", "hf fuseops", "fuseops fp8", "fuseops fp8 blk", "fuseops fp8 layer", "fuseops fp8 blk layer")
# Not run unless asked (--impls): the FP8 expert layers (fuseops/moe/expert_layer_quantized.py), for
# moe_profile's kernel breakdown against the FP8 compositions ("fuseops fp8", "fuseops fp8 blk").
ON_REQUEST = ("liger", "fuseops fp8 layer", "fuseops fp8 blk layer")

@dataclass
class Case:
    x: torch.Tensor
    ids: torch.Tensor
    weights: torch.Tensor
    dy: torch.Tensor
    w1: torch.nn.Parameter
    w2: torch.nn.Parameter
    # The experts' GroupedLinears add their weight gradients to the weights' float32 main_grad
    # (accumulate_into_main_grad, as Megatron-style training does) instead of ``.grad``.
    main_grad: bool = False
    # Other layouts' copies of w1 and w2 (SonicMoE's): their gradients are reset with the case's.
    anchor_weights: list[torch.nn.Parameter] = field(default_factory=list)

    def leaves(self) -> list[torch.Tensor]:
        return [self.x, self.weights, self.w1, self.w2]

    def route(self, seed: int, skewed: bool = False) -> None:
        """New routing (top-K of random logits, softmax weights) into the same tensors; ``skewed``:
        every even-numbered token's top-1 slot then goes to expert 0 (module docstring)."""
        T, E = self.x.shape[0], self.w1.shape[0]
        g = torch.Generator(device=self.x.device).manual_seed(seed)
        logits = torch.randn(T, E, device=self.x.device, generator=g)
        top, ids = logits.topk(self.ids.shape[1], dim=-1)
        if skewed:
            even = ids[::2]
            # The slot that held expert 0 takes the old top-1 expert: a token's experts stay distinct.
            even.copy_(torch.where(even == 0, even[:, :1], even))
            even[:, 0] = 0
        with torch.no_grad():
            self.ids.copy_(ids)
            self.weights.copy_(top.softmax(-1))

    def fresh_leaves(self) -> None:
        """New leaves over the same data for ``x`` and the router weights, as each training step's
        inputs are new tensors (no gradient accumulates into an earlier step's)."""
        self.x = self.x.detach().requires_grad_()
        self.weights = self.weights.detach().requires_grad_()


def make_case(E: int, T: int, H: int, I: int, K: int, device="cuda", dtype=torch.bfloat16,
              main_grad: bool = False) -> Case:
    torch.manual_seed(0)
    kw = dict(device=device, dtype=dtype)
    case = Case(
        x=torch.randn(T, H, **kw).requires_grad_(),
        ids=torch.empty(T, K, device=device, dtype=torch.int64),
        weights=torch.empty(T, K, **kw).requires_grad_(),
        dy=torch.randn(T, H, **kw),
        w1=torch.nn.Parameter(torch.randn(E, 2 * I, H, **kw) / math.sqrt(H)),
        w2=torch.nn.Parameter(torch.randn(E, H, I, **kw) / math.sqrt(I)),
        main_grad=main_grad,
    )
    if main_grad:
        for w in (case.w1, case.w2):
            w.main_grad = torch.zeros(w.shape, device=device, dtype=torch.float32)
    case.route(0)
    return case


def _experts(case: Case, scaled: bool) -> fuseops.Sequential:
    E, two_i, H = case.w1.shape
    fc1 = ops.GroupedLinear(E, H, two_i, device="meta", accumulate_into_main_grad=case.main_grad)
    fc2 = ops.GroupedLinear(E, two_i // 2, H, device="meta", accumulate_into_main_grad=case.main_grad)
    fc1.weight, fc2.weight = case.w1, case.w2
    return fuseops.Sequential(fc1, ops.SwiGLU(scaled=scaled), fc2)


def fuseops_layer(case: Case, lean: bool = False) -> Callable[[], torch.Tensor]:
    experts = _experts(case, scaled=False)
    return lambda: expert_layer(case.x, case.ids, case.weights, experts, lean=lean)


def liger_layer(case: Case) -> Callable[[], torch.Tensor]:
    from liger_kernel.ops.fused_moe import LigerFusedMoEFunction

    def layer() -> torch.Tensor:
        # Liger takes int32 ids; the cast is part of its call, as a user's would be.
        return LigerFusedMoEFunction.apply(case.x, case.w1, case.w2, case.ids.to(torch.int32), case.weights)

    return layer


def composed_layer(case: Case) -> Callable[[], torch.Tensor]:
    E = case.w1.shape[0]
    mlp = _experts(case, scaled=True)

    def layer() -> torch.Tensor:
        x_sorted, split_sizes, row_map = permute(case.x, case.ids, E)
        # The router weights in x_sorted's row order: the SwiGLU's per-row scale.
        w = case.weights
        probs = w.new_empty(row_map.numel()).scatter(0, row_map.reshape(-1), w.reshape(-1))
        return unpermute(mlp(x_sorted, split_sizes, probs, split_sizes), row_map, None)

    return layer


def torch_moe(x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor, w1: torch.Tensor,
              w2: torch.Tensor) -> torch.Tensor:
    """The layer in plain torch: x [T, H], ids and weights [T, K], w1 [E, 2I, H], w2 [E, H, I]."""
    E, K = w1.shape[0], ids.shape[1]
    flat = ids.reshape(-1)
    order = torch.argsort(flat, stable=True)
    # bincount would read the max id back to the host; scatter_add_ stays on the device.
    counts = torch.zeros(E, device=x.device, dtype=torch.int64).scatter_add_(0, flat, torch.ones_like(flat))
    offs = counts.cumsum(0).to(torch.int32)
    token = order // K
    h = torch._grouped_mm(x[token], w1.transpose(1, 2), offs=offs)
    gate, up = h.chunk(2, dim=-1)
    y = torch._grouped_mm(F.silu(gate) * up, w2.transpose(1, 2), offs=offs)
    y = y * weights.reshape(-1)[order, None]
    return torch.zeros_like(x).index_add_(0, token, y)


def torch_layer(case: Case) -> Callable[[], torch.Tensor]:
    return lambda: torch_moe(case.x, case.ids, case.weights, case.w1, case.w2)


def compiled_layer(case: Case, backend: str = "inductor") -> Callable[[], torch.Tensor]:
    # Static shapes: each shape compiles once (run_benchmark resets dynamo between shapes).
    compiled = torch.compile(torch_moe, backend=backend, dynamic=False)
    return lambda: compiled(case.x, case.ids, case.weights, case.w1, case.w2)


def sonicmoe_weights(w1: torch.Tensor, w2: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """fuseops' w1 [E, 2I, H] and w2 [E, H, I] as SonicMoE stores them: the same shapes, contiguous,
    SonicMoE taking their ``permute(1, 2, 0)`` views ([2I, H, E] and [H, I, E], E outermost in
    memory). fuseops' SwiGLU reads FC1's rows as halves ``[gate; up]``, SonicMoE's as interleaved
    pairs: its row ``2j`` is gate row ``j``, row ``2j + 1`` up row ``j``."""
    E, two_i, H = w1.shape
    return w1.view(E, 2, two_i // 2, H).transpose(1, 2).contiguous().view(E, two_i, H), w2.clone()


def fuseops_weight_grads(dw1: torch.Tensor, dw2: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Gradients of ``sonicmoe_weights``' tensors back in fuseops' layout (its inverse)."""
    E, two_i, H = dw1.shape
    return dw1.view(E, two_i // 2, 2, H).transpose(1, 2).reshape(E, two_i, H), dw2


def sonicmoe_routing(ids: torch.Tensor, weights: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """SonicMoE's routing inputs from ids and weights [T, K]: ``router_scores`` [T*K] float32,
    ``token_indices`` [T*K] int32 (sorted ascending, as it requires) and ``expert_indices`` [T*K]
    int32, one entry per (token, slot) in ``ids.reshape(-1)``'s order."""
    T, K = ids.shape
    tokens = torch.arange(T, device=ids.device, dtype=torch.int32).repeat_interleave(K)
    return weights.reshape(-1).float(), tokens, ids.reshape(-1).to(torch.int32)


def sonicmoe_unavailable(device: torch.device) -> str | None:
    """Why SonicMoE cannot run here, or None."""
    try:
        import sonicmoe.functional  # noqa: F401
    except Exception as exc:  # absent or broken: the anchor is skipped, the rest runs
        return f"it does not import ({exc!r}); benchmarks/README.md says how to carry it"
    return None if device.type == "cuda" else "its kernels run on CUDA only"


class SonicMoELayer:
    """SonicMoE's whole layer over the case's tokens and routing, on copies of the case's weights in
    its layout (made here, once, outside timing; registered in ``case.anchor_weights``)."""

    def __init__(self, case: Case) -> None:
        from sonicmoe.enums import ActivationType
        from sonicmoe.functional import moe_general_routing_inputs

        self.moe, self.swiglu, self.case = moe_general_routing_inputs, ActivationType.SWIGLU, case
        w1, w2 = sonicmoe_weights(case.w1.detach(), case.w2.detach())
        self.w1, self.w2 = torch.nn.Parameter(w1), torch.nn.Parameter(w2)
        case.anchor_weights += [self.w1, self.w2]

    def __call__(self) -> torch.Tensor:
        case = self.case
        # The routing's casts are part of the call, as a user's would be.
        y, _ = self.moe(case.x, *sonicmoe_routing(case.ids, case.weights), self.w1.permute(1, 2, 0), None,
                        self.w2.permute(1, 2, 0), None, self.w1.shape[0], torch.cuda.current_stream().cuda_stream,
                        self.swiglu, False)
        return y

    def weight_grads(self, experts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """dw1 and dw2 of ``experts`` in fuseops' layout."""
        return fuseops_weight_grads(self.w1.grad[experts], self.w2.grad[experts])


def hf_layer(case: Case, implementation: str) -> Callable[[], torch.Tensor]:
    from transformers import Qwen3MoeConfig
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeExperts

    E, two_i, H = case.w1.shape
    config = Qwen3MoeConfig(hidden_size=H, moe_intermediate_size=two_i // 2, num_experts=E,
                            num_experts_per_tok=case.ids.shape[1], hidden_act="silu")
    config._experts_implementation = implementation
    with torch.device("meta"):
        experts = Qwen3MoeExperts(config)
    experts.gate_up_proj, experts.down_proj = case.w1, case.w2
    return lambda: experts(case.x, case.ids, case.weights)


def quantized(layer: Callable[[], torch.Tensor], recipe) -> Callable[[], torch.Tensor]:
    """The same layer with its GEMMs under ``recipe`` (FP8 against our bf16)."""

    def run() -> torch.Tensor:
        with fuseops.autocast(recipe=recipe):
            return layer()

    return run


def implementations(case: Case, names=IMPLS, compile_backend: str = "inductor") -> dict[str, Callable[[], torch.Tensor]]:
    impls = {"fuseops": fuseops_layer(case), "fuseops lean": fuseops_layer(case, lean=True),
             "fuseops composed": composed_layer(case), "torch": torch_layer(case),
             "torch.compile": compiled_layer(case, compile_backend)}
    impls["fuseops fp8"] = quantized(composed_layer(case), fuseops.recipes.FP8CurrentScaling())
    impls["fuseops fp8 blk"] = quantized(composed_layer(case), fuseops.recipes.FP8Blockwise())
    impls["fuseops fp8 layer"] = quantized(fuseops_layer(case), fuseops.recipes.FP8CurrentScaling())
    impls["fuseops fp8 blk layer"] = quantized(fuseops_layer(case), fuseops.recipes.FP8Blockwise())
    if "sonicmoe" in names:
        reason = sonicmoe_unavailable(case.x.device)
        if reason is None:
            impls["sonicmoe"] = SonicMoELayer(case)
        else:
            print(f"sonicmoe skipped: {reason}", flush=True)
    if "liger" in names:
        try:
            impls["liger"] = liger_layer(case)
        except ImportError as exc:
            print(f"liger skipped: {exc}", flush=True)
    try:
        import fuseops.integrations.transformers as fx

        fx.register()
        impls["hf grouped_mm"] = hf_layer(case, "grouped_mm")
        impls["hf fuseops"] = hf_layer(case, "fuseops")
    except ImportError as exc:
        print(f"transformers baselines skipped: {exc}", flush=True)
    return {name: layer for name, layer in impls.items() if name in names or name == "torch"}
