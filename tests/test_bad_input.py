"""Bad input to every public function: a ValueError or TypeError that names the argument,
the value given and the form expected, raised at the boundary (op constructors, the
Sequential's check of each op's input spec, the functions' own checks), before any kernel.
Each row: the call, the exception, and a pattern holding the argument's name, the value
given and the expected form."""

from __future__ import annotations

import pytest
import torch

import fuseops
import fuseops.integrations.transformers as fx
from fuseops import moe, ops
from fuseops.quant import recipes

NAN = float("nan")
X = torch.randn(4, 8)


def _seq(*o):
    return fuseops.Sequential(*o)


def _experts():
    return fuseops.Sequential(ops.GroupedLinear(3, 8, 8), ops.SwiGLU(), ops.GroupedLinear(3, 4, 8))


CASES = [
    # Sequential
    (lambda: _seq(1), TypeError, r"ops: expected fuseops basic ops or fuseops.Sequential, got int"),
    (lambda: _seq(torch.nn.Linear(2, 2)), TypeError, r"ops: expected fuseops basic ops.*got Linear"),
    (lambda: fuseops.Sequential(ops.ReLU(), fuse="x"), TypeError, r"fuse: expected True or False, got 'x'"),
    (lambda: _seq(ops.ReLU())([1.0]), TypeError, r"input: expected a torch.Tensor, got list"),
    (lambda: _seq(ops.Linear(8, 4))(X, X), TypeError, r"extra_inputs: expected 0 extra input"),
    # Op constructors
    (lambda: ops.Linear(0, 4), ValueError, r"in_features: expected a positive int, got 0"),
    (lambda: ops.Linear("4", 4), ValueError, r"in_features: expected a positive int, got '4'"),
    (lambda: ops.Linear(4, 4.5), ValueError, r"out_features: expected a positive int, got 4.5"),
    (lambda: ops.Linear(4, 4, bias="yes"), TypeError, r"bias: expected True or False, got 'yes'"),
    (lambda: ops.GroupedLinear(0, 4, 4), ValueError, r"num_groups: expected a positive int, got 0"),
    (lambda: ops.GroupedLinear(2, 4, 4, bias=1), TypeError, r"bias: expected True or False, got 1"),
    (lambda: ops.Bias(2.5), ValueError, r"size: expected a positive int, got 2.5"),
    (lambda: ops.GELU("x"), ValueError, r"approximate: expected one of 'none', 'tanh', got 'x'"),
    (lambda: ops.GeGLU("fast"), ValueError, r"approximate: expected one of 'none', 'tanh', got 'fast'"),
    (lambda: ops.SwiGLU(interleaved="no"), TypeError, r"interleaved: expected True or False, got 'no'"),
    (lambda: ops.ReGLU(scaled=None), TypeError, r"scaled: expected True or False, got None"),
    (lambda: ops.ClampedSwiGLU(limit=-1), ValueError, r"limit: expected a positive float, got -1"),
    (lambda: ops.ClampedSwiGLU(limit=NAN), ValueError, r"limit: expected a positive float, got nan"),
    (lambda: ops.ClampedSwiGLU(alpha=NAN), ValueError, r"alpha: expected a finite float, got nan"),
    (lambda: ops.LayerNorm(0), ValueError, r"normalized_shape: expected a positive int, got 0"),
    (lambda: ops.LayerNorm(4, eps=NAN), ValueError, r"eps: expected a positive float, got nan"),
    (lambda: ops.RMSNorm(4, eps="a"), ValueError, r"eps: expected a positive float, got 'a'"),
    (lambda: ops.Dropout(1.5), ValueError, r"p: expected a float in \[0, 1\), got 1.5"),
    (lambda: ops.Dropout(True), ValueError, r"p: expected a float in \[0, 1\), got True"),
    (lambda: ops.Quantize(forward="x"), TypeError, r"forward: expected True or False, got 'x'"),
    (lambda: ops.Reshape(None), TypeError, r"shape: expected an int or a tuple of ints, got None"),
    (lambda: ops.Reshape((2, -1, -1)), ValueError, r"shape: expected positive ints with at most one -1, got \[2, -1, -1\]"),
    # Op calls
    (lambda: _seq(ops.Linear(4, 4))(torch.randn(2, 3)), ValueError, r"Linear input: expected shape \[\.\.\., 4\], got \[2, 3\]"),
    (lambda: _seq(ops.Linear(4, 4))(torch.ones(2, 4, dtype=torch.int64)), TypeError, r"input: dtype torch.int64 is not supported; expected float32"),
    (lambda: _seq(ops.Linear(4, 4))(torch.randn(2, 4, dtype=torch.float16)), TypeError, r"Linear input: dtype torch.float16 does not match Linear.weight \(torch.float32\)"),
    (lambda: _seq(ops.GroupedLinear(2, 4, 4))(torch.randn(5, 4), [2, 2]), ValueError, r"split_sizes: expected sizes summing to the 5 input rows, got \[2, 2\]"),
    (lambda: _seq(ops.GroupedLinear(2, 4, 4))(torch.randn(4, 4), [5, -1]), ValueError, r"split_sizes: expected non-negative sizes, got \[5, -1\]"),
    (lambda: _seq(ops.GroupedLinear(2, 4, 4))(torch.randn(4, 4), [4]), ValueError, r"split_sizes: expected 2 sizes, got 1: \[4\]"),
    (lambda: _seq(ops.GroupedLinear(2, 4, 4))(torch.randn(4, 4), [2.0, 2]), TypeError, r"split_sizes: expected ints, got \['float', 'int'\]"),
    (lambda: _seq(ops.GroupedLinear(2, 4, 4))(torch.randn(4, 4), "22"), TypeError, r"split_sizes: expected a list, tuple or integer tensor of 2 sizes, got str"),
    (lambda: _seq(ops.GroupedLinear(2, 4, 4))(torch.randn(4, 4), torch.tensor([2.0, 2.0])), TypeError, r"split_sizes: expected an integer dtype, got torch.float32"),
    (lambda: _seq(ops.GroupedLinear(2, 4, 4))(torch.randn(4, 4), torch.tensor([[2, 2]])), ValueError, r"split_sizes: expected shape \[2\], got \[1, 2\]"),
    (lambda: _seq(ops.GroupedLinear(2, 4, 4))(torch.randn(5, 4), torch.tensor([2, 2])), ValueError, r"split_sizes: expected sizes summing to the 5 input rows, got \[2, 2\] \(sum 4\)"),
    (lambda: _seq(ops.GroupedLinear(2, 4, 4))(torch.randn(4, 4), torch.tensor([5, -1])), ValueError, r"split_sizes: expected non-negative sizes, got \[5, -1\]"),
    (lambda: _seq(ops.AddExtraInput())(X, torch.randn(4, 3)), ValueError, r"extra input r: expected shape \[4, 8\], got \[4, 3\]"),
    (lambda: _seq(ops.AddExtraInput())(X, 3.0), TypeError, r"extra input r: expected a torch.Tensor, got float"),
    (lambda: _seq(ops.LayerNorm(4))(torch.randn(2, 3)), ValueError, r"LayerNorm input: expected shape \[\.\.\., 4\], got \[2, 3\]"),
    (lambda: _seq(ops.SwiGLU())(torch.randn(3, 5)), ValueError, r"SwiGLU input: expected shape \[\.\.\., 2 \* F\].*got \[3, 5\]"),
    (lambda: _seq(ops.SwiGLU(scaled=True))(X, torch.rand(5)), ValueError, r"probs: expected shape \[4\], got \[5\]"),
    (lambda: _seq(ops.SwiGLU(scaled=True))(X, torch.ones(4, dtype=torch.int64)), TypeError, r"probs: expected dtype .*got torch.int64"),
    (lambda: _seq(ops.Reshape((3, -1)))(X), ValueError, r"Reshape input: shape \[4, 8\] cannot be reshaped to \[3, -1\]"),
    # autocast, quantize
    (lambda: fuseops.autocast(recipe="mxfp8").__enter__(), TypeError, r"autocast recipe: expected None or one of .*got 'mxfp8'"),
    (lambda: fuseops.quantize([1.0], recipes.MXFP8()), TypeError, r"x: expected a torch.Tensor, got list"),
    (lambda: fuseops.quantize(torch.ones(2, 4, dtype=torch.int32), recipes.MXFP8()), ValueError, r"x: expected dtype float32.*got torch.int32"),
    (lambda: fuseops.quantize(X, "mxfp8"), TypeError, r"recipe: expected None or one of .*got 'mxfp8'"),
    (lambda: fuseops.quantize(X, recipes.MXFP8(), role="x"), ValueError, r"role: expected a TensorRole or one of 'input', 'weight', 'grad', got 'x'"),
    (lambda: fuseops.quantize(X, recipes.MXFP8(), rowwise="x"), TypeError, r"rowwise: expected True or False, got 'x'"),
    (lambda: fuseops.quantize(X, recipes.MXFP8(), offsets=[0, 4]), ValueError, r"offsets: expected an integer tensor \[G \+ 1\].*got list"),
    (lambda: fuseops.quantize(X, recipes.MXFP8(), offsets=torch.tensor([0, 2, 5])), ValueError, r"offsets: expected non-decreasing row offsets from 0 to 4 \(x's rows\), got \[0, 2, 5\]"),
    # moe
    (lambda: moe.permute(X, torch.zeros(4, 1, dtype=torch.int64), 0), ValueError, r"num_experts: expected an int >= 1, got 0"),
    (lambda: moe.permute(X, torch.zeros(4, 1), 2), TypeError, r"expert_ids: expected an integer dtype, got torch.float32"),
    (lambda: moe.permute(X, torch.tensor([[0], [1], [2], [3]]), 3), ValueError, r"expert_ids: expected values in \[0, 3\) .*got values in \[0, 3\]"),
    (lambda: moe.unpermute(X, torch.arange(4).view(2, 2), torch.rand(4)), ValueError, r"weights: expected shape \[2, 2\] \(row_map's\), got \[4\]"),
    (lambda: moe.unpermute(X, torch.arange(4, dtype=torch.int32).view(2, 2), None), TypeError, r"row_map: expected int64 .*got torch.int32"),
    (lambda: moe.unpermute(X, torch.tensor([[0, 1], [2, 4]]), None), ValueError, r"row_map: expected values in \[0, 4\) .*got values in \[0, 4\]"),
    (lambda: moe.expert_layer(X, torch.zeros(4, 2, dtype=torch.int64), None, ops.ReLU()), TypeError,
     r"experts: expected a fuseops.Sequential\(GroupedLinear.*got ReLU"),
    (lambda: moe.expert_layer(X, torch.zeros(4, 2, dtype=torch.int64), torch.rand(4, 3), _experts()), ValueError,
     r"weights: expected shape \[4, 2\] \(expert_ids'\), got \[4, 3\]"),
    (lambda: moe.expert_layer(X, torch.zeros(4, 2, dtype=torch.int64), None, _experts(), lean="yes"), TypeError,
     r"lean: expected True or False, got 'yes'"),
    (lambda: moe.expert_layer(X, torch.full((4, 2), 3), None, _experts()), ValueError,
     r"expert_ids: expected values in \[0, 3\) .*got values in \[3, 3\]"),
    # offload
    (lambda: fuseops.offload_activations(keep_last=-1).__enter__(), ValueError, r"keep_last: expected an int >= 0, got -1"),
    (lambda: fuseops.offload_activations(min_tensor_bytes=-1).__enter__(), ValueError, r"min_tensor_bytes: expected an int >= 0, got -1"),
    (lambda: fuseops.offload_activations(group_budget_bytes=-5).__enter__(), ValueError, r'group_budget_bytes: expected "auto", None or an int >= 0, got -5'),
    (lambda: fuseops.offload_activations(enabled="yes").__enter__(), TypeError, r"enabled: expected True or False, got 'yes'"),
    (lambda: fuseops.mark_not_offload(3), TypeError, r"tensors\[0\]: expected a torch.Tensor or a storage with data_tensors\(\), got int"),
    # transformers
    (lambda: fx.enable("mixtral"), TypeError, r"model: expected a torch.nn.Module .*got str"),
]


@pytest.mark.parametrize("call, error, pattern", CASES, ids=[f"{i}" for i in range(len(CASES))])
def test_bad_input_names_argument_value_and_form(call, error, pattern):
    with pytest.raises(error, match=pattern):
        call()


def test_transformers_register_names_the_missing_requirement(monkeypatch):
    transformers = pytest.importorskip("transformers")  # the integration's extra, as its tests

    monkeypatch.setattr(transformers, "__version__", "5.6.0")
    with pytest.raises(ImportError, match=r"expected transformers>=5.7, got 5.6.0"):
        fx.register()
