# Session 61 added to every eager Sequential call a read of torch's float32 matmul precision (replay.layout_key: a
# recorded program is keyed by it) and a scan of the saved tensors for unsaved inputs that require grad
# (second_backward.unsaved_input_links: ~1 us on the CPU machine), and for each such input (a residual input, one a
# recipe or autocast casts before saving, the expert layer's x and router weights) a 0-row clone (~4 us on the CPU).
# On the H100 (~6 min): sizes.py's host-bound dense GELU cell (H=1024, T=1024) and the Qwen3 T=1024 cells on this
# tree, on a copy with fuseops/ at affa93d (session 61's fuseops diff reversed: hot_path_session61.patch), then this
# tree again; compare enqueue ms and step ms.
PATCH=benchmarks/results/session61/hot_path_session61.patch bash benchmarks/results/session58/hot_path_ab.sh
