# Session 39, call 8: Nsight Compute on the FP8 grouped GEMMs at Qwen3 (FC1 forward and wgrad), blockwise against
# per-tensor: where the blockwise kernels stall (issue 24: 790-990 TFLOP/s against per-tensor's 1,100-1,350).
export PYTHONPATH=. PYTHONUNBUFFERED=1
which ncu || ls /opt/nvidia/nsight-compute/*/ncu
NCU=$(which ncu || ls /opt/nvidia/nsight-compute/*/ncu | head -1)
SECTIONS="--section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis --section WarpStateStats --section SchedulerStats --section Occupancy --section LaunchStats --section SourceCounters"
for r in "fp8 blockwise:blockwise" "fp8 current:current"; do
  recipe=${r%%:*}; tag=${r##*:}
  S=$SECONDS
  timeout 240 $NCU --clock-control none --kernel-name regex:"grouped_(fp8|tensor_scaled)" $SECTIONS \
    python3 benchmarks/results/session39/ncu_gemms.py --recipe "$recipe" > $OUT/ncu_$tag.txt 2>&1
  echo "$tag rc=$? ($((SECONDS - S)) s)"
  grep -E "^  grouped|Duration|Compute \(SM\) Throughput|Memory Throughput|Issue Slots Busy|No Eligible|Warp Cycles Per Issued|Registers Per|Achieved Occupancy" $OUT/ncu_$tag.txt | head -40
done
