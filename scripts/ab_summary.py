#!/usr/bin/env python3
"""Summarises an A/B of `epfuse bench --json` files: one row a shape, one column a binary.

Usage: ab_summary.py [--base TAG] FILE.json...
Each file is one binary's run in one round, named [ab-]TAG[-anything]-rN.json with no "-" in TAG
(scripts/remote-run.sh's ab and ab-layer steps write them so). For every fused row (config, T per rank,
ranks, dtype) and binary it prints the median of the rounds' medians in us, their range, and the ratio to
the base binary (--base, default "main" when present, else the first tag in sorted order); a row that
failed its check in some round is marked UNVERIFIED, since its time means nothing. Runs with --sustained
add a second table of the same form over the sustained ms a call: on the power-capped rows that one
carries the A/B, where the synchronised medians spread 3-5% between rounds of one binary
(docs/performance.md#ptxass-register-usage-level-2026-12-02-not-kept). A phase change needs
its prefill rows here beside its decode rows
(docs/performance.md#the-count-messages-before-the-layout-and-the-layout-of-one-block-2026-11-30-not-kept).
"""
import argparse
import collections
import json
import os
import re
import statistics
import sys


def tag_and_round(path):
    """("main", 2) for .../ab-main-qwen3-r2.json or .../main-r2.json."""
    m = re.fullmatch(r"(?:ab-)?(?P<tag>[^-]+)(?:-.*)?-r(?P<round>\d+)\.json", os.path.basename(path))
    if not m:
        raise ValueError(f"{path}: not named [ab-]TAG[-...]-rN.json")
    return m.group("tag"), int(m.group("round"))


def row_key(r):
    name = r.get("config") or "custom"
    if name == "custom":
        name = f"H{r['hidden']}/I{r['intermediate']}/E{r['experts']}/k{r['topk']}"
    return (name, int(r["tokens_per_rank"]), int(r.get("ranks", 1)), r.get("dtype", ""))


def collect(paths):
    """{row key: {tag: {"ms": [round medians], "sustained": [rounds' sustained ms a call], "verified": all
    rounds verified}}} and the tags seen."""
    table = collections.defaultdict(dict)
    tags = set()
    for path in paths:
        tag, _ = tag_and_round(path)
        tags.add(tag)
        with open(path, encoding="utf-8") as f:
            rows = json.load(f)["rows"]
        for r in rows:
            if r.get("impl", "fused") != "fused":
                continue
            cell = table[row_key(r)].setdefault(tag, {"ms": [], "sustained": [], "verified": True})
            cell["ms"].append(float(r["median_ms"]))
            if (r.get("sustained") or {}).get("ms_per_call") is not None:
                cell["sustained"].append(float(r["sustained"]["ms_per_call"]))
            cell["verified"] = cell["verified"] and r.get("verified") is True
    return table, tags


def summarise(table, tags, base, field="ms"):
    """Lines of the summary of `field` ("ms": the synchronised medians; "sustained": the sustained ms a
    call); each cell 'us [lo-hi]' and, beside the base, the ratio new / base."""
    order = [base] + sorted(t for t in tags if t != base)
    lines = [("" if field == "ms" else "sustained: ") + "config T/rank ranks dtype | " + " | ".join(
        t if t == base else f"{t} (x {base})" for t in order)]
    for key in sorted(table):
        cells = []
        ref = table[key].get(base)
        ref_us = statistics.median(ref[field]) * 1e3 if ref and ref[field] else None
        for t in order:
            c = table[key].get(t)
            if not c or not c[field]:
                cells.append("-")
                continue
            us = statistics.median(c[field]) * 1e3
            s = f"{us:.1f} [{min(c[field]) * 1e3:.1f}-{max(c[field]) * 1e3:.1f}]"
            if t != base and ref_us:
                s += f" {us / ref_us:.3f}"
            if not c["verified"]:
                s += " UNVERIFIED"
            cells.append(s)
        lines.append(f"{key[0]} {key[1]} {key[2]} {key[3]} | " + " | ".join(cells))
    return lines


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", default=None)
    ap.add_argument("files", nargs="+")
    a = ap.parse_args(argv)
    table, tags = collect(a.files)
    base = a.base or ("main" if "main" in tags else sorted(tags)[0])
    if base not in tags:
        print(f"ab_summary: no file of the base binary '{base}'", file=sys.stderr)
        return 2
    print("\n".join(summarise(table, tags, base)))
    if any(c["sustained"] for cells in table.values() for c in cells.values()):
        print("\n".join(summarise(table, tags, base, "sustained")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
