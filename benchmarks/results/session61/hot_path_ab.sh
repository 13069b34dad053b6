# Session 61 added to every eager Sequential call (and expert layer) a read of torch's float32 matmul precision and
# deterministic flag (replay.global_state, in every replay key) and weak references to the inputs that require grad
# (second_backward.input_links: a few us on the CPU machine, within its noise at a small dense block's step).
# On the H100 (~6 min): sizes.py's host-bound dense GELU cell (H=1024, T=1024) and the Qwen3 T=1024 cells on this
# tree, on a copy with fuseops/ at affa93d (session 61's fuseops diff reversed: hot_path_session61.patch), then this
# tree again; compare enqueue ms and step ms.
PATCH=benchmarks/results/session61/hot_path_session61.patch bash benchmarks/results/session58/hot_path_ab.sh
