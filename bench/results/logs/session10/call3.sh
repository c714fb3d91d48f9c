#!/usr/bin/env bash
# Session 10, call 3 (nvidia-h200-x2): the fused layer beside DeepGEMM's GEMMs and MegaMoE SM90 FP8 on 2 GPUs
# (same call), then the Python suite on 2 GPUs.
cd "$(dirname "$0")/.."
mkdir -p .peers && tar xzf .carry/peers.tgz -C .peers
EPFUSE_RANKS=2 EPFUSE_BENCH_ARGS="--dtype bf16,fp8 --torch off" EPFUSE_PEERS=$PWD/.peers timeout 430 bash scripts/device-run.sh bench-fused 2>&1 | tail -45
timeout 150 bash scripts/device-run.sh pytest 2>&1 | tail -12
