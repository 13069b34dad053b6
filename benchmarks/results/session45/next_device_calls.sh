# Prepared in session 45 for the next device session (its budget ran out here). One call each:
#   bash benchmarks/results/session45/next_device_calls.sh dense_small   # ~8 min
#   bash benchmarks/results/session45/next_device_calls.sh dense_large   # ~8 min
#   bash benchmarks/results/session45/next_device_calls.sh suite         # ~9.5 min
#   bash benchmarks/results/session45/next_device_calls.sh autocast      # ~4 min: float32 weights under autocast,
#     owed since session 45's merge touched the hot path (last run session 41: 0.72 / 0.82 / 0.83x, torch.nn 0.63x)
# dense_small / dense_large: issue 20's dense table with four rounds a cell and the eager ratio per round
# (`sizes.py`'s new `speedup_rounds`): session 45 found the GPU-bound cell under 1.0x (GELU T=4096 H=4096, 0.982x
# in session 44) no slower than torch in kernels or idle time (`kernel_sums.py`), its ratio within the 3-7 % the
# same variant's kernel time moves between rounds; the per-round ratios say whether a cell's shortfall is the
# clock's. suite: the GPU parts not run whole since session 44's executor changes (`quantops` reached 16 % in
# session 45's call 9; `quant`; the CUDA edge cases of the norms, residual and dense fusions: 55 cases, 7-22 s
# each, so as far as the call goes; the grouped and quantized subjects after).
export PYTHONPATH=. PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader
table() {
  python3 - <<'PY'
import json, os
rows = json.load(open(os.environ["OUT"] + "/sizes_dense.json"))["rows"]
print("act     T     H  eager/best  by round     comp/tcomp  host-bound")
for r in rows:
    best = min(r["torch_ms"], r["torch_compiled_ms"])
    rr = r["speedup_rounds"]
    print(f"{r['act']:6s} {r['T']:5d} {r['H']:5d}  {best / r['fuseops_ms']:9.3f}  {min(rr):.3f}-{max(rr):.3f}"
          f"  {r['torch_compiled_ms'] / r['fuseops_compiled_ms']:9.3f}  {r['host_bound']}")
PY
}
case "${1:-}" in
  dense_small)
    timeout 570 python3 -m benchmarks.sizes --part dense --H 1024 2048 --rounds 4 --out $OUT/sizes_dense \
      > $OUT/sizes_dense.log 2>&1; echo "sizes rc=$?"; table ;;
  dense_large)
    timeout 570 python3 -m benchmarks.sizes --part dense --H 4096 --rounds 4 --out $OUT/sizes_dense \
      > $OUT/sizes_dense.log 2>&1; echo "sizes rc=$?"; table ;;
  suite)
    LIMIT=280 bash benchmarks/run_gpu.sh quantops 2>&1 | tail -3
    LIMIT=$((570 - SECONDS)) bash benchmarks/run_gpu.sh edge "RMSNorm or LayerNorm or ExtraInput or ExtraOutput or ForwardLinearBiasActivation or ForwardLinearSeparateBiasActivation or BackwardBiasActivation or BackwardActivationLinear or BackwardLinearBiasActivation" 2>&1 | tail -3 ;;
  autocast)
    timeout 300 python3 -m benchmarks.autocast --T 1024 > $OUT/autocast.log 2>&1
    echo "autocast rc=$?"; tail -6 $OUT/autocast.log | cut -c1-200 ;;
  *) echo "usage: $0 dense_small|dense_large|suite|autocast" ;;
esac
