#!/usr/bin/env python3
"""Summarises the fused kernel's task timeline (a build with -DEPFUSE_TRACE=ON, run with
EPFUSE_TRACE_FILE=F; src/device/diagnostics/trace.cuh): per problem, when each phase ran, and where a GEMM tile's
time goes (waiting for its inputs, for its first stage, the k-loop, the epilogue), and the per-SM budget of
the GEMM phases (budget: the k-loop, epilogues, first-stage waits and gaps summed over the CTAs, and the
k-loop's pace for full and last m-blocks).

usage: trace_report.py TRACE.csv [--tiles] [--sm N]
(`epfuse bench --trace FILE` keeps the CSV beside FILE, as FILE.csv.)
  --tiles  one line per GEMM tile as well
  --sm N   the task sequence of the CTA on SM N
"""
import argparse
import collections
import csv
import statistics

PHASES = ["layout", "publish", "dispatch", "collect", "linear1", "linear2", "combine", "done"]
STAMPS = ["taken", "weights", "inputs", "posted", "loaded", "math_start", "first_full", "loop_end", "end", "epi_math",
          "epi_stored", "loop_synced", "epi_swiglu", "plan_seen", "roles_split"]
FIELDS = ["rank", "H", "I", "E", "T", "mma", "launch", "cta", "smid", "rec", "phase", "index", "expert", "mblock",
          "nblock"] + STAMPS


def load(path, spans=None):
    """Task records per problem (rank, shape, launch). spans: a dict that takes each problem's CTA spans
    (rows with rec < 0, tools/bench/trace_export.h: `taken` = the CTA's start, `end` = its end)."""
    problems = collections.OrderedDict()
    cta_spans = {}
    with open(path) as f:
        for row in csv.reader(f):
            if not row:
                continue
            r = dict(zip(FIELDS, (int(v) for v in row)))
            for s in STAMPS:  # traces of builds with fewer stamps
                r.setdefault(s, -1)
            key = (r["rank"], r["H"], r["I"], r["E"], r["T"], r["mma"], r["launch"])
            (cta_spans if r["rec"] < 0 else problems).setdefault(key, []).append(r)
    # Stamps are %globaltimer ns: count them from each problem's first task stamp.
    for key, rows in problems.items():
        t0 = min(r[s] for r in rows for s in STAMPS if r[s] >= 0)
        for r in rows + cta_spans.get(key, []):
            for s in STAMPS:
                if r[s] >= 0:
                    r[s] -= t0
    if spans is not None:
        spans.update(cta_spans)
    return problems


def kernel_edges(rows, spans):
    """The kernel around its tasks, us: first CTA start to last CTA end, how long before the first task
    stamp the CTAs start (their set-up, the first task id), and how long after the last task stamp the
    last CTA ends (TaskScheduler::finish). None without spans."""
    # A span's start is counted from the first task stamp, so it is negative; -1 is "not stamped".
    done = [r for r in spans if r["taken"] != -1 and r["end"] >= 0]
    stamps = [r[s] for r in rows for s in STAMPS if r[s] >= 0]
    if not done or not stamps:
        return None
    start, end = min(r["taken"] for r in done), max(r["end"] for r in done)
    return {"span": us(end - start), "before_first_stamp": us(min(stamps) - start),
            "after_last_stamp": us(end - max(stamps))}


def us(ns):
    return ns / 1000.0


def span(rows, a, b):
    """Per-row durations b - a in us where both stamps exist."""
    return [us(r[b] - r[a]) for r in rows if r[a] >= 0 and r[b] >= 0]


def fmt(values):
    if not values:
        return "-"
    return f"{statistics.median(values):7.2f} {min(values):7.2f} {max(values):7.2f}"


# The start-up chain's own steps: trace.cuh's stamps inside the layout (phase 0), publish (1) and collect
# (3) tasks, as (from, to, label).
CHAIN = {
    "layout": (0, [("math_start", "posted", "slots"), ("posted", "loaded", "tickets"), ("loaded", "loop_end", "bases"),
                   ("loop_end", "end", "rows, done")]),
    "publish": (1, [("math_start", "inputs", "layout done"), ("inputs", "epi_stored", "counts stored"),
                    ("epi_stored", "end", "flags")]),
    "dispatch": (2, [("math_start", "posted", "own rows"), ("posted", "inputs", "layout wait"),
                     ("inputs", "loaded", "rows sent"), ("loaded", "epi_stored", "entries"), ("epi_stored", "end", "arrival adds")]),
    "collect": (3, [("math_start", "inputs", "counts in"), ("inputs", "posted", "status, counts read"),
                    ("posted", "loaded", "m-blocks"), ("loaded", "epi_math", "scans"), ("epi_math", "epi_swiglu", "schedule"),
                    ("epi_swiglu", "loop_end", "targets"), ("loop_end", "epi_stored", "plan out"),
                    ("epi_stored", "end", "release")]),
}


def chain_steps(rows):
    """Per task of the start-up chain, its steps as (label, durations in us); a task whose records lack
    any of its stamps (a trace of an older build) is left out."""
    out = {}
    for name, (phase, parts) in CHAIN.items():
        ph = [r for r in rows if r["phase"] == phase]
        cols = [(label, span(ph, a, b)) for a, b, label in parts]
        if ph and all(v for _, v in cols):
            out[name] = cols
    return out


def plan_to_roles(rows):
    """Each CTA's way from the plan to its first tile (its first role record, which carries plan_seen and
    roles_split), in us per CTA: from the collect task's end to the CTA seeing the plan, to its split into
    roles (the plan copied, the task decoded), to its producer's first record, to that tile's first full
    stage. {} when the trace has no such records."""
    first = [r for r in rows if r["roles_split"] >= 0 and r["plan_seen"] >= 0]
    collect_end = max((r["end"] for r in rows if r["phase"] == 3 and r["end"] >= 0), default=-1)
    if not first or collect_end < 0:
        return {}
    return {"plan out->seen": [us(r["plan_seen"] - collect_end) for r in first],
            "seen->roles split": span(first, "plan_seen", "roles_split"),
            "split->producer": span(first, "roles_split", "taken"),
            "producer->1st stage": span(first, "taken", "first_full")}


def handover(per_cta):
    """Per GEMM phase, the median time of each step of the hand-over from tile a to the next tile b of
    the same phase in one CTA, relative to a's k-loop end, in time order: when the producer issued a's
    last load, took b, had its weights and inputs, posted it; when the math warps ended a and started
    b, and b's first stage was full (docs/performance.md#task-hand-over-between-tiles)."""
    steps = collections.defaultdict(lambda: collections.defaultdict(list))
    for rs in per_cta.values():
        g = sorted((r for r in rs if r["phase"] in (4, 5) and r["math_start"] >= 0), key=lambda r: r["rec"])
        for a, b in zip(g, g[1:]):
            if a["phase"] != b["phase"] or a["loop_end"] < 0:
                continue
            t0 = a["loop_end"]
            for name, r, stamp in (("a.loaded", a, "loaded"), ("a.end", a, "end"), ("b.taken", b, "taken"),
                                   ("b.weights", b, "weights"), ("b.inputs", b, "inputs"), ("b.posted", b, "posted"),
                                   ("b.math_start", b, "math_start"), ("b.first_full", b, "first_full")):
                if r[stamp] >= 0:
                    steps[a["phase"]][name].append(r[stamp] - t0)
    return {p: sorted(((n, statistics.median(v)) for n, v in d.items()), key=lambda x: x[1])
            for p, d in sorted(steps.items())}


# K elements a ring stage holds: the FP8 tile's k-block is one 128-K scale block, the bf16 TMA tile's 64.
BLOCK_K = {2: 64, 3: 128}


def budget(rows, H, I, mma):
    """Where the GEMM phases' time goes, per SM: the sums over a launch's CTAs of each GEMM tile's k-loop
    (first stage full -> last k-block done), epilogue (-> end), wait for its first stage (math start ->
    first full) and the math warps' gaps between consecutive GEMM tiles, each divided by the number of
    CTAs, in us; the k-loop's pace (us a k-block, medians) for tiles of full m-blocks and for each
    expert's last m-block (its padding rows: at most 64 real rows leave one math warpgroup idle); and
    the share of tiles that are an expert's last m-block. Returns the dict it prints
    (docs/performance.md#where-a-prefill-call-goes-at-world-1-2026-11-28-the-trace)."""
    gemm = [r for r in rows if r["phase"] in (4, 5) and min(r["math_start"], r["first_full"], r["loop_end"], r["end"]) >= 0]
    ctas = {r["cta"] for r in rows}
    if not gemm or not ctas:
        return {}
    last = {}
    for r in gemm:
        last[(r["phase"], r["expert"])] = max(last.get((r["phase"], r["expert"]), -1), r["mblock"])
    n = len(ctas)
    out = {"ctas": n}
    for p, name, K in ((4, "linear1", H), (5, "linear2", I)):
        ph = [r for r in gemm if r["phase"] == p]
        if not ph:
            continue
        kb = max(1, -(-K // BLOCK_K.get(mma, 64)))
        tail = [r for r in ph if r["mblock"] == last[(p, r["expert"])]]
        full = [r for r in ph if r["mblock"] != last[(p, r["expert"])]]
        pace = lambda rs: statistics.median(us(r["loop_end"] - r["first_full"]) / kb for r in rs) if rs else float("nan")
        out[name] = {
            "tiles": len(ph), "last_mblock_tiles": len(tail), "k_blocks": kb,
            "kloop": sum(us(r["loop_end"] - r["first_full"]) for r in ph) / n,
            "epilogue": sum(us(r["end"] - r["loop_end"]) for r in ph) / n,
            "first_stage": sum(us(r["first_full"] - r["math_start"]) for r in ph) / n,
            "us_per_kblock_full": pace(full), "us_per_kblock_last": pace(tail)}
    per_cta = collections.defaultdict(list)
    for r in gemm:
        per_cta[r["cta"]].append(r)
    gaps = 0.0
    for rs in per_cta.values():
        rs.sort(key=lambda r: r["math_start"])
        gaps += sum(max(0.0, us(b["math_start"] - a["end"])) for a, b in zip(rs, rs[1:]))
    out["gaps"] = gaps / n
    out["first_start"] = us(min(r["math_start"] for r in gemm))
    out["last_end"] = us(max(r["end"] for r in gemm))
    print(f"per-SM budget of the GEMM phases over {n} CTAs, us: GEMM tiles from {out['first_start']:.1f} to "
          f"{out['last_end']:.1f}; gaps between a CTA's tiles {out['gaps']:.1f}")
    for name in ("linear1", "linear2"):
        if name in out:
            b = out[name]
            print(f"  {name}: {b['tiles']} tiles ({b['last_mblock_tiles']} of an expert's last m-block), "
                  f"k-loop {b['kloop']:.1f}, epilogue {b['epilogue']:.1f}, first stage {b['first_stage']:.1f}; "
                  f"{b['k_blocks']} k-blocks at {b['us_per_kblock_full']:.3f} us each (full m-blocks), "
                  f"{b['us_per_kblock_last']:.3f} (last m-blocks)")
    return out


def critical_chain(rows):
    """The chain of tasks behind the launch's last end, latest first, as (row, the task it waited for, the wait
    in us from that task's end to this one's inputs or, for the combine, its end): the last task to end; for a
    combine, the latest Linear2 tile before it; for a Linear2 tile, the latest Linear1 tile of its expert and
    m-block (its inputs); for a Linear1 tile, the later of the dispatch's and the collect task's ends (its rows
    and the plan). A call's ends are what its fixed cost is made of at small T."""
    done = [r for r in rows if r["end"] >= 0 and r["phase"] < 7]
    if not done:
        return []
    latest = lambda rs: max(rs, key=lambda r: r["end"]) if rs else None
    row, chain = latest(done), []
    while row is not None:
        p = row["phase"]
        if p == 6:
            before = latest([r for r in done if r["phase"] == 5 and r["end"] <= row["end"]])
            ready = row["end"]
        elif p == 5:
            before = latest([r for r in done if r["phase"] == 4 and r["expert"] == row["expert"]
                             and r["mblock"] == row["mblock"]])
            ready = row["inputs"]
        elif p == 4:
            before = latest([r for r in done if r["phase"] in (2, 3)])
            ready = row["inputs"]
        else:
            before, ready = None, -1
        wait = us(ready - before["end"]) if before is not None and ready >= 0 else None
        chain.append((row, before, wait))
        row = before
    return chain


def print_chain(chain):
    if not chain:
        return
    print("the chain behind the last end, latest first, us from the launch's first stamp:")
    for row, before, wait in chain:
        name = PHASES[row["phase"]]
        what = f"e{row['expert']} m{row['mblock']} n{row['nblock']}" if row["phase"] in (4, 5) else f"#{row['index']}"
        st = ", ".join(f"{s} {us(row[s]):.1f}" for s in ("taken", "weights", "inputs", "math_start", "first_full",
                                                       "loop_end", "end") if row[s] >= 0)
        tail = ""
        if before is not None and wait is not None:
            ref = "end" if row["phase"] == 6 else "inputs"
            tail = f" ({ref} {wait:.1f} after {PHASES[before['phase']]}'s end)"
        print(f"  {name:8s} {what:14s} cta {row['cta']:3d}: {st}{tail}")


def report(key, rows, tiles, sm, spans=()):
    rank, H, I, E, T, mma, launch = key
    end = max(r[s] for r in rows for s in STAMPS if r[s] >= 0)
    kernel = {0: "mma.sync", 1: "wgmma", 2: "bf16 TMA", 3: "FP8 TMA"}.get(mma, str(mma))
    print(f"== rank {rank} H={H} I={I} E={E} T={T} {kernel} launch {launch}: {len(rows)} task records, "
          f"last stamp at {us(end):.1f} us")
    edges = kernel_edges(rows, spans)
    if edges:
        print(f"kernel: {edges['span']:.1f} us from the first CTA's start to the last CTA's end; the CTAs start "
              f"{edges['before_first_stamp']:.1f} us before the first task stamp, the last ends "
              f"{edges['after_last_stamp']:.1f} us after the last")
    print(f"{'phase':10s} {'tasks':>5s} {'first start':>11s} {'last end':>9s}")
    for p, name in enumerate(PHASES):
        ph = [r for r in rows if r["phase"] == p]
        if not ph:
            continue
        starts = [r["math_start"] if r["math_start"] >= 0 else r["taken"] for r in ph]
        ends = [r["end"] for r in ph if r["end"] >= 0]
        print(f"{name:10s} {len(ph):5d} {us(min(starts)):11.1f} {us(max(ends)) if ends else -1:9.1f}")
    print("tasks before the GEMM phase, us (median min max):")
    print(f"{'phase':8s} {'start->inputs':>23s} {'inputs->written':>23s} {'written->end':>23s} {'whole':>23s}")
    for p in (2, 3):  # dispatch: inputs = layout done, written = rows and entries; collect: inputs = counts in
        ph = [r for r in rows if r["phase"] == p]
        if ph:
            cols = [span(ph, "math_start", "inputs"), span(ph, "inputs", "epi_stored"), span(ph, "epi_stored", "end"),
                    span(ph, "math_start", "end")]
            print(f"{PHASES[p]:8s} " + " ".join(f"{fmt(c):>23s}" for c in cols))
    for name, parts in chain_steps(rows).items():
        print(f"{name} steps, us (median over its tasks): " +
              ", ".join(f"{label} {statistics.median(v):.2f}" for label, v in parts))
    steps = plan_to_roles(rows)
    if steps:
        print("from the plan to each CTA's first tile, us (median min max over CTAs):")
        print(f"{'':8s} " + " ".join(f"{name:>23s}" for name in steps))
        print(f"{'':8s} " + " ".join(f"{fmt(v):>23s}" for v in steps.values()))
    print("GEMM tiles, us (median min max):")
    print(f"{'phase':8s} {'weights->inputs':>23s} {'inputs->posted':>23s} {'posted->math':>23s} "
          f"{'math->1st stage':>23s} {'k-loop':>23s} {'epilogue':>23s} {'whole (math)':>23s} {'epi: values':>23s} "
          f"{'epi: stores issued':>23s} {'epi: release+signal':>23s}")
    for p in (4, 5):
        ph = [r for r in rows if r["phase"] == p]
        if not ph:
            continue
        cols = [span(ph, "weights", "inputs"), span(ph, "inputs", "posted"), span(ph, "posted", "math_start"),
                span(ph, "math_start", "first_full"), span(ph, "first_full", "loop_end"), span(ph, "loop_end", "end"),
                span(ph, "math_start", "end"), span(ph, "loop_end", "epi_math"), span(ph, "loop_end", "epi_stored"),
                span(ph, "epi_stored", "end")]
        print(f"{PHASES[p]:8s} " + " ".join(f"{fmt(c):>23s}" for c in cols))
    print("GEMM epilogue steps, us (median min max):")
    print(f"{'phase':8s} {'k-loop end->synced':>23s} {'synced->swiglu':>23s} {'swiglu->values':>23s}")
    for p in (4, 5):
        ph = [r for r in rows if r["phase"] == p]
        if ph:
            cols = [span(ph, "loop_end", "loop_synced"), span(ph, "loop_synced", "epi_swiglu"),
                    span(ph, "epi_swiglu", "epi_math")]
            print(f"{PHASES[p]:8s} " + " ".join(f"{fmt(c):>23s}" for c in cols))
    # Busy time of the math warps per SM: from the first GEMM task's start to the last one's end.
    per_cta = collections.defaultdict(list)
    for r in rows:
        per_cta[r["cta"]].append(r)
    idle = []
    for cta, rs in per_cta.items():
        g = sorted((r for r in rs if r["phase"] in (4, 5, 6) and r["math_start"] >= 0 and r["end"] >= 0),
                   key=lambda r: r["math_start"])
        for a, b in zip(g, g[1:]):
            idle.append(us(b["math_start"] - a["end"]))
    if idle:
        print(f"math gaps between consecutive tasks of a CTA, us: median {statistics.median(idle):.2f}, "
              f"sum over CTAs {sum(idle):.1f}, max {max(idle):.2f}")
    budget(rows, H, I, mma)
    print_chain(critical_chain(rows))
    chain = handover(per_cta)
    if chain:
        print("hand-over between consecutive tiles of one phase in a CTA, us from tile a's k-loop end (medians):")
        for p, steps in chain.items():
            print(f"{PHASES[p]:8s} " + "  ".join(f"{name}={us(t):.2f}" for name, t in steps))
    if tiles:
        for r in sorted((r for r in rows if r["phase"] in (4, 5)), key=lambda r: r["math_start"]):
            st = " ".join(f"{us(r[s]):7.1f}" if r[s] >= 0 else "      -" for s in STAMPS)
            print(f"  {PHASES[r['phase']]:8s} e{r['expert']:<3d} m{r['mblock']:<3d} n{r['nblock']:<3d} "
                  f"cta {r['cta']:3d} sm {r['smid']:3d}  {st}")
    if sm is not None:
        for r in sorted((r for r in rows if r["smid"] == sm), key=lambda r: r["rec"]):
            st = " ".join(f"{us(r[s]):7.1f}" if r[s] >= 0 else "      -" for s in STAMPS)
            print(f"  rec {r['rec']:2d} {PHASES[r['phase']]:8s} idx {r['index']:4d} e{r['expert']} n{r['nblock']}  {st}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("trace")
    ap.add_argument("--tiles", action="store_true")
    ap.add_argument("--sm", type=int)
    a = ap.parse_args()
    print("stamps: " + ", ".join(STAMPS))
    spans = {}
    for key, rows in load(a.trace, spans).items():
        report(key, rows, a.tiles, a.sm, spans.get(key, []))


if __name__ == "__main__":
    main()
