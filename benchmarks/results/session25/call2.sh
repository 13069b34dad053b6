# Session 25, device call 2: call 1's failing graph test with its traceback, then the rest of the executor GPU tests.
export PYTHONPATH=. PYTHONUNBUFFERED=1
timeout 100 python3 -m pytest -q -p no:cacheprovider -m gpu "tests/ops/executor/test_graphed.py::test_a_graphed_replay_equals_the_full_path" --tb=short 2>&1 | grep -v "^  warn\|Warning" | tail -40
timeout 150 python3 -m pytest -q -p no:cacheprovider -m gpu tests/ops/executor --deselect "tests/ops/executor/test_graphed.py::test_a_graphed_replay_equals_the_full_path" --tb=line 2>&1 | tail -6
