#!/usr/bin/env python3
"""Spill instructions (LDL / STL) of the fused kernels, per source line, from a binary built with -lineinfo.

Usage: spill_report.py BINARY [KERNEL_SUBSTRING] [--base BASE_BINARY] [--roles] [--transport NAME]
  KERNEL_SUBSTRING picks the fused_moe_kernel instantiations to count (default TileGemmTmaFp8: the FP8
  prefill and decode kernels; their LsaTransport instantiations are reported, or those of --transport, e.g.
  LocalTransport: the world-1 kernels). Prints the total, then one
  line per innermost source location (file, line) with its count; with --base, the same for BASE side by
  side. --roles splits each count by where the instruction sits: before the kernel's first setmaxnreg
  (launch: every warp), after the math warps' (math) or after the producer's (producer). By address only:
  code a role reaches by a branch into another role's range counts as that range's (setmaxnreg_check.py
  lists such branches). A spill in the producer's loops cost the layer more than the same count elsewhere
  (docs/performance.md#the-producers-registers-in-the-fp8-layer-2026-12-01).
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


def spills(binary, kernel, roles=False, transport="LsaTransport"):
    """(total, Counter of (file, line) -> LDL/STL count) over the matching `transport` kernels; with roles,
    the keys are (role, file, line)."""
    counts, total = collections.Counter(), 0
    with tempfile.TemporaryDirectory() as d:
        subprocess.run([tool("cuobjdump"), "-xelf", "all", os.path.abspath(binary)], cwd=d, check=True,
                       capture_output=True)
        for cubin in glob.glob(os.path.join(d, "*.cubin")):
            sass = subprocess.run([tool("nvdisasm"), "-gi", cubin], capture_output=True, text=True).stdout
            inside, where, pending, role = False, None, None, "launch"
            for line in sass.splitlines():
                if line.startswith(".text."):
                    inside = "fused_moe_kernel" in line and kernel in line and transport in line
                    role = "launch"
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
                if "USETMAXREG" in line:  # the math warps take registers (TRY_ALLOC), the producer gives them (DEALLOC)
                    role = "math" if "TRY_ALLOC" in line else "producer"
                if re.search(r"\b(LDL|STL)[.\s]", line):
                    counts[(role,) + where if roles else where] += 1
                    total += 1
    return total, counts


def main():
    args = sys.argv[1:]
    roles = "--roles" in args
    if roles:
        args.remove("--roles")
    transport = "LsaTransport"
    if "--transport" in args:
        i = args.index("--transport")
        transport = args[i + 1]
        del args[i : i + 2]
    base = None
    if "--base" in args:
        i = args.index("--base")
        base = args[i + 1]
        del args[i : i + 2]
    if not args:
        sys.exit(__doc__)
    binary, kernel = args[0], (args[1] if len(args) > 1 else "TileGemmTmaFp8")
    total, counts = spills(binary, kernel, roles, transport)
    name = lambda k: (f"{k[0]:8s} " if roles else "") + f"{k[-2]}:{k[-1]}"
    order = lambda k: tuple(str(x) for x in k[:-1]) + (k[-1],)
    if base is None:
        print(f"total {total}")
        if roles:
            by_role = collections.Counter()
            for k, n in counts.items():
                by_role[k[0]] += n
            print("  " + ", ".join(f"{r} {by_role[r]}" for r in ("launch", "math", "producer")))
        for k in sorted(counts, key=order):
            print(f"{counts[k]:5d}  {name(k)}")
        return
    btotal, bcounts = spills(base, kernel, roles, transport)
    print(f"total {total} (base {btotal})")
    for k in sorted(set(counts) | set(bcounts), key=order):
        if counts[k] != bcounts[k]:
            print(f"{counts[k]:5d} {bcounts[k]:5d}  {name(k)}")


if __name__ == "__main__":
    main()
