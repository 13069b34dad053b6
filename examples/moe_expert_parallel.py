"""Expert parallelism for a transformers MoE model on fuseops, as ``train_moe_lm.py --expert-parallel P``
uses it: every rank of a process group keeps E/P of each experts module's experts (rank r experts
``[r * E/P, (r + 1) * E/P)``) and runs them on the rows that every rank routes there, through
``fuseops.moe.dispatch`` / ``combine`` (or ``dispatch_chunks``, which overlaps the exchange with the
experts); the rest of the model stays whole on every rank, data-parallel.

    experts = shard_experts(model, group, pieces=None)     # before the optimizer sees the parameters
    model = torch.nn.parallel.DistributedDataParallel(model)  # after ignore_in_ddp(model, experts)
    ... loss.backward(); scale_expert_grads(experts, group) ...

The gradients: a rank's experts receive the rows of every rank's tokens, so their gradient sums
every rank's loss, while DDP averages the other parameters' over the ranks; dividing the experts'
by P gives both the gradient of the mean over all ranks' tokens, as one process on the whole
batch would have them.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

import fuseops
from fuseops import ops
from fuseops.moe import combine, dispatch, dispatch_chunks, permute, unpermute

NAME = "fuseops-ep"


@dataclass
class _Runner:
    """One experts module's local experts and where its rows go."""

    mlp: fuseops.Sequential
    num_experts: int
    group: dist.ProcessGroup
    pieces: int | None


def shard_experts(model: torch.nn.Module, group: dist.ProcessGroup, pieces: int | None = None
                  ) -> list[torch.nn.Parameter]:
    """Keeps this rank's experts of every experts module of ``model`` (gated, concatenated
    ``gate_up_proj`` [E, 2F, H] and ``down_proj`` [E, H, F], no bias: Qwen3-MoE's), as new
    parameters, and runs them expert-parallel over ``group``: in one exchange (``pieces=None``)
    or with the remote rows in ``pieces`` pieces beside the experts. Returns the new parameters."""
    from transformers.integrations.moe import ExpertsInterface

    ExpertsInterface.register(NAME, experts_forward)
    world, rank = dist.get_world_size(group), dist.get_rank(group)
    params = []
    for module in model.modules():
        if not (hasattr(module, "gate_up_proj") and hasattr(module, "down_proj")):
            continue
        if module.has_bias or module.is_transposed or not module.is_concatenated:
            raise ValueError(f"model: expected Qwen3-MoE-style experts (concatenated gate_up_proj, no bias, not "
                             f"transposed), got {type(module).__name__}")
        num_experts, two_ffn, hidden = module.gate_up_proj.shape
        if num_experts % world:
            raise ValueError(f"group: expected a size dividing the {num_experts} experts, got {world}")
        local = num_experts // world
        for attr in ("gate_up_proj", "down_proj"):
            full = getattr(module, attr)
            setattr(module, attr, torch.nn.Parameter(full.detach()[rank * local:(rank + 1) * local].clone()))
            params.append(getattr(module, attr))
        mlp = fuseops.Sequential(ops.GroupedLinear(local, hidden, two_ffn, device="meta"), ops.SwiGLU(),
                                 ops.GroupedLinear(local, two_ffn // 2, hidden, device="meta"))
        module._fuseops_expert_parallel = _Runner(mlp, num_experts, group, pieces)
    model.set_experts_implementation(NAME)
    return params


def experts_forward(self: torch.nn.Module, hidden_states: torch.Tensor, top_k_index: torch.Tensor,
                    top_k_weights: torch.Tensor) -> torch.Tensor:
    """The experts module's forward, expert-parallel: [T, H] rows, [T, K] expert ids and routing
    weights -> [T, H]."""
    r: _Runner = self._fuseops_expert_parallel
    fc1, _, fc2 = r.mlp
    # The GroupedLinears live on the meta device: the module's parameters are their storage.
    fc1._parameters["weight"], fc2._parameters["weight"] = self.gate_up_proj, self.down_proj
    device_type = hidden_states.device.type
    # The rows travel in the dtype the experts compute in (half the bytes under bf16 autocast).
    dtype = torch.get_autocast_dtype(device_type) if torch.is_autocast_enabled(device_type) else fc1.weight.dtype
    x_sorted, split_sizes, row_map = permute(hidden_states.to(dtype), top_k_index, r.num_experts)
    if r.pieces is None:
        x_local, splits, handle = dispatch(x_sorted, split_sizes, r.group)
        y_local = r.mlp(x_local, splits, splits)
    else:
        arrived, handle = dispatch_chunks(x_sorted, split_sizes, r.group, chunks=r.pieces)
        # A generator: each piece's output starts home as it comes, while the experts run on the next.
        y_local = (r.mlp(x_k, s_k, s_k) for x_k, s_k in arrived)
    y_sorted = combine(y_local, handle)
    w = top_k_weights if top_k_weights.dtype in (y_sorted.dtype, torch.float32) else top_k_weights.float()
    return unpermute(y_sorted, row_map, w).to(hidden_states.dtype)


def ignore_in_ddp(model: torch.nn.Module, params: list[torch.nn.Parameter]) -> None:
    """DDP leaves ``params`` (the sharded experts) alone: each rank holds different ones."""
    mine = {id(p) for p in params}
    names = [name for name, p in model.named_parameters() if id(p) in mine]
    torch.nn.parallel.DistributedDataParallel._set_params_and_buffers_to_ignore_for_model(model, names)


def scale_expert_grads(params: list[torch.nn.Parameter], group: dist.ProcessGroup) -> None:
    """After the backward: the experts' gradients over every rank's tokens, made the gradient of
    the mean over them (see the module docstring)."""
    world = dist.get_world_size(group)
    for p in params:
        if p.grad is not None:
            p.grad.div_(world)
