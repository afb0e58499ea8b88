// What hardware is present: the CPU always, a CUDA GPU when the build has CUDA and a device is visible.
// Properties are queried at run time, never hard-coded (SM count, shared memory, L2 differ per card).
#pragma once
#include <optional>
#include <string>

namespace mp {

struct GpuInfo {
  std::string name;
  int device = 0;
  int sm_count = 0;
  int cc_major = 0, cc_minor = 0;
  size_t smem_per_sm = 0;        // bytes of shared memory per SM
  size_t smem_per_block_optin = 0;  // bytes a block may opt in to
  size_t l2_bytes = 0;
  size_t global_mem_bytes = 0;
  int clock_khz = 0;
};

bool built_with_cuda();
// The first CUDA device, or nullopt (no CUDA in the build, no driver, or no device). Never throws.
std::optional<GpuInfo> query_gpu();
// Why query_gpu() returned nullopt, in one line (e.g. "built without CUDA", "no CUDA device").
std::string gpu_absent_reason();
// True when the GPU is a Hopper part (sm_90) that can run this build's sm_90a kernels.
bool gpu_is_hopper(const GpuInfo& g);

}  // namespace mp
