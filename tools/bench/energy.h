// The GPU's energy counter (NVML's total energy since the driver loaded), for `epfuse bench
// --sustained`: on the compute-bound rows the board runs at its power limit (docs/performance.md#power-cap-and-energy,
// 2026-11-27), so energy per call is what a kernel change must lower there, and times alone
// move inside the power controller's noise. NVML is loaded at run time (libnvidia-ml.so.1 comes with
// the driver, not the toolkit), so the tool still starts where there is none.
#pragma once
#include <memory>
#include <optional>
#include <string>

namespace epfuse::bench {

class EnergyCounter {
 public:
  // The counter of CUDA device `cuda_device`; nullptr, with `why` set, when NVML or the counter is
  // not available (no driver library, an old GPU, no permission).
  static std::unique_ptr<EnergyCounter> open(int cuda_device, std::string* why);
  ~EnergyCounter();
  EnergyCounter(const EnergyCounter&) = delete;
  EnergyCounter& operator=(const EnergyCounter&) = delete;

  // Joules since the driver loaded; nullopt when the read fails.
  std::optional<double> joules() const;

 private:
  struct Api;
  EnergyCounter(std::unique_ptr<Api> api, void* device);
  std::unique_ptr<Api> api_;
  void* device_;
};

}  // namespace epfuse::bench
