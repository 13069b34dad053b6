# Session 52, device call 4: the graphs part with the mended test (32,768 rows), then issue 20's cells that missed
# in session 51 (GELU H=2048 T=1024 host-bound 1.12x; compiled below torch.compile at five cells), three rounds.
export PYTHONPATH=. PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader
LIMIT=220 OUT=$OUT bash benchmarks/run_gpu.sh graphs > $OUT/graphs_part.txt 2>&1; cat $OUT/graphs_part.txt
grep -E "^E  " $OUT/graphs.log | head -6 | cut -c1-300
for spec in "gelu 2048 1024" "swiglu 2048 1024" "gelu 4096 1024" "swiglu 4096 1024"; do
  set -- $spec
  timeout 110 python3 -m benchmarks.sizes --part dense --acts $1 --H $2 --T $3 --rounds 3 \
    --out $OUT/sizes_$1_$2_$3 > $OUT/sizes_$1_$2_$3.log 2>&1; echo "$spec rc=$?"
  grep -E "^(gelu|swiglu) H=" $OUT/sizes_$1_$2_$3.log | cut -c1-200
done
