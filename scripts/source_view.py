#!/usr/bin/env python3
"""Where the warps of one fused-kernel launch wait, by role and phase, from ncu's source page.

Input: the SASS view that `scripts/remote-run.sh source-view` exports (`ncu -i REPORT --page source --csv
--print-source sass`, gzip or plain) and the binary that ran (its fused kernels' cubin). Each SASS
instruction's warp-state samples are mapped to the source chain it was inlined from (`nvdisasm -gi` of
the same cubin; ncu's CUDA view of a kernel this inlined carries no per-line metrics) and summed by region:
the role (producer warps or math warps, by the frame in fused_kernel.cu's producer_role / math_role) and
what it runs (MMAs, the rest of the k-loop, epilogues, loads, the scheduler), or the phase (layout,
dispatch, combine). Needs cuobjdump and nvdisasm on PATH.

  python3 scripts/source_view.py --csv sv-qwen3-sass.csv.gz --binary build/tools/epfuse \
      [--kernel TileGemmTmaFp8ILi4EEENS3_14LocalTransport] [--lines REGION ...]
"""
import argparse
import collections
import csv
import gzip
import os
import re
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def function_lines(path, name):
    """First and last line of the function `name` defined in path (its body ends at the first '}' in column 0)."""
    lines = open(path).read().split("\n")
    start = next(i for i, l in enumerate(lines) if re.search(r"\b%s\(" % name, l) and "__device__" in lines[i - 1] + l)
    end = next(i for i in range(start, len(lines)) if lines[i].startswith("}"))
    return start + 1, end + 1


def disassemble(binary, kernel):
    """[(offset, opcode, [(file, line) innermost first])] of the kernel whose symbol contains `kernel`."""
    binary = os.path.abspath(binary)
    with tempfile.TemporaryDirectory() as tmp:
        listing = subprocess.run(["cuobjdump", "-lelf", binary], capture_output=True, text=True, check=True).stdout
        cubin = next(m.group(1) for m in re.finditer(r"ELF file\s+\d+: (\S+)", listing) if "fused_kernel" in m.group(1))
        subprocess.run(["cuobjdump", "-xelf", cubin, binary], cwd=tmp, capture_output=True, check=True)
        sass = subprocess.run(["nvdisasm", "-gi", os.path.join(tmp, cubin)], capture_output=True, text=True, check=True).stdout
    lines = sass.split("\n")
    start = next(i for i, l in enumerate(lines) if l.startswith(".text.") and kernel in l)
    out, group, chain = [], [], []
    for l in lines[start + 1:]:
        if l.lstrip().startswith(".section"):
            break
        m = re.match(r'\s*//## File "([^"]+)", line (\d+)', l)
        if m:
            f = os.path.normpath(m.group(1))
            group.append((f.split("/src/", 1)[-1] if "/src/" in f else os.path.basename(f), int(m.group(2))))
            continue
        m = re.match(r"\s*/\*([0-9a-f]{4,})\*/\s+(\S+)", l)
        if m:
            if group:
                chain, group = group, []
            out.append((int(m.group(1), 16), m.group(2), chain))
    return out


def region(chain, producer, math):
    files = [f for f, _ in chain]
    for phase in ("dispatch.cuh", "combine.cuh", "layout.cuh"):
        if any(f.endswith(phase) for f in files):
            return phase.split(".")[0]
    kernel = [l for f, l in chain if f.endswith("fused_kernel.cu")]
    inner = kernel[0] if kernel else -1
    has = lambda *names: any(f.endswith(names) for f in files)
    if math[0] <= inner <= math[1]:
        if has("epilogue.cuh", "fragment_store.cuh", "fp8_quantize.cuh"):
            return "math: epilogue"
        if has("gemm_fp8.cuh", "wgmma.cuh"):
            return "math: MMAs, their waits, promotions"
        if has("gemm_mainloop_tma_fp8.cuh", "gemm_mainloop_tma.cuh", "mbarrier_ring.cuh"):
            return "math: rest of the k-loop"
        return "math: task hand-over, signals"
    if producer[0] <= inner <= producer[1]:
        if has("task_map.h", "scheduler.cuh"):
            return "producer: scheduler, task slots"
        if has("gemm_mainloop_tma_fp8.cuh", "gemm_mainloop_tma.cuh", "mbarrier_ring.cuh"):
            return "producer: loads"
        return "producer: inputs, row tables"
    return "CTA: before the roles"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--csv", required=True)
    ap.add_argument("--binary", required=True)
    ap.add_argument("--kernel", default="TileGemmTmaFp8ILi4EEENS3_14LocalTransport")
    ap.add_argument("--lines", nargs="*", default=[], help="regions whose 20 hottest instructions to list")
    a = ap.parse_args()
    kernel_cu = os.path.join(REPO, "src/fused/fused_kernel.cu")
    producer, math = function_lines(kernel_cu, "producer_role"), function_lines(kernel_cu, "math_role")
    code = {off: (op, chain) for off, op, chain in disassemble(a.binary, a.kernel)}
    opener = gzip.open if a.csv.endswith(".gz") else open
    rows = list(csv.reader(opener(a.csv, "rt")))
    header = next(i for i, r in enumerate(rows) if r and r[0] == "Address")
    col = {h: i for i, h in enumerate(rows[header])}
    data = rows[header + 1:]
    stalls = [h for h in rows[header] if h.startswith("stall_") and "Not Issued" not in h]
    base = int(data[0][0], 16)
    total, unmatched = 0, 0
    share, why, hot = collections.Counter(), collections.defaultdict(collections.Counter), collections.defaultdict(collections.Counter)
    for r in data:
        samples = int(r[col["Warp Stall Sampling (All Samples)"]] or 0)
        total += samples
        op_chain = code.get(int(r[0], 16) - base)
        if op_chain is None or op_chain[0].split(".")[0] not in r[1]:
            unmatched += samples
            continue
        op, chain = op_chain
        g = region(chain, producer, math)
        share[g] += samples
        for h in stalls:
            why[g][h[len("stall_"):]] += int(r[col[h]] or 0)
        if chain:
            hot[g][f"{chain[0][0]}:{chain[0][1]} {op}"] += samples
    if total == 0:
        sys.exit("no samples in " + a.csv)
    print(f"{total} samples; {unmatched / total:.2%} on instructions not matched to the binary")
    for g, s in share.most_common():
        reasons = ", ".join(f"{k} {v / max(1, sum(why[g].values())):.0%}" for k, v in why[g].most_common(3))
        print(f"{s / total:7.2%}  {g:38s} {reasons}")
    for g in a.lines:
        print(f"--- {g}")
        for line, s in hot[g].most_common(20):
            print(f"  {s / total:7.3%}  {line}")


if __name__ == "__main__":
    main()
