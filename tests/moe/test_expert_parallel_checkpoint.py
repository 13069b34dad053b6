"""Expert checkpoints across world sizes: ``expert_state_dict_for_rank`` splits a full expert state
dict for one rank, ``gather_expert_state_dicts`` joins the ranks' parts, so a checkpoint saved on
W ranks loads on W'. (The distributed MoE checks in test_expert_parallel_capacity.py load their
weights this way, from a checkpoint saved at another world size.)"""

import re

import pytest
import torch

import fuseops
from fuseops import ops
from fuseops.moe import expert_state_dict_for_rank, gather_expert_state_dicts

E, H, F = 8, 4, 3


def _experts(groups):
    return fuseops.Sequential(
        ops.GroupedLinear(groups, H, 2 * F, bias=True), ops.SwiGLU(), ops.GroupedLinear(groups, F, H, bias=True)
    )


@pytest.mark.parametrize("saved_at, loaded_at", [(1, 4), (2, 4), (4, 2), (8, 1), (2, 2)])
def test_checkpoint_moves_between_world_sizes(saved_at, loaded_at):
    full = _experts(E).state_dict()
    shards = [expert_state_dict_for_rank(full, r, saved_at) for r in range(saved_at)]
    for shard in shards:
        assert all(t.shape[0] == E // saved_at for t in shard.values())
    gathered = gather_expert_state_dicts(shards)
    assert gathered.keys() == full.keys() and all(torch.equal(gathered[k], full[k]) for k in full)

    x = torch.randn(2 * E, H)
    splits = [2] * E
    y_full = _experts(E)
    y_full.load_state_dict(full)
    want = y_full(x, splits, splits).detach()
    per = E // loaded_at
    for rank in range(loaded_at):
        local = _experts(per)
        local.load_state_dict(expert_state_dict_for_rank(gathered, rank, loaded_at))
        rows = slice(rank * 2 * per, (rank + 1) * 2 * per)
        torch.testing.assert_close(local(x[rows], splits[:per], splits[:per]).detach(), want[rows], rtol=0, atol=0)


def test_other_entries_pass_whole():
    full = {"router.weight": torch.randn(E, H), "experts.0.weight": torch.randn(E, 2 * F, H), "step": torch.tensor(7)}
    keys = ["experts.0.weight"]
    shards = [expert_state_dict_for_rank(full, r, 4, expert_keys=keys) for r in range(4)]
    assert all(s["router.weight"] is full["router.weight"] and s["step"] is full["step"] for s in shards)
    assert torch.equal(shards[3]["experts.0.weight"], full["experts.0.weight"][6:])
    gathered = gather_expert_state_dicts(shards, expert_keys=keys)
    assert all(torch.equal(gathered[k], full[k]) for k in full)


def test_bad_arguments():
    full = _experts(E).state_dict()
    cases = [
        ({"world_size": 0}, "world_size: expected an int >= 1, got 0"),
        ({"world_size": 3}, "world_size: expected a divisor of the 8 experts of full_state, got 3"),
        ({"rank": 4}, "rank: expected an int in [0, 4), got 4"),
        ({"rank": -1}, "rank: expected an int in [0, 4), got -1"),
        ({"expert_keys": ["0.weight", "1.weight"]}, "expert_keys: expected keys of full_state, got ['1.weight'] that it lacks"),
    ]
    for kwargs, message in cases:
        args = {"rank": 0, "world_size": 4} | kwargs
        with pytest.raises(ValueError, match=re.escape(message)):
            expert_state_dict_for_rank(full, **args)
    with pytest.raises(ValueError, match=re.escape("full_state: expected expert tensors with the same number of experts")):
        expert_state_dict_for_rank({"a": torch.zeros(8, 2), "b": torch.zeros(4, 2)}, 0, 2)
    with pytest.raises(ValueError, match=re.escape("full_state['s']: expected an expert tensor [E, ...], got shape []")):
        expert_state_dict_for_rank({"s": torch.tensor(1.0)}, 0, 2)

    shards = [expert_state_dict_for_rank(full, r, 2) for r in range(2)]
    with pytest.raises(ValueError, match=re.escape("shards: expected a non-empty sequence of state dicts")):
        gather_expert_state_dicts([])
    with pytest.raises(ValueError, match=re.escape("shards[1]: expected the keys of shards[0], got ['extra'] in only one")):
        gather_expert_state_dicts([shards[0], shards[1] | {"extra": torch.zeros(4)}])
    bad = dict(shards[1], **{"0.bias": torch.zeros(3, 2 * F)})
    with pytest.raises(ValueError, match=re.escape("shards[1]['0.bias']: expected shards[0]'s shape [4, 6], got [3, 6]")):
        gather_expert_state_dicts([shards[0], bad])
