# Session 15, device call 4: issue 22's autocast table at T=4096 with the torch.nn dense row
# beside ours; the MoE sizes table (issue 20; never run before), one shape per run.
export PYTHONPATH=. PYTHONUNBUFFERED=1
timeout 100 python3 -m benchmarks.autocast --rounds 2 --out $OUT/autocast.json > $OUT/autocast.log 2>&1; echo "autocast rc=$?"
for shape in qwen3 olmoe mixtral; do
  timeout 145 python3 -m benchmarks.sizes --part moe --shapes $shape --reps 5 --out $OUT/sizes_moe_$shape > $OUT/sizes_moe_$shape.log 2>&1
  echo "sizes moe $shape rc=$?"
done
tail -5 $OUT/autocast.log | cut -c1-140
python3 -c "import json,glob
from benchmarks.sizes import print_table
rows=[r for f in sorted(glob.glob(\"$OUT/sizes_moe_*.json\")) for r in json.load(open(f)).get(\"rows\", [])]
print_table(rows)" | cut -c1-150
