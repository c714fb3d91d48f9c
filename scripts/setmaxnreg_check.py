#!/usr/bin/env python3
"""Checks a warp-specialised kernel's SASS against its setmaxnreg budgets.

For each function whose name contains SUBSTR (default fused_moe_kernel), the code is split at its
USETMAXREG instructions: before the first (the launch's budget, cuobjdump -res-usage REG), and from
each USETMAXREG to the first EXIT after it (that role's budget: the instruction's operand). Prints the
highest register each region names and whether code in a role's region branches or calls outside it
(code reached that way runs under that role's budget too). A register at or above a budget would
fault at run time. Finds cuobjdump as spill_report.py does.
Usage: setmaxnreg_check.py BINARY [SUBSTR]
"""
import os
import re
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from spill_report import tool  # noqa: E402  (cuobjdump: $CUOBJDUMP, PATH, the toolkit, Triton's copy)


def functions(binary, substr):
    sass = subprocess.run([tool("cuobjdump"), "-sass", binary], capture_output=True, text=True, check=True).stdout
    res = subprocess.run([tool("cuobjdump"), "-res-usage", binary], capture_output=True, text=True, check=True).stdout
    regs = {}
    name = None
    for line in res.splitlines():
        m = re.search(r"Function (\S+):", line)
        if m:
            name = m.group(1)
        m = re.search(r"REG:(\d+)", line)
        if m and name:
            regs[name] = int(m.group(1))
    name, ins = None, []
    for line in sass.splitlines() + ["Function : <end>"]:
        m = re.search(r"Function : (\S+)", line)
        if m:
            if name and substr in name:
                yield name, ins, regs.get(name)
            name, ins = m.group(1), []
            continue
        m = re.match(r"\s*/\*([0-9a-f]{4,})\*/\s*(.*?)\s*;", line)
        if m:
            ins.append((int(m.group(1), 16), m.group(2)))


def max_reg(ins, lo, hi):
    best = (-1, None)
    for a, t in ins:
        if lo <= a < hi:
            for r in re.findall(r"\bR(\d+)\b", t):
                if int(r) > best[0]:
                    best = (int(r), f"{a:#x} {t}")
    return best


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    binary, substr = sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else "fused_moe_kernel"
    bad = 0
    for name, ins, launch_regs in functions(binary, substr):
        print(name)
        marks = [(a, int(re.search(r"0x([0-9a-f]+)\s*$", t).group(1), 16)) for a, t in ins if "SETMAXREG" in t]
        if not marks:
            print("  no setmaxnreg")
            continue
        regions = [(0, marks[0][0], launch_regs, "launch")]
        for a, budget in marks:
            end = next((b for b, t in ins if b > a and t.strip() == "EXIT"), ins[-1][0])
            regions.append((a, end + 16, budget, f"setmaxnreg at {a:#x}"))
        for lo, hi, budget, what in regions:
            top, where = max_reg(ins, lo, hi)
            over = budget is not None and top >= budget
            bad += over
            print(f"  {what:28s} [{lo:#x}, {hi:#x}): budget {budget}, highest R{top}{'  OVER' if over else ''}  ({where})")
            if what == "launch":
                continue
            # Out-of-line code the role reaches (divergence handlers, called subroutines): scanned from
            # the target to its RET or its first unconditional branch.
            seen = set()
            for a, t in ins:
                m = re.search(r"\b(BRA\S*|CALL\.REL\S*|JMP)\b.*?0x([0-9a-f]+)\s*$", t)
                if not (lo <= a < hi and m) or lo <= int(m.group(2), 16) < hi or int(m.group(2), 16) in seen:
                    continue
                target = int(m.group(2), 16)
                seen.add(target)
                end = next((b for b, u in ins if b >= target and (u.startswith("RET") or re.fullmatch(r"BRA \S+", u.strip()))),
                           ins[-1][0])
                top_out, where_out = max_reg(ins, target, end + 16)
                over_out = budget is not None and top_out >= budget
                bad += over_out
                print(f"    reaches [{target:#x}, {end:#x}] from {a:#x}: highest R{top_out}{'  OVER' if over_out else ''}")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
