#include "bench/energy.h"

#include <dlfcn.h>

#include <cuda_runtime.h>

namespace epfuse::bench {

// The four NVML entry points used, by their C signatures (nvml.h: nvmlReturn_t is an int enum,
// 0 = NVML_SUCCESS; nvmlDevice_t an opaque pointer). No NVML header is on the build machines.
struct EnergyCounter::Api {
  void* lib = nullptr;
  int (*init)() = nullptr;
  int (*shutdown)() = nullptr;
  int (*by_pci_bus_id)(const char*, void**) = nullptr;
  int (*total_energy)(void*, unsigned long long*) = nullptr;  // millijoules
  ~Api() {
    if (shutdown) shutdown();
    if (lib) dlclose(lib);
  }
};

std::unique_ptr<EnergyCounter> EnergyCounter::open(int cuda_device, std::string* why) {
  auto api = std::make_unique<Api>();
  api->lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!api->lib) {
    *why = "no libnvidia-ml.so.1";
    return nullptr;
  }
  auto sym = [&](const char* name) { return dlsym(api->lib, name); };
  auto init = reinterpret_cast<int (*)()>(sym("nvmlInit_v2"));
  api->by_pci_bus_id = reinterpret_cast<int (*)(const char*, void**)>(sym("nvmlDeviceGetHandleByPciBusId_v2"));
  api->total_energy = reinterpret_cast<int (*)(void*, unsigned long long*)>(sym("nvmlDeviceGetTotalEnergyConsumption"));
  auto shutdown = reinterpret_cast<int (*)()>(sym("nvmlShutdown"));
  if (!init || !api->by_pci_bus_id || !api->total_energy || !shutdown) {
    *why = "libnvidia-ml.so.1 lacks an entry point";
    return nullptr;
  }
  if (int rc = init(); rc != 0) {
    *why = "nvmlInit_v2 returned " + std::to_string(rc);
    return nullptr;
  }
  api->shutdown = shutdown;  // from here on ~Api shuts NVML down
  char bus_id[32];
  if (cudaDeviceGetPCIBusId(bus_id, sizeof(bus_id), cuda_device) != cudaSuccess) {
    *why = "cudaDeviceGetPCIBusId failed for device " + std::to_string(cuda_device);
    return nullptr;
  }
  void* device = nullptr;
  if (int rc = api->by_pci_bus_id(bus_id, &device); rc != 0) {
    *why = "nvmlDeviceGetHandleByPciBusId_v2(" + std::string(bus_id) + ") returned " + std::to_string(rc);
    return nullptr;
  }
  std::unique_ptr<EnergyCounter> counter(new EnergyCounter(std::move(api), device));
  if (!counter->joules()) {
    *why = "nvmlDeviceGetTotalEnergyConsumption is not supported on " + std::string(bus_id);
    return nullptr;
  }
  return counter;
}

EnergyCounter::EnergyCounter(std::unique_ptr<Api> api, void* device) : api_(std::move(api)), device_(device) {}
EnergyCounter::~EnergyCounter() = default;

std::optional<double> EnergyCounter::joules() const {
  unsigned long long mj = 0;
  if (api_->total_energy(device_, &mj) != 0) return std::nullopt;
  return static_cast<double>(mj) * 1e-3;
}

}  // namespace epfuse::bench
