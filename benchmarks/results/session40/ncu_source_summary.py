"""Session 40: summarize Nsight Compute's per-instruction CSV (`ncu --page source --csv --print-source sass`, call 6)
of the FP8 blockwise forward / wgrad: warp-stall samples by reason and by opcode, instructions by opcode, and the
instructions with the most samples with their two main stall reasons.

    python benchmarks/results/session40/ncu_source_summary.py benchmarks/results/session40/call6_source_*.csv.gz
"""
import collections
import csv
import gzip
import io
import sys


def number(x: str) -> float:
    try:
        return float(x)
    except ValueError:
        return 0.0


def summary(path: str, top: int = 12) -> None:
    lines = gzip.open(path, "rt").read().splitlines()
    header = next(j for j, line in enumerate(lines) if line.startswith('"Address"'))
    rows = list(csv.DictReader(io.StringIO("\n".join(lines[header:]))))
    stalls = [c for c in rows[0] if c.startswith("stall_") and "Not Issued" not in c]
    samples = [number(r["Warp Stall Sampling (All Samples)"]) for r in rows]
    total = sum(samples)
    print(f"\n=== {path}: {len(rows)} SASS lines, {total:.0f} samples")
    reasons = collections.Counter()
    for r in rows:
        for c in stalls:
            reasons[c] += number(r[c])
    print("stall reasons (% of samples):", [(c[6:], round(100 * v / total, 1)) for c, v in reasons.most_common(8)])
    executed, sampled = collections.Counter(), collections.Counter()
    for r, s in zip(rows, samples):
        words = r["Source"].split()
        op = (words[1] if words and words[0].startswith("@") else words[0] if words else "?").split(".")[0]
        executed[op] += number(r["Instructions Executed"])
        sampled[op] += s
    n = sum(executed.values())
    print("instructions by opcode (%):", [(o, round(100 * v / n, 1)) for o, v in executed.most_common(10)])
    print("samples by opcode (%):", [(o, round(100 * v / total, 1)) for o, v in sampled.most_common(10)])
    for r, s in sorted(zip(rows, samples), key=lambda rs: -rs[1])[:top]:
        why = sorted(((c[6:], number(r[c])) for c in stalls), key=lambda cv: -cv[1])[:2]
        print(f"  {r['Address'][-5:]} {100 * s / total:5.1f}%  executed {number(r['Instructions Executed']):>8.0f}  "
              f"{r['Source'].strip()[:60]:60s} {why}")


if __name__ == "__main__":
    for p in sys.argv[1:]:
        summary(p)
