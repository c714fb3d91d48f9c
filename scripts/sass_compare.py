#!/usr/bin/env python3
"""Compares the fused kernels' SASS of two `epfuse` binaries (cuobjdump -sass output files).

Usage: sass_compare.py NEW.sass BASE.sass
Pairs the fused_moe_kernel instantiations of NEW and BASE by their template arguments (tile GEMM and
transport; a BASE older than the transport argument pairs with NEW's LsaTransport kernels) and prints
for each pair:
  - the instruction counts and whether every opcode occurs as often in both;
  - the GEMM loops: every stretch of instructions around the MMAs (HGMMA / HMMA / QGMMA, with up to
    `GAP` other instructions between two of them), compared instruction by instruction with branch
    targets and addresses stripped: "identical" or the first differences;
  - how many instructions differ anywhere (register choices and order outside the loops).
Exit code 0 when every BASE kernel has a NEW counterpart whose GEMM loops are identical.
"""
import collections
import re
import sys

GAP = 48  # instructions between two MMAs that still belong to one loop body


def kernels(path):
    out, name, body = {}, None, []
    for line in open(path, encoding="utf-8", errors="replace"):
        m = re.search(r"Function : (\S+)", line)
        if m:
            if name:
                out[name] = body
            name, body = m.group(1), []
            continue
        m = re.search(r"/\*[0-9a-f]{4,}\*/\s+(.*?)\s*;", line)
        if name and m:
            body.append(m.group(1))
    if name:
        out[name] = body
    return {n: b for n, b in out.items() if "fused_moe_kernel" in n}


def key(name):
    # The mangled template arguments; the anonymous namespace's hash differs between builds.
    return name.split("fused_moe_kernel", 1)[1]


def transport(name):
    return "Loopback" if "LoopbackTransport" in name else "Lsa"


def gemm_key(name):
    return re.sub(r"NS3_(12LsaTransport|17LoopbackTransport)E", "", key(name))


def normalise(ins):
    # Branch targets and other code addresses move with any change before them.
    return re.sub(r"0x[0-9a-f]{3,}", "ADDR", ins)


def mma_regions(body):
    idx = [i for i, ins in enumerate(body) if re.match(r"(@!?U?P\w+ )?(HGMMA|HMMA|QGMMA)", ins)]
    regions, start, last = [], None, None
    for i in idx:
        if start is None:
            start = last = i
        elif i - last > GAP:
            regions.append((start, last + 1))
            start = last = i
        else:
            last = i
    if start is not None:
        regions.append((start, last + 1))
    return [[normalise(ins) for ins in body[a:b]] for a, b in regions]


def opcode(ins):
    return re.sub(r"^@!?U?P\w+ ", "", ins).split()[0]


def main():
    new, base = kernels(sys.argv[1]), kernels(sys.argv[2])
    base_has_transport = any("Transport" in n for n in base)
    ok = bool(base)
    for name, body in sorted(base.items(), key=lambda kv: key(kv[0])):
        if base_has_transport:
            match = [n for n in new if key(n) == key(name)]
        else:
            match = [n for n in new if transport(n) == "Lsa" and gemm_key(n) == gemm_key(name)]
        label = f"{gemm_key(name)[:60]} [{transport(name) if base_has_transport else 'Lsa'}]"
        if not match:
            print(f"MISSING in new: {label}")
            ok = False
            continue
        other = new[match[0]]
        same_ops = collections.Counter(map(opcode, body)) == collections.Counter(map(opcode, other))
        differ = sum(1 for a, b in zip(body, other) if normalise(a) != normalise(b)) + abs(len(body) - len(other))
        rb, rn = mma_regions(body), mma_regions(other)
        loops_same = rb == rn
        ok = ok and loops_same
        print(f"{label}: {len(body)} instructions base, {len(other)} new; opcode counts "
              f"{'equal' if same_ops else 'DIFFER'}; GEMM loops ({len(rb)} base, {len(rn)} new, "
              f"{sum(map(len, rb))} instructions) {'identical' if loops_same else 'DIFFERENT'}; "
              f"{differ} instructions differ elsewhere (registers, order)")
        if not loops_same:
            for r, (a_reg, b_reg) in enumerate(zip(rb, rn)):
                diffs = [(a, b) for a, b in zip(a_reg, b_reg) if a != b]
                for a, b in diffs[:3]:
                    print(f"    loop {r}: base '{a}' / new '{b}'")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
