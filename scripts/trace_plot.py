#!/usr/bin/env python3
"""Draws the fused kernel's timeline (the Chrome trace-event JSON of `epfuse bench --trace FILE`,
tools/bench/trace_export.h) as a PNG: one row per CTA track of one rank, time across, each task and its
steps as bars coloured by what they are, the launches and the gaps between them on the top row.

usage: trace_plot.py TRACE.json OUT.png [--rank R] [--launch L] [--title TEXT] [--max-ctas N]
  --launch L  only launch L's window (its "launch L" event), one row per CTA (its roles' tracks folded)
"""
import argparse
import json

# What a bar is, by event name: tasks by phase, then the waits and steps inside them.
COLOURS = {
    "layout": "#8dd3c7", "publish": "#bebada", "dispatch": "#80b1d3", "collect": "#fdb462",
    "linear1": "#b3de69", "linear2": "#fccde5", "combine": "#bc80bd", "done": "#d9d9d9",
    "k-loop": "#33a02c", "epilogue": "#e31a1c", "loads": "#1f78b4",
    "between launches": "#000000",
}
WAIT = "#ffff99"  # every "wait: ..." step


def colour(name):
    if name.startswith("wait"):
        return WAIT
    if name.startswith("kernel") or name.startswith("launch"):
        return "#f0f0f0"
    return COLOURS.get(name, "#999999")


def load(path, rank):
    events = json.load(open(path))["traceEvents"]
    names = {e["tid"]: e["args"]["name"] for e in events
             if e.get("ph") == "M" and e["name"] == "thread_name" and e["pid"] == rank}
    bars = [e for e in events if e.get("ph") == "X" and e["pid"] == rank]
    return names, bars


def in_launch(bars, launch):
    """The bars inside launch `launch`'s window, shifted to start at 0, and that window's length."""
    win = [e for e in bars if e["tid"] == -1 and e["name"] == f"launch {launch}"]
    if not win:
        raise SystemExit(f"trace_plot: no launch {launch}")
    t0, t1 = win[0]["ts"], win[0]["ts"] + win[0]["dur"]
    keep = [dict(e, ts=e["ts"] - t0) for e in bars if e["tid"] != -1 and t0 - 0.01 <= e["ts"] <= t1]
    return keep, t1 - t0


def rectangles(bars, row):
    """The bars on a row of `row` (tid -> row) as rectangles: their corners, colours and the legend's
    (name -> colour). Tasks first, longest first, their steps drawn over them, thinner."""
    verts, faces, seen = [], [], {}
    for e in sorted(bars, key=lambda e: (e["dur"] < 0, -e["dur"])):
        if e["tid"] not in row:
            continue
        step = e["name"] not in COLOURS or e["name"] in ("k-loop", "epilogue", "loads") or e["name"].startswith("wait")
        height = 0.45 if step else 0.85
        c = colour(e["name"])
        x0 = e["ts"]
        x1 = x0 + max(e["dur"], 0.05)
        y0 = row[e["tid"]] - height / 2
        y1 = y0 + height
        verts.append(((x0, y0), (x0, y1), (x1, y1), (x1, y0)))
        faces.append(c)
        key = "wait" if e["name"].startswith("wait") else e["name"]
        if not (e["name"].startswith("kernel") or e["name"].startswith("launch")):
            seen.setdefault(key, c)
    return verts, faces, seen


def plot(path, out, rank=0, title=None, max_ctas=None, launch=None):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.collections import PolyCollection
    from matplotlib.patches import Patch

    names, bars = load(path, rank)
    if not bars:
        raise SystemExit(f"trace_plot: no events of rank {rank} in {path}")
    tids = sorted(names)
    if max_ctas is not None:
        tids = [t for t in tids if t < 0 or t < 3 * max_ctas]
    row = {t: i for i, t in enumerate(tids)}
    if launch is not None:  # one launch, a row per CTA (tids 3c, 3c + 1, 3c + 2)
        bars, _ = in_launch(bars, launch)
        ctas = sorted({t // 3 for t in tids if t >= 0})
        row = {t: ctas.index(t // 3) for t in tids if t >= 0}
        names = {3 * c: f"CTA {c}" for c in ctas}
        tids = [3 * c for c in ctas]
    fig, ax = plt.subplots(figsize=(14, max(3.0, 0.16 * len(tids) + 1.5)))
    ax.set_ylim(-1, len(tids))
    verts, faces, seen = rectangles(bars, row)
    # One collection for every bar, in rectangles' order: a call per bar (broken_barh) rescales the axes
    # over all the bars drawn before it, minutes on a trace of 70,000 bars.
    if verts:
        ax.add_collection(PolyCollection(verts, facecolors=faces, edgecolors="none"))
    ax.set_yticks(range(len(tids)))
    ax.set_yticklabels([names[t] for t in tids], fontsize=5)
    ax.invert_yaxis()
    ax.set_xlabel("us from the first stamp" if launch is None else f"us from launch {launch}'s first CTA")
    ax.set_title(title or f"rank {rank}: the fused kernel's tasks per CTA")
    # The legend in a strip of fixed height at the figure's foot: placed in axes units it fell off the page of
    # a whole trace's figure (tens of inches tall).
    foot = 0.45 / fig.get_size_inches()[1]
    fig.legend(handles=[Patch(color=c, label=n) for n, c in seen.items()], fontsize=7, ncol=8, loc="lower center",
               bbox_to_anchor=(0.5, 0.0), frameon=False)
    fig.tight_layout(rect=(0, foot, 1, 1))
    fig.savefig(out, dpi=130)
    return len(bars)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("trace")
    ap.add_argument("out")
    ap.add_argument("--rank", type=int, default=0)
    ap.add_argument("--title")
    ap.add_argument("--max-ctas", type=int)
    ap.add_argument("--launch", type=int)
    a = ap.parse_args()
    n = plot(a.trace, a.out, a.rank, a.title, a.max_ctas, a.launch)
    print(f"trace_plot: {n} bars of rank {a.rank} in {a.out}")


if __name__ == "__main__":
    main()
