# Session 51, run 11: the compiled dense test after the file's other tests, with its diagnostic message.
export PYTHONPATH=. PYTHONUNBUFFERED=1
t=tests/test_compiled_sequential.py
timeout 150 python3 -m pytest -p no:cacheprovider -q $t > $OUT/file.log 2>&1
echo "file rc=$? $(tail -1 $OUT/file.log)"
grep -E "^E " $OUT/file.log | cut -c1-1500 | head -8
