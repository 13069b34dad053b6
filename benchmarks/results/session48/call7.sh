# Session 48 run 9: issue 20's benchmark at T=1024 (H=1024 / 2048), main (ab_main/) then the branch, one machine.
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader
for tree in main branch; do
  path=.; [ $tree = main ] && path=ab_main:.
  echo "== $tree"
  PYTHONPATH=$path timeout 260 python3 -P -m benchmarks.sizes --part dense --T 1024 --H 1024 2048 --rounds 2 \
    --out $OUT/sizes_$tree > $OUT/sizes_$tree.log 2>&1; echo "rc=$?"; tail -6 $OUT/sizes_$tree.log | cut -c1-220
done
