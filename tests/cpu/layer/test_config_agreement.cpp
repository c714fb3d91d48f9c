// The creation-time config agreement (src/layer/config_agreement.h) between the rank threads of a
// LoopbackWorld: one rank with a different or an invalid config makes EVERY rank throw
// Error(kInvalidConfig) naming the field (or the invalid rank), and equal configs pass. The function
// is called directly: MoeLayer::create would go on to CUDA after it. No GPU needed.
#include <gtest/gtest.h>

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "epfuse/communicator.h"
#include "epfuse/config.h"
#include "epfuse/error.h"
#include "epfuse/layer.h"
#include "epfuse/workspace.h"
#include "layer/config_agreement.h"
#include "padding/padding.h"

namespace epfuse {
namespace {

constexpr int kWorlds[] = {2, 4, 8};

LayerConfig base_config() {
  LayerConfig cfg;
  cfg.hidden = 256;
  cfg.intermediate = 128;
  cfg.num_experts = 16;  // divisible by every world above
  cfg.topk = 4;
  cfg.max_tokens_per_rank = 64;
  return cfg;
}

struct Outcome {
  bool thrown = false;
  ErrorCode code = ErrorCode::kInternal;
  std::string what;
};

// What a rank calls with its config: the agreement itself by default, or a creation that makes it.
using Call = std::function<void(Communicator& comm, const LayerConfig& cfg, Impl impl)>;
void check_only(Communicator& comm, const LayerConfig& cfg, Impl impl) {
  check_same_config_on_every_rank(comm, cfg, impl, "MoeLayer::create");
}

// Every rank of a world of `world` calls `call` with the base config, changed by `vary` on the ranks
// it chooses; returns what each rank saw. A rank that throws still aborts the world (as run() does), so
// a call that went past the agreement into a collective cannot leave its peers waiting.
using Vary = std::function<void(int rank, LayerConfig& cfg, Impl& impl)>;
std::vector<Outcome> agree(int world, const Vary& vary, const Call& call = check_only) {
  LoopbackWorld loopback(world, 0, std::chrono::milliseconds(30000));
  std::vector<Outcome> outcomes(static_cast<size_t>(world));
  const std::vector<std::string> errors = loopback.run([&](Communicator& comm) {
    LayerConfig cfg = base_config();
    Impl impl = Impl::kFused;
    vary(comm.rank(), cfg, impl);
    try {
      call(comm, cfg, impl);
    } catch (const Error& e) {
      outcomes[static_cast<size_t>(comm.rank())] = {true, e.code(), e.what()};
      throw;
    }
  });
  for (size_t r = 0; r < errors.size(); ++r) EXPECT_EQ(errors[r], outcomes[r].what) << "rank " << r;
  return outcomes;
}

// Every rank threw kInvalidConfig with "rank R: " + `tail`.
void expect_every_rank_throws(const std::vector<Outcome>& outcomes, const std::string& tail) {
  for (size_t r = 0; r < outcomes.size(); ++r) {
    SCOPED_TRACE("rank " + std::to_string(r));
    ASSERT_TRUE(outcomes[r].thrown);
    EXPECT_EQ(outcomes[r].code, ErrorCode::kInvalidConfig);
    EXPECT_EQ(outcomes[r].what, "rank " + std::to_string(r) + ": " + tail);
  }
}

void expect_no_rank_throws(const std::vector<Outcome>& outcomes) {
  for (size_t r = 0; r < outcomes.size(); ++r) EXPECT_FALSE(outcomes[r].thrown) << "rank " << r << ": " << outcomes[r].what;
}

// "rank 0 = a, rank 1 = a, ..., rank odd = b, ...": the listing the message must carry.
std::string listing(int world, int odd, const std::string& usual, const std::string& different) {
  std::string text;
  for (int r = 0; r < world; ++r)
    text += (r > 0 ? ", " : "") + ("rank " + std::to_string(r) + " = ") + (r == odd ? different : usual);
  return text;
}

TEST(Agreement, EqualConfigsPassOnEveryRank) {
  for (int world : kWorlds) {
    SCOPED_TRACE("world " + std::to_string(world));
    expect_no_rank_throws(agree(world, [](int, LayerConfig&, Impl&) {}));
    expect_no_rank_throws(agree(world, [](int, LayerConfig& cfg, Impl& impl) {
      cfg.swiglu_clamp = 7.5f;
      impl = Impl::kUnfused;
    }));
  }
}

TEST(Agreement, SmBudgetIsEachRanksOwn) {
  for (int world : kWorlds) {
    SCOPED_TRACE("world " + std::to_string(world));
    expect_no_rank_throws(agree(world, [](int rank, LayerConfig& cfg, Impl&) { cfg.num_sms = rank * 3; }));
  }
}

// One field changed on one rank (the first, a middle and the last in turn): every rank names it.
struct Difference {
  const char* field;
  std::string usual, different;  // the field's value in the message: every other rank's, the odd rank's
  std::function<void(LayerConfig&, Impl&)> change;
};

TEST(Agreement, OneRankDifferingFailsEveryRankNamingTheField) {
  const std::vector<Difference> differences = {
      {"hidden", "256", "2048", [](LayerConfig& c, Impl&) { c.hidden = 2048; }},
      {"intermediate", "128", "384", [](LayerConfig& c, Impl&) { c.intermediate = 384; }},
      {"num_experts", "16", "32", [](LayerConfig& c, Impl&) { c.num_experts = 32; }},
      {"topk", "4", "2", [](LayerConfig& c, Impl&) { c.topk = 2; }},
      {"max_tokens_per_rank", "64", "65", [](LayerConfig& c, Impl&) { c.max_tokens_per_rank = 65; }},
      {"swiglu_clamp", "0", "1.5", [](LayerConfig& c, Impl&) { c.swiglu_clamp = 1.5f; }},
      // Bit for bit: the clamps 0 and -0 compare equal as floats but are not the same config.
      {"swiglu_clamp", "0", "-0", [](LayerConfig& c, Impl&) { c.swiglu_clamp = -0.0f; }},
      // Clamps one float step apart print apart.
      {"swiglu_clamp", "0", "1e-45", [](LayerConfig& c, Impl&) { c.swiglu_clamp = 1e-45f; }},
      {"weight_format", "bf16", "fp8-block128",
       [](LayerConfig& c, Impl&) { c.weight_format = WeightFormat::kFp8Block128; }},
      {"impl", "fused", "unfused", [](LayerConfig&, Impl& impl) { impl = Impl::kUnfused; }},
  };
  for (int world : kWorlds) {
    for (int odd : {0, world / 2, world - 1}) {
      for (const Difference& d : differences) {
        SCOPED_TRACE("world " + std::to_string(world) + ", rank " + std::to_string(odd) + " differs in " + d.field +
                     " = " + d.different);
        const auto outcomes = agree(world, [&](int rank, LayerConfig& cfg, Impl& impl) {
          if (rank == odd) d.change(cfg, impl);
        });
        expect_every_rank_throws(outcomes, std::string("MoeLayer::create: ranks disagree on ") + d.field + ": " +
                                               listing(world, odd, d.usual, d.different));
      }
    }
  }
}

// The scale format differs between FP8 configs (the base is bf16, where only fp32 scales are valid).
TEST(Agreement, OneRankWithAnotherScaleFormatFailsEveryRank) {
  for (int world : kWorlds) {
    SCOPED_TRACE("world " + std::to_string(world));
    const auto outcomes = agree(world, [&](int rank, LayerConfig& cfg, Impl&) {
      cfg.weight_format = WeightFormat::kFp8Block128;
      if (rank == world - 1) cfg.scale_format = ScaleFormat::kUe8m0;
    });
    expect_every_rank_throws(outcomes, "MoeLayer::create: ranks disagree on scale_format: " +
                                           listing(world, world - 1, "fp32", "ue8m0"));
  }
}

TEST(Agreement, MessageNamesTheCallerAndEveryRanksValue) {
  // The example, literally: world 4, rank 2 has another hidden size.
  const auto outcomes = agree(4, [](int rank, LayerConfig& cfg, Impl&) { cfg.hidden = rank == 2 ? 2048 : 4096; },
                              [](Communicator& comm, const LayerConfig& cfg, Impl impl) {
                                check_same_config_on_every_rank(comm, cfg, impl, "Workspace::create");
                              });
  ASSERT_TRUE(outcomes[2].thrown);
  EXPECT_EQ(outcomes[2].what,
            "rank 2: Workspace::create: ranks disagree on hidden: rank 0 = 4096, rank 1 = 4096, rank 2 = 2048, "
            "rank 3 = 4096");
}

TEST(Agreement, FirstDifferingFieldIsNamed) {
  // topk and max_tokens_per_rank both differ: the message names the first of them in the config's order.
  expect_every_rank_throws(agree(2,
                                 [](int rank, LayerConfig& cfg, Impl&) {
                                   if (rank == 1) {
                                     cfg.max_tokens_per_rank = 32;
                                     cfg.topk = 8;
                                   }
                                 }),
                           "MoeLayer::create: ranks disagree on topk: " + listing(2, 1, "4", "8"));
}

// A config only one rank rejects (validate_config would throw there alone while its peers went on to
// the creation's next collective): every rank throws, naming that rank and check_config's reason.
TEST(Agreement, OneRankWithAnInvalidConfigFailsEveryRank) {
  const std::vector<std::function<void(LayerConfig&)>> breaks = {
      [](LayerConfig& c) { c.hidden = 100; },
      [](LayerConfig& c) { c.topk = 17; },
      [](LayerConfig& c) { c.max_tokens_per_rank = 0; },
      [](LayerConfig& c) { c.swiglu_clamp = -1.0f; },
      [](LayerConfig& c) { c.num_experts = 12; },  // not divisible by 8: invalid at world 8 only
      [](LayerConfig& c) { c.num_sms = -1; },      // not compared, but still checked
      [](LayerConfig& c) { c.scale_format = ScaleFormat::kUe8m0; },  // UE8M0 without FP8 weights
  };
  for (int world : kWorlds) {
    for (int bad : {0, world - 1}) {
      for (size_t b = 0; b < breaks.size(); ++b) {
        LayerConfig broken = base_config();
        breaks[b](broken);
        const std::string reason = check_config(broken, world);
        SCOPED_TRACE("world " + std::to_string(world) + ", rank " + std::to_string(bad) + ": " + reason);
        const auto outcomes = agree(world, [&](int rank, LayerConfig& cfg, Impl&) {
          if (rank == bad) breaks[b](cfg);
        });
        if (reason.empty()) {  // valid at this world size, so merely different
          for (const Outcome& o : outcomes) EXPECT_NE(o.what.find("ranks disagree on num_experts"), std::string::npos);
          continue;
        }
        expect_every_rank_throws(outcomes, "MoeLayer::create: rank " + std::to_string(bad) +
                                               " has an invalid config: " + reason);
      }
    }
  }
}

TEST(Agreement, AnInvalidConfigIsReportedBeforeADifference) {
  // Rank 1 differs in topk (valid), rank 2's hidden is invalid: every rank names rank 2's problem.
  LayerConfig broken = base_config();
  broken.hidden = 200;
  const auto outcomes = agree(4, [](int rank, LayerConfig& cfg, Impl&) {
    if (rank == 1) cfg.topk = 2;
    if (rank == 2) cfg.hidden = 200;
  });
  expect_every_rank_throws(outcomes, "MoeLayer::create: rank 2 has an invalid config: " + check_config(broken, 4));
}

// A workspace that only carries its communicator: MoeLayer::create(cfg, workspace, weights) reaches
// the agreement through it, and a mismatch must stop the creation there, before any CUDA call.
class CommOnlyWorkspace final : public Workspace {
 public:
  explicit CommOnlyWorkspace(Communicator& comm) : comm_(comm) {}
  const LayerConfig& capacity() const override { return capacity_; }
  Communicator& comm() const override { return comm_; }
  MemoryFootprint memory() const override { return {}; }
  std::string check_fits(const LayerConfig&) const override { return ""; }
  bool failed() const override { return false; }

 private:
  Communicator& comm_;
  LayerConfig capacity_ = base_config();
};

// The collective creations: MoeLayer::create with each impl and with a workspace, Workspace::create.
struct Creation {
  const char* what;
  Impl impl;
  Call create;
};
std::vector<Creation> collective_creations() {
  static bf16 weight;  // never read: these tests stop every creation before it looks at the weights
  static const ExpertWeights weights{&weight, &weight};
  const auto layer = [](Communicator& comm, const LayerConfig& cfg, Impl impl) {
    MoeLayer::create(impl, cfg, comm, weights);
  };
  return {
      {"MoeLayer::create", Impl::kUnfused, layer},
      {"MoeLayer::create", Impl::kFused, layer},
      {"MoeLayer::create", Impl::kFused,
       [](Communicator& comm, const LayerConfig& cfg, Impl) {
         CommOnlyWorkspace workspace(comm);
         MoeLayer::create(cfg, workspace, weights);
       }},
      {"Workspace::create", Impl::kFused,
       [](Communicator& comm, const LayerConfig& cfg, Impl) { Workspace::create(comm, cfg); }},
  };
}

// Each collective creation agrees first: with one rank's hidden size different, every rank throws the
// agreement's error from the creation itself. Without a GPU a creation that skipped the agreement
// would fail in CUDA instead (or, across ranks, in alloc_symmetric's size check).
TEST(Agreement, EveryCollectiveCreationAgreesFirst) {
  for (const Creation& c : collective_creations()) {
    SCOPED_TRACE(std::string(c.what) + ", impl " + std::string(to_string(c.impl)));
    const auto outcomes = agree(
        2,
        [&](int rank, LayerConfig& cfg, Impl& impl) {
          impl = c.impl;
          if (rank == 1) cfg.hidden = 512;
        },
        c.create);
    expect_every_rank_throws(outcomes, std::string(c.what) + ": ranks disagree on hidden: " + listing(2, 1, "256", "512"));
  }
}

// FP8 weights agreed on by every rank at a size the fused FP8 tile does not fit: hidden 384 is no
// multiple of its 256, so the fused layer runs it padded to 512 (padding.h) and the unfused chain runs
// it as it is; no implementation refuses it (a refusal, as before padding came, was kUnsupported naming
// "hidden % 256" before any CUDA call). Each creation must go past every size decision and end in an
// outcome of a creation that went on:
//  - fused: created (Workspace::create where there is a GPU), the padded step's first CUDA call failing
//    (no GPU here: kCuda), or, with a GPU, the FP8 weight check refusing the test's null codes
//    (kInvalidArgument naming them); a peer of a failed rank may report it (kAborted naming it);
//  - unfused: the loopback world's refusal (make_unfused_layer's first statement, after the sizes were
//    decided): kUnsupported "unsupported in one-GPU mode", exactly.
// Any other outcome, a refusal of the size among them, fails the test.
TEST(Agreement, Fp8CreationIsNotRefusedWhereTheTileDoesNotFit) {
  LayerConfig probe = base_config();
  probe.weight_format = WeightFormat::kFp8Block128;
  probe.hidden = 384;
  ASSERT_TRUE(padding::needs_padding(probe, Impl::kFused));
  EXPECT_EQ(padding::padded_config(probe, Impl::kFused).hidden, 512);
  EXPECT_FALSE(padding::needs_padding(probe, Impl::kUnfused));
  const std::string null_codes = "FP8 weights (weight_format=fp8-block128) need w13_fp8, w2_fp8, w13_scales and w2_scales";
  for (const Creation& c : collective_creations()) {
    for (ScaleFormat scales : {ScaleFormat::kFp32, ScaleFormat::kUe8m0}) {
      SCOPED_TRACE(std::string(c.what) + ", impl " + std::string(to_string(c.impl)) + ", scales " +
                   std::string(to_string(scales)));
      const auto outcomes = agree(
          2,
          [&](int, LayerConfig& cfg, Impl& impl) {
            impl = c.impl;
            cfg.weight_format = WeightFormat::kFp8Block128;
            cfg.scale_format = scales;
            cfg.hidden = 384;
          },
          c.create);
      for (size_t r = 0; r < outcomes.size(); ++r) {
        const Outcome& o = outcomes[r];
        SCOPED_TRACE("rank " + std::to_string(r) + ": " + (o.thrown ? o.what : std::string("created")));
        if (c.impl == Impl::kUnfused) {
          ASSERT_TRUE(o.thrown);
          EXPECT_EQ(o.code, ErrorCode::kUnsupported);
          EXPECT_EQ(o.what, "rank " + std::to_string(r) +
                                ": the unfused implementation is unsupported in one-GPU mode (its all-to-alls are "
                                "NCCL collectives, which need one GPU per rank)");
          continue;
        }
        const bool went_on = !o.thrown || o.code == ErrorCode::kCuda ||
                             (o.code == ErrorCode::kInvalidArgument && o.what.find(null_codes) != std::string::npos) ||
                             (o.code == ErrorCode::kAborted && o.what.find(" failed: ") != std::string::npos);
        EXPECT_TRUE(went_on) << "code " << static_cast<int>(o.code);
      }
    }
  }
}

}  // namespace
}  // namespace epfuse
