# Session 22, device call 8: the executor changed inside the autograd Function (recorded runs): the compile
# tests on the device's torch 2.11 (CPU and GPU variants), as the notes ask after such a change.
export PYTHONPATH=. PYTHONUNBUFFERED=1
timeout 230 python3 -m pytest -q -p no:cacheprovider tests/test_compile.py 2>&1 | grep -E "passed|failed|FAILED|^E " | tail -8
