# Session 16, device call 4: the MoE range checks moved into the permute / unpermute kernels
# (issue 20's MoE host path): the routing and expert-layer GPU tests (device-assert subprocess
# tests, CUDA graph capture, no host sync), the MoE host profile and the MoE sizes at T=1024.
export PYTHONPATH=. PYTHONUNBUFFERED=1
timeout -s INT 240 python3 -m pytest -p no:cacheprovider -q -rfE --tb=short -m gpu tests/moe tests/kernels/moe \
  > $OUT/tests_moe.log 2>&1
echo "moe tests rc=$?"; grep -E "^(FAILED|ERROR)" $OUT/tests_moe.log | cut -c1-220; tail -1 $OUT/tests_moe.log
timeout 50 python3 -m benchmarks.host_profile --parts moe --count-ops --top 40 > $OUT/host_profile_moe.log 2>&1; echo "host_profile rc=$?"
for shape in olmoe qwen3 mixtral; do
  timeout 90 python3 -m benchmarks.sizes --part moe --shapes $shape --T 1024 --reps 5 --out $OUT/sizes_moe_$shape > $OUT/sizes_moe_$shape.log 2>&1
  echo "sizes moe $shape rc=$?"
done
grep "====" $OUT/host_profile_moe.log | cut -c1-300
python3 -c "import json,glob
from benchmarks.sizes import print_table
rows=[r for f in sorted(glob.glob(\"$OUT/sizes_moe_*.json\")) for r in json.load(open(f)).get(\"rows\", [])]
print_table(rows)" | cut -c1-150
