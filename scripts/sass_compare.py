#!/usr/bin/env python3
"""Compares the fused kernels' SASS of two `epfuse` binaries (cuobjdump -sass output files).

Usage: sass_compare.py NEW.sass BASE.sass
Pairs each fused_moe_kernel of BASE with the LsaTransport instantiation of the same tile GEMM in NEW
(the only template argument added since is the transport) and prints, per kernel, the instruction
counts and whether the instruction streams are identical (addresses and encodings stripped).
Exit code 0 when every BASE kernel has an identical NEW counterpart.
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
    # The mangled tile GEMM argument; the new transport argument (LsaTransport) is dropped.
    return re.sub(r"N6epfuse6device(12LsaTransport|17LoopbackTransport)E", "", name)


def main():
    new, base = kernels(sys.argv[1]), kernels(sys.argv[2])
    new_lsa = {key(n): b for n, b in new.items() if "LoopbackTransport" not in n}
    ok = bool(base)
    for name, body in sorted(base.items()):
        other = new_lsa.get(key(name))
        same = other == body
        ok = ok and same
        print(f"{'same' if same else 'DIFFERENT'}: {len(body)} instructions base, "
              f"{len(other) if other is not None else 'missing'} new: {name[:90]}")
        if other is not None and not same:
            for i, (a, b) in enumerate(zip(body, other)):
                if a != b:
                    print(f"  first difference at instruction {i}: base '{a}' / new '{b}'")
                    break
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
