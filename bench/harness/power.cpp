#include "bench/harness/power.h"

#include <dlfcn.h>

namespace mp {
namespace {
// The few NVML entry points used, declared here (the ABI of nvml.h: an int return code, 0 = success; an
// opaque device handle).
using nvml_init_t = int (*)();
using nvml_by_bus_t = int (*)(const char*, void**);
using nvml_energy_t = int (*)(void*, unsigned long long*);
using nvml_clock_t = int (*)(void*, int, unsigned*);
constexpr int nvml_clock_sm = 1;  // NVML_CLOCK_SM

struct Nvml {
  nvml_by_bus_t by_bus = nullptr;
  nvml_energy_t energy = nullptr;
  nvml_clock_t clock = nullptr;
  std::string error;
};
const Nvml& nvml() {
  static const Nvml lib = [] {
    Nvml n;
    void* h = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!h) {
      n.error = "NVML (libnvidia-ml.so.1) not found";
      return n;
    }
    auto init = reinterpret_cast<nvml_init_t>(dlsym(h, "nvmlInit_v2"));
    n.by_bus = reinterpret_cast<nvml_by_bus_t>(dlsym(h, "nvmlDeviceGetHandleByPciBusId_v2"));
    n.energy = reinterpret_cast<nvml_energy_t>(dlsym(h, "nvmlDeviceGetTotalEnergyConsumption"));
    n.clock = reinterpret_cast<nvml_clock_t>(dlsym(h, "nvmlDeviceGetClockInfo"));
    if (!init || !n.by_bus || !n.energy || !n.clock) {
      n = {};
      n.error = "NVML lacks an entry point this probe uses";
    } else if (init() != 0) {
      n = {};
      n.error = "nvmlInit failed";
    }
    return n;
  }();
  return lib;
}
}  // namespace

PowerProbe::PowerProbe(const std::string& pci_bus_id) {
  const Nvml& n = nvml();
  if (!n.by_bus) {
    why_ = n.error;
    return;
  }
  void* d = nullptr;
  if (n.by_bus(pci_bus_id.c_str(), &d) != 0 || !d) {
    why_ = "NVML does not know the GPU at PCI bus id " + pci_bus_id;
    return;
  }
  unsigned long long mj = 0;
  if (n.energy(d, &mj) != 0) {
    why_ = "this GPU's energy counter cannot be read through NVML";
    return;
  }
  dev_ = d;
}

std::optional<double> PowerProbe::energy_mj() const {
  unsigned long long mj = 0;
  if (!dev_ || nvml().energy(dev_, &mj) != 0) return std::nullopt;
  return double(mj);
}

std::optional<unsigned> PowerProbe::sm_clock_mhz() const {
  unsigned mhz = 0;
  if (!dev_ || nvml().clock(dev_, nvml_clock_sm, &mhz) != 0) return std::nullopt;
  return mhz;
}

}  // namespace mp
