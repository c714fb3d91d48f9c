// Internal: the one place that reads the environment. kEnvironment lists every variable the library
// reads, with its meaning and default (README's "Environment variables" table is checked against it,
// tests/cpu/core/test_env.cpp); the functions below read and parse them, and nothing else in src/
// calls getenv (tools/ read their own, through tools/common). Implemented in src/core/env.cpp.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace epfuse::env {

struct Variable {
  std::string_view name;
  std::string_view meaning;
  std::string_view fallback;  // what applies when it is unset
};

// Every variable the library reads, in README's order.
inline constexpr Variable kEnvironment[] = {
    {"RANK", "this process's rank (BootstrapOptions::from_env)", "required"},
    {"WORLD_SIZE", "the number of ranks (BootstrapOptions::from_env)", "required"},
    {"LOCAL_RANK", "this process's GPU on its node", "RANK"},
    {"MASTER_ADDR", "the host of rank 0's TCP store, which serves the NCCL id", "127.0.0.1"},
    {"MASTER_PORT", "the port of rank 0's TCP store", "29500"},
    {"EPFUSE_JOB_ID", "the job id: ranks of other jobs on the same port are refused", "TORCHELASTIC_RUN_ID"},
    {"TORCHELASTIC_RUN_ID",
     "torchrun's job id: the job id when EPFUSE_JOB_ID is unset, and with MASTER_PORT the bootstrap secret when "
     "EPFUSE_BOOTSTRAP_SECRET is unset",
     "empty (no job id)"},
    {"EPFUSE_BOOTSTRAP_SECRET",
     "the per-launch secret every rank proves to rank 0's TCP store (`epfuse launch` sets a random one); required "
     "with WORLD_SIZE > 1 unless torchrun's TORCHELASTIC_RUN_ID is set",
     "derived from TORCHELASTIC_RUN_ID and MASTER_PORT"},
    {"EPFUSE_BOOTSTRAP_BIND_ANY",
     "1: rank 0's TCP store may listen on a wildcard MASTER_ADDR (0.0.0.0, ::): every interface",
     "0 (a wildcard is refused)"},
    {"EPFUSE_BOOTSTRAP_TIMEOUT_MS", "how long ranks wait for the NCCL id from rank 0", "120000"},
    {"EPFUSE_COLLECTIVE_TIMEOUT_MS", "the bound on every host collective of a communicator", "300000"},
    {"CUDA_VISIBLE_DEVICES", "named in the error when LOCAL_RANK exceeds the visible GPUs", "all GPUs"},
    {"CUDA_DEVICE_MAX_CONNECTIONS",
     "CUDA's hardware queues; the fused layer refuses a one-GPU world larger than it (LoopbackWorld sets 32)", "8"},
    {"EPFUSE_TIMEOUT_MS", "the fused kernel's device-side wait bound", "20000"},
    {"EPFUSE_PDL",
     "0: the fused kernel (and the decode step's norm) start only after the previous kernel on the stream has "
     "ended; 1: programmatic dependent launch, their set-up overlaps its tail",
     "1"},
    {"EPFUSE_SCHEDULE_LAG",
     "diagnostics: the fused kernel's GEMM order: auto, first (every Linear1 tile before any Linear2 tile) or the "
     "lag of each expert's Linear2 tiles behind its Linear1 tiles, in waves of CTAs counted in Linear1 tiles, a "
     "multiple of 0.25 in [0.25, 16]",
     "auto (schedule_lag in src/device/protocol/task_map.h)"},
    {"EPFUSE_FUSED_TILE",
     "diagnostics: the fused kernel's tile at every T instead of the choice by rows an expert: auto, or one the "
     "layer can run of mma-32x128, wgmma-128x128, tma-128x256 (bf16), fp8-128x256, fp8-decode and fp8-split (FP8)",
     "auto (choose_fused_tile in src/fused/plan.cpp)"},
    {"EPFUSE_PROFILE", "1: rank 0 prints the fused kernel's per-phase profile when timing stops", "off"},
    {"EPFUSE_UNFUSED_GEMM", "the unfused chain's expert GEMMs: grouped, loop or auto", "auto"},
    {"EPFUSE_FAULT", "fault injection for tests: rank=R,kind=K[,call=N][,ms=M][,at=P] (src/common/fault.h)", "off"},
    {"EPFUSE_TRACE_FILE", "builds with EPFUSE_TRACE: the CSV file the fused kernel's timeline is appended to",
     "off (nothing recorded)"},
    {"EPFUSE_TRACE_LAUNCH", "builds with EPFUSE_TRACE: the first of the four back-to-back launches of each problem recorded", "20"},
};

// The raw text of `name`, nullopt when unset. `name` must be one of kEnvironment's (else
// Error(kInternal)): every read goes through the table.
std::optional<std::string> text(std::string_view name);

// --- bootstrap (BootstrapOptions::from_env, Communicator::borrow): Error(kBootstrap) naming the
// variable and its text.
// A whole-string integer in [lo, hi]; unset: `fallback`, or an error when `required`.
long long bootstrap_integer(std::string_view name, bool required, long long fallback, long long lo, long long hi);
// EPFUSE_JOB_ID, else TORCHELASTIC_RUN_ID, else nullopt.
std::optional<std::string> job_id();
// EPFUSE_BOOTSTRAP_SECRET, else one derived from TORCHELASTIC_RUN_ID and MASTER_PORT (only as secret as
// those are), else nullopt.
std::optional<std::string> bootstrap_secret();
// EPFUSE_BOOTSTRAP_BIND_ANY: "1" true; unset, empty or "0" false; anything else Error(kBootstrap).
bool bootstrap_bind_any();
// EPFUSE_COLLECTIVE_TIMEOUT_MS in [1, 86400000]; unset: `fallback` (BootstrapOptions' default, 300000).
long long collective_timeout_ms(long long fallback);

// --- the fused layer.
// EPFUSE_TIMEOUT_MS: milliseconds in [1, 86400000], 20000 when unset or empty; otherwise
// Error(kInvalidArgument) "rank R: EPFUSE_TIMEOUT_MS = '<text>' is not a whole number ...".
uint64_t fused_timeout_ms(int rank);
// EPFUSE_PDL: "1", empty or unset true, "0" false; anything else Error(kInvalidArgument) naming it.
bool programmatic_launch();
// EPFUSE_SCHEDULE_LAG: -1 for auto (unset, empty or "auto"), 0 for "first", else the lag in quarter
// waves (1..64 for 0.25..16); anything else Error(kInvalidArgument) naming it.
int schedule_lag_quarters();
// EPFUSE_FUSED_TILE: nullopt when unset, empty or "auto", else its text (a tile's name, checked against the
// layer's tiles by fused::forced_fused_tile).
std::optional<std::string> fused_tile();
// EPFUSE_PROFILE == "1".
bool profile_print();
// CUDA_DEVICE_MAX_CONNECTIONS: a positive integer, capped at LoopbackWorld::kMaxConnections; CUDA's
// default 8 when unset or malformed.
int device_max_connections();

// --- tracing (builds with EPFUSE_TRACE).
// EPFUSE_TRACE_LAUNCH as an integer (atoi), 20 when unset.
int trace_launch();

}  // namespace epfuse::env
