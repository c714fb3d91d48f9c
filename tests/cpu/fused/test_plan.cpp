// CPU tests of the fused layer's host planning: memory formulas, config checks, error messages.
#include <gtest/gtest.h>

#include <cctype>
#include <cstdint>
#include <map>
#include <random>
#include <string>
#include <string_view>

#include "device/diagnostics/error_record.h"
#include "device/kernel/kernel_params.h"
#include "device/protocol/task_map.h"
#include "epfuse/error.h"
#include "fused/describe_error.h"
#include "fused/plan.h"

namespace epfuse::fused {
namespace {

LayerConfig config(int H, int I, int E, int k, int T) {
  LayerConfig c;
  c.hidden = H;
  c.intermediate = I;
  c.num_experts = E;
  c.topk = k;
  c.max_tokens_per_rank = T;
  return c;
}

// FP8 configs: one tile (the FP8 128 x 256, at every T; in its decode kernel up to
// kFp8DecodeRowsPerExpert rows an expert), the private fp8_x region after the bf16 ones (its own rows: T
// FP8 x rows), nothing else changes; sizes the FP8 tile cannot run have no tile.
TEST(FusedMemoryPlan, Fp8AddsTheOwnRowRegionAndItsTile) {
  LayerConfig bf16 = config(7168, 2048, 256, 8, 1024);
  LayerConfig fp8 = bf16;
  fp8.weight_format = WeightFormat::kFp8Block128;
  for (int world : {1, 4}) {
    const FusedPlan a = plan_fused(bf16, world), b = plan_fused(fp8, world);
    EXPECT_EQ(a.fp8_x, 0u);
    EXPECT_EQ(b.fp8_x, a.priv.total);
    EXPECT_EQ(b.private_bytes(), a.private_bytes() + device::fp8_x_bytes(b.dims));
    EXPECT_EQ(b.symmetric_bytes(), a.symmetric_bytes());
    EXPECT_EQ(b.buffers.back().name, "fp8_x");
    EXPECT_EQ(b.buffers.back().bytes, device::align_region(size_t{1024} * (7168 + 4 * 56)));
  }
  for (int rows : {0, 1, kFp8DecodeRowsPerExpert})
    EXPECT_EQ(choose_fused_tile(fp8, rows, 64, 132), kTmaFp8M128N256Decode);
  for (int rows : {kFp8DecodeRowsPerExpert + 1, 32, 100, 4096})
    EXPECT_EQ(choose_fused_tile(fp8, rows, 64, 132), kTmaFp8M128N256);
  // A long I (mixtral): the split region in the workspace after fp8_x; none for dsv3's I.
  LayerConfig mixtral = config(4096, 14336, 8, 2, 1024);
  mixtral.weight_format = WeightFormat::kFp8Block128;
  const FusedPlan m = plan_fused(mixtral, 4);
  EXPECT_EQ(m.buffers.back().name, "split_k");
  EXPECT_EQ(m.split_k, m.fp8_x + device::fp8_x_bytes(m.dims));
  EXPECT_EQ(m.private_bytes(), m.split_k + device::split_k_bytes(m.dims));
  // The split kernel where mixtral's Linear2 tiles (2 experts x 16 n-blocks an m-block) leave a grid of 132
  // room for two parts or more: 4 parts up to 128 rows an expert, 2 at 256; at 257 (6 m-blocks, 96 tiles) one
  // part, the 64-row kernel. Without split slots, or on a grid of 33 (the one-GPU mode's 4 ranks), none.
  for (int rows : {0, 1, 16, 17, 128, 256})
    EXPECT_EQ(choose_fused_tile(mixtral, rows, 2, 132, device::kSplitSlots), kTmaFp8M128N256Split) << rows;
  EXPECT_EQ(choose_fused_tile(mixtral, 257, 2, 132, device::kSplitSlots), kTmaFp8M128N256);
  EXPECT_EQ(choose_fused_tile(mixtral, 1, 2, 132, 0), kTmaFp8M128N256Decode);
  EXPECT_EQ(choose_fused_tile(mixtral, 1, 2, 33, device::kSplitSlots), kTmaFp8M128N256Decode);
  EXPECT_EQ(choose_fused_tile(mixtral, 64, 2, 33, device::kSplitSlots), kTmaFp8M128N256);
  // dsv3's 64 experts a GPU have 1,792 Linear2 tiles at one row each: no split, slots or not.
  EXPECT_EQ(choose_fused_tile(fp8, 1, 64, 132, device::kSplitSlots), kTmaFp8M128N256Decode);
  EXPECT_EQ(forced_fused_tile(mixtral, "fp8-split"), kTmaFp8M128N256Split);
  EXPECT_EQ(plan_fused(fp8, 4).split_k, 0u);
  // EPFUSE_FUSED_TILE's names: the FP8 kernels for an FP8 layer, a bf16 tile refused with the ones it runs.
  EXPECT_EQ(forced_fused_tile(fp8, "fp8-decode"), kTmaFp8M128N256Decode);
  EXPECT_EQ(forced_fused_tile(fp8, "fp8-128x256"), kTmaFp8M128N256);
  for (const char* bad : {"tma-128x256", "mma-32x128", "fp8", "auto", ""}) {
    try {
      forced_fused_tile(fp8, bad, "rank 3: ");
      ADD_FAILURE() << bad << " accepted for an FP8 layer";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
      EXPECT_EQ(std::string(e.what()), std::string("rank 3: EPFUSE_FUSED_TILE = '") + bad +
                                           "' is not a tile this layer runs (auto or one of fp8-128x256, fp8-decode, fp8-split)");
    }
  }
  EXPECT_EQ(forced_fused_tile(bf16, "mma-32x128"), kTileM32);
  EXPECT_EQ(forced_fused_tile(bf16, "tma-128x256"), kTmaM128N256);
  ASSERT_EQ(supported_fused_tiles(fp8).size(), 3u);
  EXPECT_EQ(kTmaFp8M128N256Decode.threads(), 384);
  EXPECT_EQ(kTmaFp8M128N256Decode.smem_bytes(), kTmaFp8M128N256.smem_bytes());
  EXPECT_EQ(kTmaFp8M128N256Split.threads(), 384);
  EXPECT_EQ(kTmaFp8M128N256Split.smem_bytes(), kTmaFp8M128N256.smem_bytes());
  EXPECT_EQ(kTmaFp8M128N256.threads(), 384);
  LayerConfig odd = fp8;
  odd.hidden = 384;  // % 256 != 0
  EXPECT_TRUE(supported_fused_tiles(odd).empty());
}

TEST(FusedMemoryPlan, MatchesTheDocumentedFormulas) {
  for (int world : {1, 2, 4, 8}) {
    const int H = 7168, I = 2048, E = 256, k = 8, T = 1024;
    const FusedPlan p = plan_fused(config(H, I, E, k, T), world);
    auto bytes = [&](const std::string& name) {
      for (const BufferBytes& b : p.buffers)
        if (b.name == name) return b.bytes;
      ADD_FAILURE() << "no buffer " << name;
      return size_t{0};
    };
    const size_t R = world, L = E / world;
    // Regions are 256-byte aligned: each is its formula rounded up.
    auto near = [](size_t got, size_t want) { return got >= want && got < want + 256; };
    EXPECT_TRUE(near(bytes("recv_rows"), 2 * (R - 1) * T * H * 2));
    EXPECT_TRUE(near(bytes("recv_entries"), 2 * R * T * k * 16));
    EXPECT_TRUE(near(bytes("count_words"), 2 * R * (L + 2) * 8));
    EXPECT_TRUE(near(bytes("counts"), R * L * 4));
    EXPECT_TRUE(near(bytes("arrivals"), 2 * L * 4));
    EXPECT_TRUE(near(bytes("combine_rows"), size_t{2} * T * k * H * 2));
    EXPECT_TRUE(near(bytes("token_signals"), size_t{2} * T * 4));
    EXPECT_TRUE(near(bytes("h"), R * T * k * I * 2));
    size_t sym = 0, priv = 0;
    for (const BufferBytes& b : p.buffers) (b.symmetric ? sym : priv) += b.bytes;
    EXPECT_EQ(sym, p.symmetric_bytes());
    EXPECT_EQ(priv, p.private_bytes());
    EXPECT_NE(format_plan(p).find("recv_rows"), std::string::npos);
  }
}

// Evaluates a formula as format_plan prints it: integers, names, + - * /, parentheses, min(a, b), and
// trailing definitions ("..., N=R*T*k"). Integer arithmetic, as the plan's own.
class FormulaEval {
 public:
  explicit FormulaEval(std::map<std::string, int64_t> names) : names_(std::move(names)) {}

  int64_t operator()(std::string_view text) {
    // Definitions first: "expr, X=def, Y=def".
    std::string_view expr = text;
    for (size_t comma = expr.rfind(", "); comma != std::string_view::npos; comma = expr.rfind(", ")) {
      const std::string_view def = expr.substr(comma + 2);
      const size_t eq = def.find('=');
      EXPECT_NE(eq, std::string_view::npos) << text;
      names_[std::string(def.substr(0, eq))] = parse_all(def.substr(eq + 1));
      expr = expr.substr(0, comma);
    }
    return parse_all(expr);
  }

 private:
  int64_t parse_all(std::string_view text) {
    s_ = text;
    at_ = 0;
    const int64_t v = sum();
    EXPECT_EQ(at_, s_.size()) << "unparsed tail in " << text;
    return v;
  }
  int64_t sum() {
    int64_t v = product();
    while (at_ < s_.size() && (s_[at_] == '+' || s_[at_] == '-')) v = s_[at_++] == '+' ? v + product() : v - product();
    return v;
  }
  int64_t product() {
    int64_t v = atom();
    while (at_ < s_.size() && (s_[at_] == '*' || s_[at_] == '/')) v = s_[at_++] == '*' ? v * atom() : v / atom();
    return v;
  }
  int64_t atom() {
    if (at_ < s_.size() && s_[at_] == '(') {
      ++at_;
      const int64_t v = sum();
      expect(')');
      return v;
    }
    if (at_ < s_.size() && std::isdigit(static_cast<unsigned char>(s_[at_]))) {
      int64_t v = 0;
      while (at_ < s_.size() && std::isdigit(static_cast<unsigned char>(s_[at_]))) v = v * 10 + (s_[at_++] - '0');
      return v;
    }
    size_t end = at_;
    while (end < s_.size() && (std::isalnum(static_cast<unsigned char>(s_[end])) || s_[end] == '_')) ++end;
    const std::string name(s_.substr(at_, end - at_));
    at_ = end;
    if (name == "min" || name == "sizeof") {
      expect('(');
      if (name == "sizeof") {
        const size_t close = s_.find(')', at_);
        const std::string type(s_.substr(at_, close - at_));
        at_ = close + 1;
        return lookup("sizeof(" + type + ")");
      }
      const int64_t a = sum();
      expect(',');
      const int64_t b = sum();
      expect(')');
      return a < b ? a : b;
    }
    return lookup(name);
  }
  int64_t lookup(const std::string& name) {
    const auto it = names_.find(name);
    EXPECT_NE(it, names_.end()) << "unknown name '" << name << "' in " << s_;
    return it == names_.end() ? 0 : it->second;
  }
  void expect(char c) {
    EXPECT_TRUE(at_ < s_.size() && s_[at_] == c) << "expected '" << c << "' at " << at_ << " in " << s_;
    ++at_;
  }

  std::map<std::string, int64_t> names_;
  std::string_view s_;
  size_t at_ = 0;
};

// Every printed formula, evaluated with the config's R, T, H, I, k, E, L, is the region's bytes before
// the 256-byte rounding: for random configs, the bytes lie in [formula, formula + 256). A formula off
// by d bytes falls outside for about d/256 of the configs, so any drift shows within these many.
TEST(FusedMemoryPlan, PrintedFormulasGiveTheBytes) {
  std::mt19937 rng(12);
  auto pick = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  for (int trial = 0; trial < 2000; ++trial) {
    const int world = pick(1, 16), L = pick(1, 40), k = pick(1, 16), T = pick(0, 3000);
    const int H = 128 * pick(1, 64), I = 128 * pick(1, 32);
    const int E = L * world;
    const FusedPlan p = plan_fused(config(H, I, E, k, T), world);
    FormulaEval eval({{"R", world}, {"T", T}, {"H", H}, {"I", I}, {"k", k}, {"E", E}, {"L", L},
                      {"sizeof(FusedControl)", static_cast<int64_t>(sizeof(device::FusedControl))}});
    for (const BufferBytes& b : p.buffers) {
      const int64_t want = eval(b.formula);
      ASSERT_TRUE(static_cast<int64_t>(b.bytes) >= want && static_cast<int64_t>(b.bytes) < want + 256)
          << b.name << " = " << b.formula << " gives " << want << ", the plan has " << b.bytes << " (R " << world
          << " T " << T << " H " << H << " I " << I << " k " << k << " E " << E << ")";
    }
  }
}

TEST(FusedMemoryPlan, ZeroTokensStillPlans) {
  const FusedPlan p = plan_fused(config(128, 128, 8, 2, 0), 2);
  EXPECT_GT(p.symmetric_bytes(), 0u);  // counts and flags exist even without tokens
}

TEST(FusedMemoryPlan, RejectsWhatTheKernelCannotTile) {
  auto code_of = [](const LayerConfig& c, int world) {
    try {
      plan_fused(c, world);
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("fused layer"), std::string::npos) << e.what();
      return e.code();
    }
    return ErrorCode::kInternal;
  };
  EXPECT_EQ(code_of(config(100, 128, 8, 2, 16), 2), ErrorCode::kInvalidConfig);  // H not a multiple of 128
  EXPECT_EQ(code_of(config(128, 192, 8, 2, 16), 2), ErrorCode::kInvalidConfig);  // I not a multiple of 128
  EXPECT_EQ(code_of(config(128, 128, 6, 2, 16), 4), ErrorCode::kInvalidConfig);  // E % world
  EXPECT_EQ(code_of(config(128, 128, 8, 17, 16), 2), ErrorCode::kInvalidConfig); // k > 16
  EXPECT_EQ(code_of(config(128, 128, 8, 0, 16), 2), ErrorCode::kInvalidConfig);
}

TEST(FusedErrors, MessagesNameRankPhaseAndWait) {
  device::ErrorRecord r{static_cast<int32_t>(device::ErrorKind::kTimeout), 1,
                        static_cast<int32_t>(device::Phase::kLinear1), static_cast<int32_t>(device::WaitKind::kArrivals),
                        5, 0, 12, 7};
  EXPECT_EQ(error_code(r), ErrorCode::kTimeout);
  EXPECT_EQ(describe_error(r),
            "rank 1: timed out in linear1 waiting for arrivals of local expert 5 from all senders (expected 12, saw 7)");
  r = {static_cast<int32_t>(device::ErrorKind::kTimeout), 0, static_cast<int32_t>(device::Phase::kCollect),
       static_cast<int32_t>(device::WaitKind::kCounts), 3, 0, 9, 7};
  EXPECT_EQ(describe_error(r), "rank 0: timed out in collect counts waiting for the count message of rank 3 (expected 9, saw 7)");
  r = {static_cast<int32_t>(device::ErrorKind::kBadExpert), 2, 0, 0, 17, 3, static_cast<uint32_t>(-5), 0};
  EXPECT_EQ(error_code(r), ErrorCode::kInvalidArgument);
  EXPECT_EQ(describe_error(r), "rank 2: topk_idx[17][3] = -5 is not a valid expert id (-1 or [0, E))");
  r = {static_cast<int32_t>(device::ErrorKind::kPeerBadInput), 0, 0, 0, 2, 0, 0, 2};
  EXPECT_EQ(error_code(r), ErrorCode::kInvalidArgument);
  EXPECT_EQ(describe_error(r), "rank 0: rank 2 reported invalid input (an expert id out of range)");
  r.seen = static_cast<uint32_t>(device::ErrorKind::kBadTokenCount);
  EXPECT_EQ(describe_error(r), "rank 0: rank 2 reported invalid input (num_tokens out of range)");
  r.seen = static_cast<uint32_t>(device::ErrorKind::kBadPointer);
  EXPECT_EQ(describe_error(r), "rank 0: rank 2 reported invalid input (a null, misaligned or aliased pointer)");
  r = {static_cast<int32_t>(device::ErrorKind::kPeerOtherLayer), 1, static_cast<int32_t>(device::Phase::kCollect), 0,
       0, 0, 3, 4};
  EXPECT_EQ(error_code(r), ErrorCode::kInvalidArgument);
  EXPECT_EQ(describe_error(r), "rank 1: rank 0 called another layer in this call (its layer 4, this rank's 3, by "
                               "creation order on the workspace): every rank must call the same layer in the same order");
}

}  // namespace
}  // namespace epfuse::fused

namespace epfuse::fused {
namespace {

TEST(FusedTileChoice, BothGemmsAlwaysTile) {
  for (int H : {128, 256, 384, 2048, 7168})
    for (int I : {128, 256, 768, 2048})
      for (int rows : {0, 1, 16, 33, 64, 100, 129, 200, 256, 5000}) {
        LayerConfig c;
        c.hidden = H;
        c.intermediate = I;
        c.num_experts = 8;
        c.topk = 2;
        c.max_tokens_per_rank = 16;
        const GemmTileShape s = choose_fused_tile(c, rows, 4, 132);
        EXPECT_TRUE(fused_tile_supports(s, c)) << "H " << H << " I " << I << " rows " << rows;
        // The kernel has an instantiation for it.
        bool instantiated = false;
        for (const GemmTileShape& f : kFusedTileShapes) instantiated = instantiated || f == s;
        EXPECT_TRUE(instantiated) << "H " << H << " I " << I << " rows " << rows;
      }
}

TEST(FusedTileChoice, HopperShapesPerRowCount) {
  LayerConfig c;
  c.hidden = 7168;
  c.intermediate = 2048;
  c.num_experts = 256;
  c.topk = 8;
  c.max_tokens_per_rank = 4096;
  // World 4: 64 local experts, 132 CTAs.
  EXPECT_EQ(choose_fused_tile(c, 16, 64, 132), kTileM32);       // dsv3 T=128: weight-bound, mma.sync
  EXPECT_EQ(choose_fused_tile(c, 32, 64, 132), kTmaM128N256);   // dsv3 T=256: 1024 tiles of 128x256
  EXPECT_EQ(choose_fused_tile(c, 127, 64, 132), kTmaM128N256);
  EXPECT_EQ(choose_fused_tile(c, 512, 64, 132), kTmaM128N256);  // dsv3 T=4096
  // Few experts (one GPU's share of a 4-expert layer): 128x256 tiles fewer than the grid.
  EXPECT_EQ(choose_fused_tile(c, 32, 1, 132), kTileM32);
  EXPECT_EQ(choose_fused_tile(c, 33, 1, 132), kWgmmaM128N128);
  EXPECT_EQ(choose_fused_tile(c, 512, 1, 132), kWgmmaM128N128);  // 4 x 16 Linear1 tiles of 128x256
  EXPECT_EQ(choose_fused_tile(c, 512, 1, 64), kTmaM128N256);
  c.hidden = 7168 + 128;                                  // Linear2 (n = H) cannot take N256
  EXPECT_EQ(choose_fused_tile(c, 512, 64, 132), kWgmmaM128N128);
}

}  // namespace
}  // namespace epfuse::fused
