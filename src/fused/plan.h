// Memory plan of the fused layer: every buffer's bytes (symmetric and private) as a pure function of
// the config and world size, for the allocation, the CLI's printout and docs/fused_design.md.
#pragma once
#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "device/protocol/regions.h"
#include "epfuse/config.h"
#include "fused/heuristics.h"

namespace epfuse::fused {

struct BufferBytes {
  std::string name;
  std::string formula;
  size_t bytes;
  bool symmetric;
};

struct FusedPlan {
  device::FusedDims dims;
  device::SymRegions sym;
  device::PrivRegions priv;
  std::vector<BufferBytes> buffers;  // each region, in address order
  size_t fp8_x = 0;                  // FP8 configs: the private fp8_x region (after priv's regions; priv.total includes it)
  size_t split_k = 0;                // FP8 configs of a long I: the private split region (after fp8_x; 0: none)
  size_t symmetric_bytes() const { return sym.total; }
  size_t private_bytes() const { return priv.total; }
};

// Throws Error(kInvalidConfig) when cfg cannot be tiled by the fused kernel on `world` ranks.
FusedPlan plan_fused(const LayerConfig& cfg, int world);
// The tile shapes that can run both GEMMs of cfg (Linear1: n = 2I, k = H; Linear2: n = H, k = I).
bool fused_tile_supports(const GemmTileShape& s, const LayerConfig& cfg);
std::vector<GemmTileShape> supported_fused_tiles(const LayerConfig& cfg);
// A call's tile from its rows per local expert, the rank's local experts, its grid (CTAs) and its workspace's
// split slots (FusedParams::split_k.slots, 0 without a split region): bf16 choose_bf16_tile (heuristics.h);
// FP8 the split kernel (kTmaFp8M128N256Split) where Linear2's tiles would take two parts or more
// (task_map.h linear2_call_parts), else its decode kernel up to kFp8DecodeRowsPerExpert rows an expert,
// else the 64-row kernel.
GemmTileShape choose_fused_tile(const LayerConfig& cfg, int rows_per_expert, int local_experts, int grid, int split_slots = 0);
// The fused kernel's tiles by name (EPFUSE_FUSED_TILE, for diagnostics and A/Bs of the choice above).
struct NamedFusedTile {
  std::string_view name;
  GemmTileShape shape;
};
inline constexpr NamedFusedTile kNamedFusedTiles[] = {{"mma-32x128", kTileM32},
                                                      {"wgmma-128x128", kWgmmaM128N128},
                                                      {"tma-128x256", kTmaM128N256},
                                                      {"fp8-128x256", kTmaFp8M128N256},
                                                      {"fp8-decode", kTmaFp8M128N256Decode},
                                                      {"fp8-split", kTmaFp8M128N256Split}};
// A tile's name in kNamedFusedTiles ("" for a shape the fused kernel is not instantiated for).
std::string_view fused_tile_name(const GemmTileShape& s);
// The tile named `name` when cfg can run it (supported_fused_tiles); else Error(kInvalidArgument), `who`
// then EPFUSE_FUSED_TILE's text and the names this layer can take.
GemmTileShape forced_fused_tile(const LayerConfig& cfg, std::string_view name, const std::string& who = "");

// One line per buffer: name, formula, MiB; then the totals.
std::string format_plan(const FusedPlan& plan);

}  // namespace epfuse::fused
