"""Session 18 check of the quantize change where users start (the before-stop hook's list):
the FP8 MoE layer (permute, GroupedLinear, scaled SwiGLU, GroupedLinear, unpermute) with
float32 weights under torch.autocast(bfloat16) and fuseops.autocast(recipe), eager and under
torch.compile, at small token counts: outputs and gradients finite, compiled equal to eager,
and the relative error against the same layer in float64 (no recipe).
    python benchmarks/results/session18/fp8_user_checks.py eager|compile none,current,blockwise 256,1024
(CHECK_BACKEND=aot_eager: the compiled graph without inductor's code generation.)
(call 16 ran an earlier form, eager then compiled in one process: the compiled FP8 current
scaling layer hit a device-side assert in an inductor kernel; call 17 splits the cases)
"""
import os
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


RECIPES = {"current": fuseops.recipes.FP8CurrentScaling, "blockwise": fuseops.recipes.FP8Blockwise, "none": lambda: None}


def cases(T):
    case = make_case(E=16, T=T, H=512, I=256, K=4, dtype=torch.float32)
    ref_case = make_case(E=16, T=T, H=512, I=256, K=4, dtype=torch.float64)
    with torch.no_grad():
        for name in ("x", "ids", "weights", "dy", "w1", "w2"):
            getattr(ref_case, name).copy_(getattr(case, name))
    y64 = composed_layer(ref_case)()
    (y64 * ref_case.dy).sum().backward()
    return case, y64, grads(ref_case)


def main():
    # eager: every case; compile: one case a process (a device-side assert ends the process).
    mode, names, tokens = sys.argv[1], sys.argv[2].split(","), [int(t) for t in sys.argv[3].split(",")]
    for T in tokens:
        case, y64, g64 = cases(T)
        layer = composed_layer(case)
        for name in names:
            recipe = RECIPES[name]()
            if mode == "compile":
                torch._dynamo.reset()
                layer = torch.compile(composed_layer(case), backend=os.environ.get("CHECK_BACKEND", "inductor"))
            y, g = step(case, layer, recipe)
            finite = all(torch.isfinite(t).all().item() for t in (y, *g))
            print(f"T={T} {mode} {name:9}: finite {finite}; rel err vs float64: out {rel(y, y64):.4f}, "
                  f"dx {rel(g[0], g64[0]):.4f}, dw1 {rel(g[1], g64[1]):.4f}, dw2 {rel(g[2], g64[2]):.4f}", flush=True)


if __name__ == "__main__":
    main()
