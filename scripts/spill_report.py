#!/usr/bin/env python3
"""Spill instructions (LDL / STL) of the fused kernels, per source line, from a binary built with -lineinfo.

Usage: spill_report.py BINARY [KERNEL_SUBSTRING] [--base BASE_BINARY]
  KERNEL_SUBSTRING picks the fused_moe_kernel instantiations to count (default TileGemmTmaFp8, the FP8
  kernel; its LsaTransport instantiation is reported). Prints the total, then one line per innermost
  source location (file, line) with its count; with --base, the same for BASE side by side.
Why: ptxas allocates the registers of the whole persistent kernel at once, so a change in one task (for
example the collect task, before the GEMM phase) can move spills into the math warps' epilogue loops,
and the FP8 expert phase ran 4-7% slower for it (docs/performance.md#register-allocation-and-spills). Check this before timing.
Needs cuobjdump and nvdisasm: $CUOBJDUMP / $NVDISASM, else PATH, else the CUDA toolkit's bin, else the
copies inside the triton wheel (where this machine's toolkit lacks them).
"""
import collections
import glob
import os
import re
import shutil
import subprocess
import sys
import tempfile


def tool(name):
    env = os.environ.get(name.upper())
    if env:
        return env
    for candidate in (shutil.which(name), f"/usr/local/cuda/bin/{name}"):
        if candidate and os.path.exists(candidate):
            return candidate
    try:
        import triton  # noqa: F401  (only for its bundled CUDA binaries)

        path = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", name)
        if os.path.exists(path):
            return path
    except ImportError:
        pass
    sys.exit(f"spill_report.py: no {name} (set ${name.upper()})")


def spills(binary, kernel):
    """(total, Counter of (file, line) -> LDL/STL count) over the matching LsaTransport kernels."""
    counts, total = collections.Counter(), 0
    with tempfile.TemporaryDirectory() as d:
        subprocess.run([tool("cuobjdump"), "-xelf", "all", os.path.abspath(binary)], cwd=d, check=True,
                       capture_output=True)
        for cubin in glob.glob(os.path.join(d, "*.cubin")):
            sass = subprocess.run([tool("nvdisasm"), "-gi", cubin], capture_output=True, text=True).stdout
            inside, where, pending = False, None, None
            for line in sass.splitlines():
                if line.startswith(".text."):
                    inside = "fused_moe_kernel" in line and kernel in line and "LsaTransport" in line
                    continue
                if not inside:
                    continue
                m = re.search(r'//## File "([^"]+)", line (\d+)', line)
                if m:  # the first of an inlined-at chain is the innermost location
                    if pending is None:
                        pending = (os.path.basename(m.group(1)), int(m.group(2)))
                    continue
                if pending is not None:
                    where, pending = pending, None
                if re.search(r"\b(LDL|STL)[.\s]", line):
                    counts[where] += 1
                    total += 1
    return total, counts


def main():
    args = sys.argv[1:]
    base = None
    if "--base" in args:
        i = args.index("--base")
        base = args[i + 1]
        del args[i : i + 2]
    if not args:
        sys.exit(__doc__)
    binary, kernel = args[0], (args[1] if len(args) > 1 else "TileGemmTmaFp8")
    total, counts = spills(binary, kernel)
    if base is None:
        print(f"total {total}")
        for (f, l), n in sorted(counts.items(), key=lambda kv: (str(kv[0][0]), kv[0][1])):
            print(f"{n:5d}  {f}:{l}")
        return
    btotal, bcounts = spills(base, kernel)
    print(f"total {total} (base {btotal})")
    for key in sorted(set(counts) | set(bcounts), key=lambda k: (str(k[0]), k[1])):
        if counts[key] != bcounts[key]:
            print(f"{counts[key]:5d} {bcounts[key]:5d}  {key[0]}:{key[1]}")


if __name__ == "__main__":
    main()
