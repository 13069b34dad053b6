# Session 43, call 4: issue 20's dense table, every cell, with the busy-host issue time (sizes.py's new column), on
# main with branch moe-eager-replay merged; then the MoE layer's default CUDA-graph decision against
# FUSEOPS_CUDA_GRAPHS=all (moe_host_ab.py --ab graphs) at Qwen3 T=16384 / 4096.
# The graphs A/B is void: the two layers share the routing graph states, so both kept the first decisions (phases
# {graphed: 1, eager: 1} in both modes); the --ab graphs mode was removed after this call.
export PYTHONPATH=. PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader
S=$SECONDS
timeout 470 python3 -m benchmarks.sizes --part dense --out $OUT/sizes_dense > $OUT/sizes_dense.log 2>&1
echo "sizes dense rc=$? ($((SECONDS - S)) s)"; grep -A20 "^cell" $OUT/sizes_dense.log | cut -c1-250
S=$SECONDS
timeout $((585 - SECONDS)) python3 benchmarks/results/session43/moe_host_ab.py --ab graphs --cells qwen3:16384 qwen3:4096 > $OUT/moe_host_ab_graphs.log 2>&1
echo "graphs A/B rc=$? ($((SECONDS - S)) s)"; grep -v -i warn $OUT/moe_host_ab_graphs.log | tail -16
