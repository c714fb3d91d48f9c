// generate_expert_weights on the GPU against weight_w13 / weight_w2 on the host, bit for bit.
#include <cstdio>
#include <cstring>
#include <vector>

#include <gtest/gtest.h>

#include "common/check.h"
#include "common/device_buffer.h"
#include "epfuse/error.h"
#include "epfuse/inputs.h"

namespace epfuse {
namespace {

// Device buffers are freed on scope exit (tests may fail half-way).
using DeviceBuffer = detail::DeviceArray<bf16>;

// Generates rank `rank`'s experts on the GPU (buffers poisoned first) and compares every element.
void expect_generated_matches_host(const LayerConfig& cfg, int world, int rank, uint64_t seed) {
  const int local = cfg.experts_per_rank(world), H = cfg.hidden, I = cfg.intermediate;
  const size_t n13 = static_cast<size_t>(local) * 2 * I * H, n2 = static_cast<size_t>(local) * H * I;
  DeviceBuffer w13(n13), w2(n2);
  EPFUSE_CUDA_CHECK(cudaMemset(w13.get(), 0xff, n13 * sizeof(bf16)));  // NaN pattern: unwritten shows
  EPFUSE_CUDA_CHECK(cudaMemset(w2.get(), 0xff, n2 * sizeof(bf16)));
  generate_expert_weights(cfg, world, rank, seed, w13.get(), w2.get(), nullptr);
  EPFUSE_CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<bf16> got13(n13), got2(n2);
  EPFUSE_CUDA_CHECK(cudaMemcpy(got13.data(), w13.get(), n13 * sizeof(bf16), cudaMemcpyDeviceToHost));
  EPFUSE_CUDA_CHECK(cudaMemcpy(got2.data(), w2.get(), n2 * sizeof(bf16), cudaMemcpyDeviceToHost));

  size_t mismatches = 0;
  auto compare = [&](bf16 got, bf16 want, const char* tensor, int e, int r, int c) {
    if (__bfloat16_as_ushort(got) == __bfloat16_as_ushort(want)) return;
    if (++mismatches <= 5)
      ADD_FAILURE() << tensor << "[expert " << e << "][" << r << "][" << c << "]: GPU 0x" << std::hex
                    << __bfloat16_as_ushort(got) << ", host 0x" << __bfloat16_as_ushort(want) << std::dec;
  };
  for (int l = 0; l < local; ++l) {
    const int e = rank * local + l;
    for (int r = 0; r < 2 * I; ++r)
      for (int c = 0; c < H; ++c)
        compare(got13[(static_cast<size_t>(l) * 2 * I + r) * H + c], weight_w13(cfg, seed, e, r, c), "w13", e, r, c);
    for (int r = 0; r < H; ++r)
      for (int c = 0; c < I; ++c)
        compare(got2[(static_cast<size_t>(l) * H + r) * I + c], weight_w2(cfg, seed, e, r, c), "w2", e, r, c);
  }
  EXPECT_EQ(mismatches, 0u) << "of " << n13 + n2 << " elements";
}

LayerConfig small_config() {
  LayerConfig cfg;
  cfg.hidden = 256;
  cfg.intermediate = 128;
  cfg.num_experts = 8;
  cfg.topk = 2;
  cfg.max_tokens_per_rank = 64;
  return cfg;
}

TEST(GpuGenerator, BitIdenticalToHostRank1Of2) { expect_generated_matches_host(small_config(), 2, 1, 1234); }

TEST(GpuGenerator, BitIdenticalToHostOtherShapesAndSeeds) {
  LayerConfig cfg = small_config();
  cfg.hidden = 384;
  cfg.intermediate = 640;
  cfg.num_experts = 12;
  expect_generated_matches_host(cfg, 4, 3, 0);
  expect_generated_matches_host(cfg, 1, 0, ~0ULL);
}

TEST(GpuGenerator, RejectsBadArguments) {
  const LayerConfig cfg = small_config();
  DeviceBuffer w13(8 * 256 * 256), w2(8 * 256 * 128);
  EXPECT_THROW(generate_expert_weights(cfg, 2, 2, 1, w13.get(), w2.get(), nullptr), Error);
  EXPECT_THROW(generate_expert_weights(cfg, 2, 0, 1, nullptr, w2.get(), nullptr), Error);
  EXPECT_THROW(generate_expert_weights(cfg, 2, 0, 1, w13.get() + 1, w2.get(), nullptr), Error);  // not 16-byte aligned
  LayerConfig bad = cfg;
  bad.hidden = 200;
  EXPECT_THROW(generate_expert_weights(bad, 2, 0, 1, w13.get(), w2.get(), nullptr), Error);
}

}  // namespace
}  // namespace epfuse

int main(int argc, char** argv) {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess) devices = 0;  // no driver: no GPU
  if (devices < 1) {
    std::printf("SKIPPED: needs 1 GPU, found %d\n", devices);
    return 77;
  }
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
