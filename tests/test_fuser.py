import torch

import fuseops
from fuseops import ops
from fuseops.fuser import build_plan, plan_config
from fuseops.fusions import REGISTRY, Fusion, Stage, match
from fuseops.ops.contract import OpGrads


def _cfg(x=None, grad=True):
    x = torch.randn(2, 4) if x is None else x
    return plan_config(x, None, grad)


def test_longest_pattern_wins_and_both_stage_fusions_hold_both_directions():
    model = fuseops.Sequential(ops.GroupedLinear(2, 4, 8), ops.SwiGLU(), ops.GroupedLinear(2, 4, 4))
    split = [1, 1]
    plan = build_plan(list(model), _cfg(), [(split,), (), (split,)])
    assert plan.forward == [("GroupedMLP", (0, 1, 2))]
    assert plan.backward == [("GroupedMLP", (0, 1, 2))]


def test_declined_fusions_say_why():
    model = fuseops.Sequential(ops.GroupedLinear(2, 4, 8), ops.SwiGLU(), ops.GroupedLinear(2, 4, 4))
    x = torch.randn(3, 4)
    model(x, [1, 2], [2, 1])
    assert [name for name, _ in model.plan.forward] == ["GroupedLinear", "SwiGLU", "GroupedLinear"]
    assert ("GroupedMLP", (0, 1, 2), "the two GroupedLinears get different split sizes") in model.plan.declined
    # Equal host values count as the same split sizes.
    model(x, [1, 2], [1, 2])
    assert model.plan.forward == [("GroupedMLP", (0, 1, 2))]


def test_without_grad_both_stage_fusions_run_forward_only():
    model = fuseops.Sequential(ops.GroupedLinear(2, 4, 8), ops.GELU(), ops.GroupedLinear(2, 8, 4))
    split = torch.tensor([2, 1])
    with torch.no_grad():
        model(torch.randn(3, 4), split, split)
    assert model.plan.forward == [("GroupedMLP", (0, 1, 2))]


class _DoubleIdentity(Fusion):
    """A user fusion defined outside the package: one class, passed to the planner."""

    pattern = (match(ops.Identity), match(ops.Identity))
    stage = Stage.BACKWARD

    def fused_backward(self, ops_, ctxs, dy, extra_output_grads):
        return [OpGrads(dy), OpGrads(None)]


def test_a_new_fusion_is_one_class():
    seq = [ops.Identity(), ops.Identity(), ops.ReLU()]
    plan = build_plan(seq, _cfg(), [(), (), ()], fusions=[*REGISTRY, _DoubleIdentity()])
    assert plan.backward == [("_DoubleIdentity", (0, 1)), ("ReLU", (2,))]
    assert plan.forward == [("Identity", (0,)), ("Identity", (1,)), ("ReLU", (2,))]


def test_bias_without_grad_declines_the_dbias_fusion():
    model = fuseops.Sequential(ops.Linear(4, 4), ops.ReLU())
    model[0].bias.requires_grad_(False)
    model(torch.randn(2, 4, requires_grad=True)).sum().backward()
    assert ("BackwardLinearBiasActivation", (0, 1), "the bias needs no gradient") in model.plan.declined
