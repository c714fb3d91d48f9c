#!/usr/bin/env python3
"""Summarises an nvidia-smi sample file taken beside a benchmark (docs/performance.md#power-cap-and-energy: the
compute-bound FP8 rows run at the board's power cap, so a time change needs its clock and power beside it).

usage: clock_summary.py CSV
  CSV from: nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu,clocks_throttle_reasons.active
            --format=csv,noheader -lms 20
Prints, over the samples above 300 W (the kernel running): their count, the SM clock's and the power's
min / p10 / median / p90 / max, and the most common throttle-reason masks (0x4: SW power cap)."""
import collections
import sys


def summary(path):
    rows = [l.strip().split(", ") for l in open(path) if l.count(",") >= 4]
    busy = [r for r in rows if r[2].endswith("W") and float(r[2][:-2]) > 300]
    lines = [f"  {len(rows)} samples, {len(busy)} above 300 W"]
    for name, i in (("clock MHz", 1), ("power W", 2)):
        v = sorted(float(r[i].split()[0]) for r in busy)
        if v:
            lines.append(f"  {name}: min {v[0]:.0f} p10 {v[len(v)//10]:.0f} median {v[len(v)//2]:.0f} "
                         f"p90 {v[9*len(v)//10]:.0f} max {v[-1]:.0f}")
    lines.append(f"  throttle reasons: {collections.Counter(r[4] for r in busy).most_common(4)}")
    return "\n".join(lines)


if __name__ == "__main__":
    print(summary(sys.argv[1]))
