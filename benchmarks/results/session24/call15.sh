# Session 24, device call 15: program states of the cells where graphs did not pay in call 14.
export PYTHONPATH=.
for cell in "gelu 4096 1024" "swiglu 1024 2048"; do
  echo "== $cell"; timeout 60 python3 benchmarks/results/session24/graph_states.py $cell 2>&1 | grep -E "^(graphed|eager|measuring|trial|\{)" | cut -c1-260
done
