# Session 48 run 8: the host probe on the branch and on main (ab_main/), gelu T=1024 H=1024.
export PYTHONUNBUFFERED=1
for tree in branch main; do
  path=.; [ $tree = main ] && path=ab_main:.
  echo "== $tree"
  PYTHONPATH=$path timeout 100 python3 benchmarks/results/session48/dead_results_probe.py host gelu:1024:1024 2>&1 | tail -40 | cut -c1-400
done
