#!/usr/bin/env bash
# Packs a build for another host (a GPU machine without the toolchain): copies the executables and ctest
# files of build/ into .carry/build (ignored by git); object files, static libraries, CMake internals and
# the CPU tests' executables stay here. Also writes .carry/build.tar.xz, the same files compressed (~15x:
# the CUDA binaries' code compresses well); copy either to the other host's checkout, where
# scripts/remote-run.sh unpacks the archive when .carry/build is absent and runs the checks.
set -euo pipefail
cd "$(dirname "$0")/.."
command -v rsync >/dev/null || { echo "remote-pack: needs rsync (apt-get install rsync)" >&2; exit 1; }
command -v xz >/dev/null || { echo "remote-pack: needs xz (apt-get install xz-utils)" >&2; exit 1; }
[ -f build/CMakeCache.txt ] || { echo "remote-pack: no build in build/ (bash scripts/build.sh first)" >&2; exit 1; }
rm -rf .carry/build .carry/build.tar.xz && mkdir -p .carry
(cd build && ctest -N >/dev/null)  # gtest lists are generated at ctest time: make them exist before copying
# The CPU tests' executables stay here (the device runs the GPU ones); their ctest files travel.
rsync -a --include 'tests/cpu/**/' --include 'tests/cpu/**.cmake' --exclude 'tests/cpu/**' --exclude '*.o' --exclude '*.a' --exclude 'CMakeFiles/' --exclude 'tests/cpu/install/work/' build/ .carry/build/
du -sh .carry/build
tar cJf .carry/build.tar.xz -C .carry build
du -sh .carry/build.tar.xz
