"""Session 18 check of the quantize change where users start (the before-stop hook's list):
the FP8 MoE layer (permute, GroupedLinear, scaled SwiGLU, GroupedLinear, unpermute) with
float32 weights under torch.autocast(bfloat16) and fuseops.autocast(recipe), eager and under
torch.compile, at small token counts: outputs and gradients finite, compiled equal to eager,
and the relative error against the same layer in float64 (no recipe).
    python benchmarks/results/session18/fp8_user_checks.py
"""
import sys

import torch

sys.path.insert(0, ".")
import fuseops
from benchmarks.moe_layer import composed_layer, make_case


def grads(case):
    return [t.grad.clone() for t in (case.x, case.w1, case.w2)]


def step(case, layer, recipe):
    for t in (case.x, case.w1, case.w2, case.weights):
        t.grad = None
    with torch.autocast("cuda", dtype=torch.bfloat16), fuseops.autocast(recipe=recipe):
        y = layer()
    (y.float() * case.dy.float()).sum().backward()
    return y.float(), grads(case)


def rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def main():
    for T in (256, 1024):
        case = make_case(E=16, T=T, H=512, I=256, K=4, dtype=torch.float32)
        ref_case = make_case(E=16, T=T, H=512, I=256, K=4, dtype=torch.float64)
        with torch.no_grad():
            for name in ("x", "ids", "weights", "dy", "w1", "w2"):
                getattr(ref_case, name).copy_(getattr(case, name))
        ref_layer = composed_layer(ref_case)
        y64 = ref_layer()
        (y64 * ref_case.dy).sum().backward()
        g64 = grads(ref_case)
        layer = composed_layer(case)
        for name, recipe in (("current", fuseops.recipes.FP8CurrentScaling()), ("blockwise", fuseops.recipes.FP8Blockwise())):
            y, g = step(case, layer, recipe)
            compiled = torch.compile(layer)
            yc, gc = step(case, compiled, recipe)
            finite = all(torch.isfinite(t).all().item() for t in (y, *g, yc, *gc))
            print(f"T={T} {name:9}: finite {finite}, compiled == eager: out {torch.equal(y, yc)}, "
                  f"grads {all(torch.equal(a, b) for a, b in zip(g, gc))}; rel err vs float64: out {rel(y, y64):.3f}, "
                  f"dx {rel(g[0], g64[0]):.3f}, dw1 {rel(g[1], g64[1]):.3f}, dw2 {rel(g[2], g64[2]):.3f}", flush=True)


if __name__ == "__main__":
    main()
