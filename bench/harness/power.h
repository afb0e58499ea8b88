// The GPU's energy counter and SM clock, read through NVML (the driver's management library), for
// measurements taken at the card's power cap: there the clock follows the power drawn, so two kernels
// doing the same work can run at different clocks, and energy per launch says why. NVML is loaded at run
// time (dlopen of libnvidia-ml.so.1, which ships with the driver), so the build needs no NVML headers
// and machines without it (CI) simply report the probe as absent.
#pragma once
#include <optional>
#include <string>

namespace mp {

class PowerProbe {
 public:
  // The probe for the GPU with this PCI bus id ("0000:17:00.0", as cudaDeviceGetPCIBusId writes it).
  // Never throws; available() is false (and why() says why) without NVML or that GPU.
  explicit PowerProbe(const std::string& pci_bus_id);
  bool available() const { return dev_ != nullptr; }
  const std::string& why() const { return why_; }
  // Energy used by the GPU since the driver loaded, mJ (nullopt if the read fails). The counter advances
  // in steps, so differences are meaningful over tens of milliseconds and more.
  std::optional<double> energy_mj() const;
  // The SM clock now, MHz (nullopt if the read fails).
  std::optional<unsigned> sm_clock_mhz() const;

 private:
  void* dev_ = nullptr;
  std::string why_;
};

}  // namespace mp
