# Session 40, call 11: Nsight Compute on the gathered cast of FC1's input at Qwen3, blockwise against per-tensor
# (ncu_casts.py; call 10: 1.017 against 0.567 ms for the same bytes): speed of light, memory, warp states, and the
# blockwise one's per-instruction stalls. ~2 min.
export PYTHONPATH=. PYTHONUNBUFFERED=1
NCU=$(which ncu || ls /opt/nvidia/nsight-compute/*/ncu | head -1)
S=$SECONDS
timeout 300 $NCU --clock-control none --kernel-name quantize_kernel --launch-count 4 --import-source yes \
  --section SpeedOfLight --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis --section Occupancy \
  --section LaunchStats --section SchedulerStats --section WarpStateStats --section SourceCounters \
  -o $OUT/casts -f python3 benchmarks/results/session40/ncu_casts.py > $OUT/ncu_run.log 2>&1
echo "ncu rc=$? ($((SECONDS - S)) s)"; tail -2 $OUT/ncu_run.log
$NCU -i $OUT/casts.ncu-rep --print-summary none --page details > $OUT/casts_details.txt 2>&1
grep -E "quantize_kernel|Duration|Memory Throughput|DRAM Throughput|Compute \(SM\) Throughput|Registers Per|Achieved Occupancy|Theoretical Occupancy|Issue Slots Busy|No Eligible|L1/TEX Hit|L2 Hit|Block Size|Grid Size|Warp Cycles Per Issued|Executed Ipc A" $OUT/casts_details.txt | cut -c1-120 | head -80
$NCU -i $OUT/casts.ncu-rep --launch-skip 0 --launch-count 1 --page source --csv --print-source sass > $OUT/source_block_cast.csv 2>&1
wc -l $OUT/source_block_cast.csv; gzip -f $OUT/source_block_cast.csv; rm -f $OUT/casts.ncu-rep
