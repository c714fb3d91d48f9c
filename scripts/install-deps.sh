#!/usr/bin/env bash
# Installs the Debian packages epfuse builds with (cmake, g++, make, GoogleTest, git, python3, and
# the tools' CLI11, nlohmann/json and fmt),
# only those missing: a no-op when everything is there. CUDA 13 and NCCL >= 2.28.9 are not
# installed here; they are checked (NCCL by CMake), with a clear error if absent.
set -euo pipefail

die() { echo "install-deps: $*" >&2; exit 1; }

missing=()
have() { command -v "$1" >/dev/null 2>&1; }
have cmake   || missing+=(cmake)
have g++     || missing+=(g++)
have make    || missing+=(make)
have git     || missing+=(git)
have python3 || missing+=(python3)
# Libraries: their CMake package (what find_package reads) in one of the usual places.
has_cmake_package() {  # <package dir> <config file>
  local f
  for f in /usr/lib/*/cmake/"$1"/"$2" /usr/lib/cmake/"$1"/"$2" /usr/share/cmake/"$1"/"$2"; do
    [[ -f $f ]] && return 0
  done
  return 1
}
# GoogleTest: the headers plus the CMake package find_package(GTest) uses.
[[ -f /usr/include/gtest/gtest.h ]] && has_cmake_package GTest GTestConfig.cmake || missing+=(libgtest-dev)
# The tools' libraries (tools/CMakeLists.txt): CLI11 (flags), nlohmann/json (JSON), fmt (formatting).
has_cmake_package CLI11 CLI11Config.cmake || missing+=(libcli11-dev)
has_cmake_package nlohmann_json nlohmann_jsonConfig.cmake || missing+=(nlohmann-json3-dev)
has_cmake_package fmt fmt-config.cmake || missing+=(libfmt-dev)

if ((${#missing[@]})); then
  echo "install-deps: installing ${missing[*]}"
  if [[ $(id -u) -ne 0 ]]; then
    have sudo || die "need root (or sudo) to apt-get install ${missing[*]}"
    apt=(sudo env DEBIAN_FRONTEND=noninteractive apt-get)
  else
    apt=(env DEBIAN_FRONTEND=noninteractive apt-get)
  fi
  "${apt[@]}" update -qq
  "${apt[@]}" install -y -qq --no-install-recommends "${missing[@]}"
fi

# Versions the build relies on.
cmake_version=$(cmake --version | head -n1 | awk '{print $3}')
if [[ $(printf '%s\n3.25\n' "$cmake_version" | sort -V | head -n1) != 3.25 ]]; then
  die "CMake >= 3.25 is required, found $cmake_version"
fi
gcc_major=$(g++ -dumpversion | cut -d. -f1)
((gcc_major >= 12)) || die "g++ >= 12 is required (C++20), found $(g++ -dumpversion)"

# CUDA: checked, never installed.
cuda=${CUDA_HOME:-/usr/local/cuda}
[[ -x $cuda/bin/nvcc ]] || die "CUDA 13 not found: no nvcc at $cuda/bin/nvcc (install the CUDA toolkit or set CUDA_HOME)"
nvcc_version=$("$cuda/bin/nvcc" --version | sed -n 's/.*release \([0-9]*\)\..*/\1/p')
((nvcc_version >= 13)) || die "CUDA >= 13 is required, found nvcc release $nvcc_version at $cuda"
# NCCL: found and checked by CMake (cmake/FindNCCL.cmake: the device API, at least the version the fused layer
# needs, from NCCL_HOME, the toolkit, the system or PyPI's nvidia-nccl-cu13), with every candidate named when none fits.
# The Python package's tests (tests/python): pytest, matplotlib (the timeline's figure), and torch + transformers (the GPU host's versions) for
# the CPU tests of epfuse.torch and epfuse.hf (about a minute and 4.6 GB from PyPI). Best effort, and only
# with room on disk: without them those tests report why they skip. EPFUSE_SKIP_PY_DEPS=1 skips all.
if [[ -z ${EPFUSE_SKIP_PY_DEPS:-} ]]; then
  py_missing=()
  python3 -c "import pytest" 2>/dev/null || py_missing+=(pytest)
  python3 -c "import matplotlib" 2>/dev/null || py_missing+=(matplotlib)  # scripts/trace_plot.py
  free_gb=$(df -Pk "$HOME" | awk 'NR == 2 {print int($4 / 1048576)}')
  if ((free_gb >= 12)); then
    python3 -c "import torch" 2>/dev/null || py_missing+=("torch==2.11.0")
    python3 -c "import transformers" 2>/dev/null || py_missing+=("transformers==5.17.0")
  else
    echo "install-deps: ${free_gb} GB free: not installing torch/transformers (tests/python skips what needs them)"
  fi
  if ((${#py_missing[@]})); then
    echo "install-deps: pip installing ${py_missing[*]}"
    python3 -m pip install -q "${py_missing[@]}" ||
      echo "install-deps: pip install failed; tests/python skips what needs them" >&2
  fi
fi
exit 0
