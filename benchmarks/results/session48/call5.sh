# Session 48 run 6 (run 5 failed: ab_main/ lacked pyproject.toml): main against the branch (dead-results) at the host-bound dense cells, one machine, alternating
# (run 4 on the branch: gelu T=1024 H=1024 1.87 ms a step against torch eager's 1.52, 4 graphs dropped; session 46's
# call 12 on main, another machine: 1.14 against 2.11). ab_main/ holds main's fuseops (git archive, not committed).
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader
for round in 1 2; do
  for tree in main branch; do
    path=.; [ $tree = main ] && path=ab_main:.
    echo "== round $round $tree $(PYTHONPATH=$path python3 -P -c "import fuseops.ops.executor.graph_pool as g; print(g.__file__, hasattr(g, \"SMALL_REQUEST\"))")"
    PYTHONPATH=$path timeout 120 python3 benchmarks/results/session46/shared_pool.py --cells gelu:1024:1024 swiglu:1024:1024 gelu:4096:1024 \
      --variants torch today 2>&1 | grep -v "^cell" | cut -c1-170
  done
done
