// Run-time device queries through the CUDA runtime (when the build has CUDA).
#include "core/device.h"

#ifdef MP_HAVE_CUDA
#include <cuda_runtime.h>
#endif

namespace mp {

bool built_with_cuda() {
#ifdef MP_HAVE_CUDA
  return true;
#else
  return false;
#endif
}

std::string gpu_absent_reason() {
#ifdef MP_HAVE_CUDA
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e == cudaErrorNoDevice || e == cudaErrorInsufficientDriver)
    return std::string("no CUDA GPU on this machine (") + cudaGetErrorString(e) + ")";
  if (e != cudaSuccess) return std::string("no usable CUDA device (") + cudaGetErrorString(e) + ")";
  if (n == 0) return "no CUDA device";
  return "";
#else
  return "built without CUDA (nvcc was not found at configure time)";
#endif
}

std::optional<GpuInfo> query_gpu() {
#ifdef MP_HAVE_CUDA
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
    cudaGetLastError();  // clear the sticky "no device" error
    return std::nullopt;
  }
  cudaDeviceProp p{};
  if (cudaGetDeviceProperties(&p, 0) != cudaSuccess) return std::nullopt;
  GpuInfo g;
  g.name = p.name;
  g.device = 0;
  g.sm_count = p.multiProcessorCount;
  g.cc_major = p.major;
  g.cc_minor = p.minor;
  g.smem_per_sm = p.sharedMemPerMultiprocessor;
  g.smem_per_block_optin = p.sharedMemPerBlockOptin;
  g.l2_bytes = p.l2CacheSize;
  g.global_mem_bytes = p.totalGlobalMem;
  int clk = 0;
  cudaDeviceGetAttribute(&clk, cudaDevAttrClockRate, 0);
  g.clock_khz = clk;
  return g;
#else
  return std::nullopt;
#endif
}

bool gpu_is_hopper(const GpuInfo& g) { return g.cc_major == 9 && g.cc_minor == 0; }

}  // namespace mp
