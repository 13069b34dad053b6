# Session 40, call 6 (prepared in session 39): Nsight Compute's per-instruction view of the FP8 blockwise forward
# and wgrad at Qwen3's FC1 (session 39 call 8: tensor pipe 61 % / 45 % busy against per-tensor's 82 %, twice the
# instructions issued): which instructions the consumer warps stall on (the scale loads, the promotion's FMAs,
# the barrier waits, the wgmma waits). The CSV comes back; read it here (no ncu on the CPU machine). ~2 min.
export PYTHONPATH=. PYTHONUNBUFFERED=1
NCU=$(which ncu || ls /opt/nvidia/nsight-compute/*/ncu | head -1)
S=$SECONDS
timeout 240 $NCU --clock-control none --kernel-name regex:"grouped_fp8" --import-source yes \
  --section SourceCounters --section WarpStateStats -o $OUT/blockwise -f \
  python3 benchmarks/results/session39/ncu_gemms.py --recipe "fp8 blockwise" > $OUT/ncu_run.log 2>&1
echo "ncu rc=$? ($((SECONDS - S)) s)"; tail -3 $OUT/ncu_run.log
for k in grouped_fp8_kernel grouped_fp8_wgrad_kernel; do
  $NCU -i $OUT/blockwise.ncu-rep --kernel-name $k --page source --csv --print-source sass > $OUT/source_$k.csv 2>&1
  echo "$k: $(wc -l < $OUT/source_$k.csv) lines"; head -2 $OUT/source_$k.csv | cut -c1-300
done
gzip -f $OUT/source_*.csv
rm -f $OUT/blockwise.ncu-rep
