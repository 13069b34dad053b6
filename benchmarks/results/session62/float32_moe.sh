# Session 62: a float32 MoE model end to end (sizes.py's MoE cells built in float32, no autocast), after the float32
# grouped GEMM tiles were timed (run 4-5): under torch's default IEEE float32 matmuls, then under
# torch.set_float32_matmul_precision("high") (TF32: fuseops' kernels and the torch baseline's GEMMs alike).
export PYTHONPATH=. PYTHONUNBUFFERED=1
for precision in highest high; do
  timeout ${SIDE_LIMIT:-250} python3 -c "
import runpy, sys, torch
torch.set_float32_matmul_precision('$precision')
sys.argv = ['sizes', '--part', 'moe', '--dtype', 'float32', '--shapes', *'${SHAPES:-qwen3 olmoe}'.split(),
            '--T', *'${TS:-1024 4096}'.split(), '--rounds', '1', '--reps', '10', '--out', '$OUT_PART/moe_$precision']
runpy.run_module('benchmarks.sizes', run_name='__main__')
" > "$OUT_PART/moe_$precision.log" 2>&1
  echo "$precision rc=$?"
  grep -hE "^(qwen3|olmoe|mixtral) " "$OUT_PART/moe_$precision.log" | cut -c1-200
done
