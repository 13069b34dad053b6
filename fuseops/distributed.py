"""Sharded models and full (single-process) state dicts: this rank's slices of a full state dict
(``shard_state_dict``), and the full state dict gathered from the ranks (``gather_state_dict``),
so that a checkpoint saved at one world size loads at another."""

from collections.abc import Mapping

import torch
import torch.distributed as dist

from fuseops.exported_names import exported_dir
from fuseops.ops.grouped_linear import GroupedLinear
from fuseops.ops.linear import Linear
from fuseops.ops.parallel import tensor_parallel as tp

__all__ = ["gather_state_dict", "shard_state_dict"]


def shard_state_dict(
    full_state: Mapping[str, torch.Tensor],
    model: torch.nn.Module,
    *,
    expert_group: "dist.ProcessGroup | None" = None,
) -> dict[str, torch.Tensor]:
    """This rank's shards of ``full_state``, ready for ``model.load_state_dict``.

    ``full_state`` is the state dict of the same model built without parallelism (or of
    the equivalent ``torch.nn.Linear`` layers: the keys and layouts are the same). For
    every tensor-parallel ``Linear`` of ``model`` the weight and bias are sliced as the
    layer holds them, on the layer's own ``tensor_parallel_group``: column parallel
    keeps rows ``[rank * out/P, (rank + 1) * out/P)`` of the weight and of the bias,
    row parallel keeps those columns of the weight (in/P of them) and the whole bias.
    With ``expert_group`` (expert parallelism, see ``fuseops.moe.expert_parallel``), each
    ``GroupedLinear`` of G local experts keeps experts ``[rank * G, (rank + 1) * G)``
    of the full [G * P, ...] weight and bias. Every other entry is passed through.

    Args:
        full_state: the unsharded state dict (each tensor at its full shape).
        model: the sharded model (a ``fuseops.Sequential`` or any module holding ops).
        expert_group: the expert-parallel process group, if the experts are sharded.
    Returns:
        A new dict; sharded entries are views of ``full_state``'s tensors.
    Raises:
        ValueError: a sharded entry's full shape is not what the layer implies (the
            message names the key, the shape given and the shape expected).
    """
    if expert_group is not None:
        tp.check_group("expert_group", expert_group)
    out = dict(full_state)
    for key, name, param, module in _parameters_in(model, out):
        if isinstance(module, Linear) and module.tensor_parallel is not None:
            out[key] = _shard_linear(key, name, out[key], param, module.tensor_parallel)
        elif isinstance(module, GroupedLinear) and expert_group is not None:
            out[key] = _shard(key, out[key], param, 0, expert_group)
    return out


def _parameters_in(model: torch.nn.Module, keys: Mapping[str, object]):
    """``(key, name, parameter, module)`` of each of ``model``'s parameters whose state-dict key
    is in ``keys``, ``name`` its name in its module."""
    for prefix, module in model.named_modules():
        for name, param in module.named_parameters(recurse=False):
            key = f"{prefix}.{name}" if prefix else name
            if key in keys:
                yield key, name, param, module


def _shard_linear(key: str, name: str, full: torch.Tensor, param: torch.Tensor, cfg: tp.TensorParallel
                  ) -> torch.Tensor:
    if not cfg.column and name == "bias":
        return _shard(key, full, param, None, cfg.group)
    return _shard(key, full, param, 0 if cfg.column else 1, cfg.group)


def _shard(key: str, full: torch.Tensor, param: torch.Tensor, dim: int | None, group: "dist.ProcessGroup"
           ) -> torch.Tensor:
    """Slice ``full`` along ``dim`` (``None``: kept whole) to this rank's part of ``param``'s shape."""
    expected = list(param.shape)
    world = dist.get_world_size(group)
    if dim is not None:
        expected[dim] *= world
    if list(full.shape) != expected:
        raise ValueError(
            f"full_state[{key!r}]: expected the full shape {expected} (the local "
            f"{list(param.shape)} on {world} ranks), got {list(full.shape)}"
        )
    if dim is None:
        return full
    size = param.shape[dim]
    return full.narrow(dim, dist.get_rank(group) * size, size)


def gather_state_dict(
    model: torch.nn.Module, *, expert_group: "dist.ProcessGroup | None" = None
) -> dict[str, torch.Tensor]:
    """The full state dict of a sharded ``model``, on every rank: the inverse of
    ``shard_state_dict``, whose result (or ``torch.save``'s file of it) loads into the same
    model at any world size, or into the model built without parallelism.

    Every tensor-parallel ``Linear``'s weight and bias are all-gathered on the layer's group
    (column parallel along dim 0, row parallel along dim 1, its bias whole); with
    ``expert_group``, each ``GroupedLinear``'s experts along dim 0 in rank order. Entries that
    FSDP2 (``torch.distributed.fsdp.fully_shard``) holds as DTensors are gathered first
    (``full_tensor()``), so an FSDP2 shard of a tensor-parallel weight comes back whole. Every
    other entry is passed through. It runs collectives: every rank of those groups calls it,
    with the same model.

    Args:
        model: the sharded model (a ``fuseops.Sequential`` or any module holding ops).
        expert_group: the expert-parallel process group, if the experts are sharded.
    Returns:
        A new dict with ``model.state_dict()``'s keys, each tensor at its full shape.
    """
    from torch.distributed.tensor import DTensor

    if expert_group is not None:
        tp.check_group("expert_group", expert_group)
    out = {key: value.full_tensor() if isinstance(value, DTensor) else value
           for key, value in model.state_dict().items()}
    for key, name, _, module in _parameters_in(model, out):
        if isinstance(module, Linear) and module.tensor_parallel is not None:
            cfg = module.tensor_parallel
            if cfg.column or name != "bias":
                out[key] = _gather(out[key], 0 if cfg.column else 1, cfg.group)
        elif isinstance(module, GroupedLinear) and expert_group is not None:
            out[key] = _gather(out[key], 0, expert_group)
    return out


def _gather(local: torch.Tensor, dim: int, group: "dist.ProcessGroup") -> torch.Tensor:
    """Every rank's ``local`` concatenated along ``dim``, in rank order."""
    parts = [torch.empty_like(local) for _ in range(dist.get_world_size(group))]
    dist.all_gather(parts, local.contiguous(), group=group)
    return torch.cat(parts, dim)


def __dir__() -> list[str]:
    return exported_dir(globals(), __all__)
