#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include "epfuse/inputs.h"
#include "epfuse/reference.h"
#include "epfuse/config.h"
extern double g_eps; extern std::mt19937_64 g_rng;
using namespace epfuse;
int main(int argc, char** argv) {
  LayerConfig cfg; cfg.hidden=256; cfg.intermediate=384; cfg.num_experts=16; cfg.topk=4; cfg.max_tokens_per_rank=128;
  cfg.weight_format=WeightFormat::kFp8Block128; cfg.scale_format = atoi(argv[1]) ? ScaleFormat::kUe8m0 : ScaleFormat::kFp32;
  int world = atoi(argv[2]), rank = atoi(argv[3]), T = atoi(argv[4]); uint64_t seed = atoll(argv[5]); double eps = atof(argv[6]);
  HostTokens in = make_tokens(cfg, world, rank, T, Routing::kUniform, seed);
  GeneratedExperts ex(cfg, 42);
  g_eps = 0; auto want = reference_forward(cfg, in, ex);
  for (int trial = 0; trial < 5; ++trial) {
    g_eps = eps; g_rng.seed(trial + 1); auto got = reference_forward(cfg, in, ex);
    printf("trial %d rows:", trial);
    for (int t = 0; t < T; ++t) { double n=0,d=0; for (int c=0;c<cfg.hidden;++c){double e=got[t*cfg.hidden+c]-want[t*cfg.hidden+c]; n+=e*e; d+=want[t*cfg.hidden+c]*want[t*cfg.hidden+c];} printf(" %.2e", std::sqrt(n/d)); }
    printf("\n");
  }
}
