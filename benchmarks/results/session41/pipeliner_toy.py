"""Session 41 probe (issue 24): what Triton 3.6's software pipeliner does with a gathered tile load in a persistent
loop (offline, sm_90 target, no GPU). With ``tl.range(..., num_stages=2 or 3)`` the index load becomes an async copy
into shared memory and the tile load it feeds stays a synchronous ``tt.load`` (its user is no dot): prefetching a
picked tile needs it in registers by hand, as ``call4_persistent_casts.patch`` did.

    python benchmarks/results/session41/pipeliner_toy.py 2    # prints the async copies in the TTGIR
"""
import sys

import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource


@triton.jit
def toy(x, idx, out, n_tiles, C, BR: tl.constexpr, BC: tl.constexpr, STAGES: tl.constexpr):
    """Persistent programs, each tile's rows picked through ``idx`` (as the quantize kernel's ``rows=``)."""
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    tiles_c = C // BC
    for t in tl.range(pid, n_tiles, nprog, num_stages=STAGES):
        rows = (t // tiles_c) * BR + tl.arange(0, BR)
        src = tl.load(idx + rows)
        cols = (t % tiles_c) * BC + tl.arange(0, BC)
        v = tl.load(x + src[:, None] * C + cols[None, :]).to(tl.float32)
        m = tl.max(tl.abs(v), 1)
        tl.store(out + rows[:, None] * C + cols[None, :], (v / m[:, None]).to(tl.float8e4nv))


def main() -> None:
    stages = int(sys.argv[1]) if len(sys.argv) > 1 else 2
    signature = {"x": "*bf16", "idx": "*i32", "out": "*fp8e4nv", "n_tiles": "i32", "C": "i32",
                 "BR": "constexpr", "BC": "constexpr", "STAGES": "constexpr"}
    src = ASTSource(fn=toy, signature=signature, constexprs={"BR": 128, "BC": 128, "STAGES": stages})
    k = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 8})
    ttgir = k.asm["ttgir"]
    print("stages", stages, "async copies:", ttgir.count("async_copy_global_to_local"), "shared bytes:",
          k.metadata.shared)
    for line in ttgir.splitlines():
        if "async_copy_global_to_local" in line or " tt.load " in line:
            print("  ", line.strip()[:160])


if __name__ == "__main__":
    main()
