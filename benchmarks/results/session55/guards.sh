# compiled_guards.py on the device (~2 min): dynamo's guard evaluation's share of a compiled step's host.
timeout 200 python3 benchmarks/results/session55/compiled_guards.py 2>&1 | grep -v Warn | tee "$OUT_PART/guards.log" | cut -c1-200
