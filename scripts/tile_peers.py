#!/usr/bin/env python3
"""Our FP8 tile alone beside DeepGEMM's grouped GEMM on the same shapes: the shapes from the tile's own
benchmark, DeepGEMM's time for each, one table.

Usage:
  tile_peers.py shapes TILE_LOG            one "NAME|E|R|N|K" line a shape of the tile's benchmark log
                                           (tests/gpu/gemm/bench_fp8_tile_shapes: its "bench" lines, not
                                           the k-loop-only ones), for the DeepGEMM runs
  tile_peers.py table TILE_LOG DG_LOG      a row a shape: ours, DeepGEMM's (bench/peers/deepgemm_tile_shape.py
                                           lines), ours / DeepGEMM; a shape DeepGEMM did not run says so
scripts/remote-run.sh's tile-peers step runs both benchmarks and this; the shapes live in the tile's
benchmark alone (docs/performance.md#cutlasss-blockwise-fp8-grouped-gemm-beside-ours-and-deepgemms-2026-11-30
has a table made this way).
"""
import re
import sys

OURS = re.compile(r"^ok\s+bench (?P<name>.+?)(?P<kloop>, k-loop only)? \((?P<e>\d+) x (?P<r>\d+) rows, N (?P<n>\d+), "
                  r"K (?P<k>\d+)\): (?P<ms>[\d.]+) ms")
DEEPGEMM = re.compile(r"^deepgemm-fp8 tile shape: (?P<e>\d+) experts x (?P<r>\d+) rows, N=(?P<n>\d+) K=(?P<k>\d+): "
                      r"(?P<ms>[\d.]+) ms")


def shape(m):
    return tuple(int(m.group(g)) for g in ("e", "r", "n", "k"))


def our_rows(lines):
    """[(name, (E, R, N, K), ms)] of the tile's whole-tile bench lines, in order."""
    out = []
    for line in lines:
        m = OURS.match(line.strip())
        if m and not m.group("kloop"):
            out.append((m.group("name"), shape(m), float(m.group("ms"))))
    return out


def deepgemm_times(lines):
    """{(E, R, N, K): ms} of DeepGEMM's lines (the last one a shape)."""
    return {shape(m): float(m.group("ms")) for m in (DEEPGEMM.match(l.strip()) for l in lines) if m}


def table(ours, dg):
    rows = ["shape | ours ms | DeepGEMM ms | ours / DeepGEMM"]
    for name, s, ms in ours:
        d = dg.get(s)
        rows.append(f"{name} ({s[0]} x {s[1]}, N {s[2]}, K {s[3]}) | {ms:.4f} | "
                    + (f"{d:.4f} | {ms / d:.3f}" if d else "- | DeepGEMM did not run"))
    return rows


def main(argv):
    if len(argv) == 2 and argv[0] == "shapes":
        with open(argv[1]) as f:
            for name, s, _ in our_rows(f):
                print(f"{name}|{s[0]}|{s[1]}|{s[2]}|{s[3]}")
        return 0
    if len(argv) == 3 and argv[0] == "table":
        with open(argv[1]) as f, open(argv[2]) as g:
            ours, dg = our_rows(f), deepgemm_times(g)
        if not ours:
            print(f"tile_peers: no bench lines in {argv[1]}", file=sys.stderr)
            return 1
        print("\n".join(table(ours, dg)))
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
