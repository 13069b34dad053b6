# Session 59 added to every eager call a read of each op's _modules (call_signature: a parametrized op takes the full
# path), to every backward a check for batched cotangents (~0.25 us on the CPU machine), and to a compiled Sequential's
# trace one guard pair per op (DICT_LENGTH of its _modules: 646 -> 684 leaf guards for the 4-block dense stack, guard
# check 12.9 -> 13.4 us on the CPU machine, within its noise). On the H100 (~6 min): sizes.py's host-bound dense GELU
# cell (H=1024, T=1024) and the Qwen3 T=1024 cells on this tree, on a copy with fuseops/ at 7f979d7 (session 59's
# fuseops diff reversed: hot_path_session59.patch), then this tree again; compare enqueue ms and the compiled columns.
PATCH=benchmarks/results/session59/hot_path_session59.patch bash benchmarks/results/session58/hot_path_ab.sh
