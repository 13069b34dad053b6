"""Session 19: why the fullgraph compile of the quantized MoE layer fails on torch 2.11 (device)
in dynamo's autograd.Function handling (``overwrite_tensor_vt_proxy``: a forward-graph output
paired with an output that is neither a tensor nor a SymInt) where torch 2.13 (CPU) compiles it:
prints each mismatching pair and the row count it happened at.
    python benchmarks/results/session19/vt_debug.py [recipe] [dtype]
"""
import sys

import torch
import torch._dynamo.variables.higher_order_ops as hop

sys.path.insert(0, ".")
sys.path.insert(0, "tests/quant")
import test_compile as tc

real = hop.overwrite_tensor_vt_proxy


def traced(graph_output_vts, flat_variable):
    vts = list(graph_output_vts)
    items = list(flat_variable.items)
    print(f"  overwrite: {len(vts)} graph outputs, {len(items)} flat items")
    for i, (o, s) in enumerate(zip(vts, items)):
        bad = (o.is_tensor() or type(o).__name__ == "SymNodeVariable") and not (
            s.is_tensor() or type(s).__name__ == "SymNodeVariable")
        if bad or i < 3:
            ex = getattr(o, "proxy", None)
            ex = ex.node.meta.get("example_value") if ex is not None else None
            print(f"   {'BAD ' if bad else ''}[{i}] orig {type(o).__name__} ({type(ex).__name__} "
                  f"{getattr(ex, 'shape', ex)}) / subgraph {type(s).__name__} {s}"[:300])
    return real(vts, flat_variable)


hop.overwrite_tensor_vt_proxy = traced
recipe = {r.__class__.__name__: r for r in tc.RECIPES}[sys.argv[1] if len(sys.argv) > 1 else "FP8Blockwise"]
dtype = torch.bfloat16 if (len(sys.argv) < 3 or sys.argv[2] == "bf16") else torch.float32
experts = tc.experts_mlp("cuda", dtype)
params = list(experts.parameters())
layer = tc.moe_layer(experts)
compiled = torch.compile(layer, fullgraph=True)
for T in (256, 384):
    print(f"T={T}", flush=True)
    x, ids, dy = tc.moe_inputs(T, "cuda", dtype)
    try:
        tc.step(lambda x, ids=ids: compiled(x, ids), params, x, dy, recipe, autocast=dtype == torch.float32)
        print(f"T={T} ok", flush=True)
    except (AssertionError, RuntimeError) as exc:
        print(f"T={T} {type(exc).__name__}: {str(exc)[:200]}", flush=True)
        break
