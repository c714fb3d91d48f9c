#!/usr/bin/env python3
"""Compares the fused kernels' SASS of two `epfuse` binaries (cuobjdump -sass output files).

Usage: sass_compare.py NEW.sass BASE.sass
Pairs each fused_moe_kernel of BASE with the LsaTransport instantiation of the same tile GEMM in NEW
(the only template argument added since is the transport) and prints, per kernel, the instruction
counts and whether the instruction streams are identical (addresses and encodings stripped), or equal
but for immediate operands (static shared-memory offsets move when the compiler orders the kernel's
__shared__ variables differently). Exit code 0 when every BASE kernel has such a NEW counterpart.
"""
import re
import sys


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
    # The mangled template arguments (the anonymous namespace's hash differs between builds), without
    # the transport argument the LSA kernel gained.
    args = name.split("fused_moe_kernel", 1)[1]
    return re.sub(r"NS3_(12LsaTransport|17LoopbackTransport)E", "", args)


def main():
    new, base = kernels(sys.argv[1]), kernels(sys.argv[2])
    new_lsa = {key(n): b for n, b in new.items() if "LoopbackTransport" not in n}
    ok = bool(base)
    for name, body in sorted(base.items()):
        other = new_lsa.get(key(name))
        if other is None:
            print(f"MISSING in new: {key(name)}")
            ok = False
            continue
        diffs = [(a, b) for a, b in zip(body, other) if a != b]
        # Instructions equal but for immediates (e.g. where the linker put static __shared__ words).
        def shape(ins):
            return re.sub(r"0x[0-9a-f]+", "IMM", ins)
        operand_only = len(body) == len(other) and all(shape(a) == shape(b) for a, b in diffs)
        verdict = "same" if not diffs and len(body) == len(other) else (
            "same but immediates" if operand_only else "DIFFERENT")
        ok = ok and operand_only
        print(f"{verdict}: {len(body)} instructions base, {len(other)} new, {len(diffs)} differ: {key(name)[:70]}")
        for a, b in diffs[:4]:
            print(f"    base '{a}' / new '{b}'")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
