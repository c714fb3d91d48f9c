// Prints the model shapes epfuse knows and whether each runs on 4 ranks, through the public API.
#include <cstdio>
#include <string>

#include <epfuse/epfuse.h>

int main() {
  int failures = 0;
  for (const epfuse::ModelShape& m : epfuse::model_shapes()) {
    epfuse::LayerConfig cfg = epfuse::make_config(m, 128);
    std::string why = epfuse::check_config(cfg, 4);
    std::printf("consumer: %.*s: hidden=%d intermediate=%d experts=%d topk=%d: %s\n",
                static_cast<int>(m.name.size()), m.name.data(), cfg.hidden, cfg.intermediate, cfg.num_experts,
                cfg.topk, why.empty() ? "valid on 4 ranks" : why.c_str());
    failures += !why.empty();
  }
  // A config that must be rejected, to show the check is live.
  epfuse::LayerConfig bad = epfuse::make_config(*epfuse::find_model("qwen3-30b"), 128);
  bad.hidden = 100;
  if (epfuse::check_config(bad, 4).empty()) {
    std::printf("consumer: hidden=100 was accepted\n");
    return 1;
  }
  return failures == 0 ? 0 : 1;
}
