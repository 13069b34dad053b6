# Session 41, call 4: persistent blockwise casts (QuantizeConfig.persistent / prefetch, the kernel split into
# _load_tile / _quantize_tile): (a) the gpu-marked quantize kernel tests (the refactor, and the new persistent
# test); (b) the casts of one quantized expert-layer step at Qwen3 and Mixtral, each candidate bit for bit the
# library's. ~6 min.
export PYTHONPATH=. PYTHONUNBUFFERED=1
LIMIT=200 bash benchmarks/run_gpu.sh quantize 2>&1 | tail -4
for shape in qwen3 mixtral; do
  S=$SECONDS
  timeout 150 python3 benchmarks/results/session41/block_quantize_sweep.py $([ $shape = mixtral ] && echo --mixtral) \
    > $OUT/block_quantize_sweep_$shape.log 2>&1
  echo "$shape sweep rc=$? ($((SECONDS - S)) s)"; grep -v -i warn $OUT/block_quantize_sweep_$shape.log | cut -c1-200 | sed 's/QuantizeConfig(block_r=128, block_c=128, num_warps=/w=/'
done
