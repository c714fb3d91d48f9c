"""NVML's total energy counter of the GPU that PyTorch's device 0 is, read through ctypes (libnvidia-ml.so.1
comes with the driver): joules per launch of a kernel run back to back at the board's power limit, the
measure that counts where the clocks follow the power (docs/performance.md#power-cap-and-energy). Shared by
deepgemm_sustained.py and deepgemm_tile_shape.py (back_to_back); tools/bench/energy.cpp is the C++ side of the same counter."""
import ctypes

import torch


class Energy:
    """NVML's total energy counter of the first visible GPU (mJ since the driver loaded); NaN without one."""

    def __init__(self):
        self.lib = None
        try:
            lib = ctypes.CDLL("libnvidia-ml.so.1")
            if lib.nvmlInit_v2() != 0:
                raise RuntimeError("nvmlInit_v2 failed")
            # The CUDA device's PCI address (NVML's indices ignore CUDA_VISIBLE_DEVICES); index 0 without one.
            props = torch.cuda.get_device_properties(0)
            self.dev = ctypes.c_void_p()
            if all(hasattr(props, k) for k in ("pci_domain_id", "pci_bus_id", "pci_device_id")):
                bus = f"{props.pci_domain_id:08x}:{props.pci_bus_id:02x}:{props.pci_device_id:02x}.0"
                rc = lib.nvmlDeviceGetHandleByPciBusId_v2(bus.encode(), ctypes.byref(self.dev))
            else:
                rc = lib.nvmlDeviceGetHandleByIndex_v2(0, ctypes.byref(self.dev))
            if rc != 0:
                raise RuntimeError(f"no NVML handle (rc {rc})")
            self.lib = lib
        except Exception as e:  # noqa: BLE001 - the times are still worth printing
            print(f"no energy counter: {e}", flush=True)

    def joules(self):
        if self.lib is None:
            return float("nan")
        mj = ctypes.c_ulonglong()
        if self.lib.nvmlDeviceGetTotalEnergyConsumption(self.dev, ctypes.byref(mj)) != 0:
            return float("nan")
        return mj.value * 1e-3


def back_to_back(fn, iters):
    """fn() launched iters times with no sync between, timed by CUDA events with the energy counter read
    before and after: (ms a launch, joules a launch; NaN without a counter)."""
    meter = Energy()
    torch.cuda.synchronize()
    s, e = torch.cuda.Event(True), torch.cuda.Event(True)
    j0 = meter.joules()
    s.record()
    for _ in range(iters):
        fn()
    e.record()
    torch.cuda.synchronize()
    j1 = meter.joules()
    return s.elapsed_time(e) / iters, (j1 - j0) / iters
