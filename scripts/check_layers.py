#!/usr/bin/env python3
"""Checks that the library's sources depend one way: every `#include "..."` of a file under src/ (and the
public headers under include/epfuse/) names a file of its own folder or of a lower layer.

usage: check_layers.py REPO_ROOT

The layers, lowest first (a folder may include its own files and those of any lower layer):
  epfuse (include/epfuse)  the public API
  common                   internal headers every library shares
  core                     errors, config validation, check helpers
  padding, ref, weights    padded sizes; the seeded generator and CPU reference; FP8 weight preparation
  comm                     bootstrap, communicator, windows
  device/ptx .. device/ffn the fused kernel's device headers, by role (src/device/README.md)
  unfused, fused           the two implementations (neither includes the other)
  layer                    MoeLayer::create: the factory, the one place that names both implementations
  capi                     the C ABI over the layer
Exit code 1 with one line per edge that runs sideways or back up a layer.
"""
import pathlib
import re
import sys

LAYERS = [
    ["epfuse"],
    ["common"],
    ["core"],
    ["padding", "ref", "weights"],
    ["comm"],
    ["device/ptx"],
    ["device/diagnostics", "device/protocol"],
    ["device/gemm"],
    ["device/kernel"],
    ["device/phases", "device/ffn"],
    ["unfused", "fused"],
    ["layer"],
    ["capi"],
]
RANK = {name: i for i, names in enumerate(LAYERS) for name in names}
FACTORY = "layer/layer.cpp"


def unit_of(rel):
    """The layer unit of a path relative to src/ (or 'epfuse/...' for the public headers)."""
    parts = rel.split("/")
    if parts[0] == "device":
        return "/".join(parts[:2])
    return parts[0]


def main(root):
    root = pathlib.Path(root)
    files = [(p, p.relative_to(root / "src").as_posix()) for p in (root / "src").rglob("*")
             if p.suffix in (".h", ".cuh", ".cu", ".cpp")]
    files += [(p, "epfuse/" + p.name) for p in (root / "include" / "epfuse").glob("*.h")]
    bad = []
    for path, rel in sorted(files):
        src = unit_of(rel)
        if src not in RANK:
            bad.append(f"{rel}: folder '{src}' is in no layer (scripts/check_layers.py LAYERS)")
            continue
        for inc in re.findall(r'^\s*#\s*include\s+"([^"]+)"', path.read_text(), re.M):
            dst = unit_of(inc)
            if dst not in RANK:
                continue  # a file of the same folder named without its folder, or a generated one
            if dst == "unfused" and src == "layer" and rel != FACTORY:
                bad.append(f"{rel} -> {inc}: only {FACTORY} (the factory) names the unfused implementation")
                continue
            if dst == src or RANK[dst] < RANK[src]:
                continue
            bad.append(f"{rel} -> {inc}: layer '{src}' may not include '{dst}'")
    for line in bad:
        print(line)
    print(f"{len(files)} files, {len(bad)} edges against the layers")
    return 1 if bad else 0


def self_test():
    """The check fails on a tree with an edge back up a layer, and passes once the edge is gone."""
    import tempfile
    with tempfile.TemporaryDirectory() as d:
        root = pathlib.Path(d)
        (root / "include" / "epfuse").mkdir(parents=True)
        for folder in ("device/gemm", "device/kernel", "fused"):
            (root / "src" / folder).mkdir(parents=True)
        (root / "src/device/kernel/params.h").write_text("#pragma once\n")
        gemm = root / "src/device/gemm/mainloop.cuh"
        gemm.write_text('#include "device/kernel/params.h"\n')
        (root / "src/fused/kernel.cu").write_text('#include "device/gemm/mainloop.cuh"\n')
        failed = main(root)
        gemm.write_text('#include "common/host_device.h"\n')
        passed = main(root)
    print("self-test:", "ok" if (failed, passed) == (1, 0) else "FAILED")
    return 0 if (failed, passed) == (1, 0) else 1


if __name__ == "__main__":
    if sys.argv[1:2] == ["--self-test"]:
        sys.exit(self_test())
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "."))
