#!/usr/bin/env python3
"""Summarises ncu's per-instruction warp-stall samples (PC sampling) of one kernel.

Input: the CSV of `ncu -i REPORT --page source --csv --print-source sass` for a report taken with
--section SourceCounters (scripts/remote-run.sh's callers keep it). Prints the stall reasons over all
samples and the instructions with the most samples, or, with --range LO HI (hex, the low 20 bits of
the addresses), every instruction of that range in order: how a loop spends its time.
"""
import argparse
import collections
import csv


def load(path):
    rows = list(csv.reader(open(path)))
    hdr = rows[1]
    ix = {h: i for i, h in enumerate(hdr)}
    stalls = [h for h in hdr if h.startswith("stall_") and "Not Issued" not in h]
    out = []
    for r in rows[2:]:
        if len(r) < len(hdr):
            continue
        try:
            samples = int(r[ix["Warp Stall Sampling (All Samples)"]] or 0)
        except ValueError:
            continue
        reasons = {h[6:]: int(r[ix[h]]) for h in stalls if r[ix[h]] not in ("", "-") and int(r[ix[h]]) > 0}
        out.append((int(r[0], 16) & 0xFFFFF, r[1].strip(), samples, r[ix["Instructions Executed"]] or "0", reasons))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("csv")
    ap.add_argument("--top", type=int, default=40)
    ap.add_argument("--range", nargs=2, metavar=("LO", "HI"))
    a = ap.parse_args()
    ins = load(a.csv)
    total = sum(s for _, _, s, _, _ in ins)

    def line(addr, src, s, ex, reasons):
        top = sorted(reasons.items(), key=lambda x: -x[1])[:3]
        return f"{addr:05x} {s:7d} {100 * s / max(total, 1):5.1f}% ex={ex:>9s} {src[:64]:64s} " + " ".join(f"{k}={v}" for k, v in top)

    if a.range:
        lo, hi = (int(x, 16) for x in a.range)
        sel = [i for i in ins if lo <= i[0] < hi]
        for i in sel:
            print(line(*i))
        print(f"range samples {sum(i[2] for i in sel)} of {total}")
        return
    by_reason = collections.Counter()
    for *_, reasons in ins:
        by_reason.update(reasons)
    print(f"total samples {total}")
    for k, v in by_reason.most_common():
        print(f"  {k:24s} {v:9d} {100 * v / max(total, 1):5.1f}%")
    for i in sorted(ins, key=lambda x: -x[2])[: a.top]:
        print(line(*i))


if __name__ == "__main__":
    main()
