#!/usr/bin/env bash
# Session 23, call 6 (one GPU; nvidia-h200 asked): issue 13's table (call1.sh, main's CLI) if the machine
# is an H200; on any other GPU nothing (the session's H100 work is done).
cd "$(dirname "$0")/../../../.."
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "$gpu"
if [[ "$gpu" == *H200* ]]; then cp .carry/s23/main-epfuse .carry/build/tools/epfuse; exec bash bench/results/logs/session23/call1.sh; fi
