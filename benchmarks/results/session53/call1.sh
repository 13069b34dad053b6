# Session 53, device call 1: the host-path trims A/B (this tree, then base53 = HEAD before them, then this tree
# again; one process each, one machine), with fuseops' whole-model graph (its GPU floor) and both models' kernel time.
export PYTHONPATH=. PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
cells="gelu:1024:2048 gelu:1024:1024"
timeout 170 python3 benchmarks/results/session53/floor.py --cells $cells --kernels 2>&1 | grep -v Warn \
  | tee $OUT/trimmed1.log
(cd base53 && PYTHONPATH=. timeout 150 python3 -P benchmarks/results/session53/floor.py --cells $cells 2>&1 \
  | grep -v Warn | tee $OUT/base.log)
timeout 150 python3 benchmarks/results/session53/floor.py --cells $cells 2>&1 | grep -v Warn | tee $OUT/trimmed2.log
