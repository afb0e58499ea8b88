// The GPU engine's entry points in a build without CUDA: they say so (the schedule builder, which needs
// no GPU, is in llama_schedule.cpp and works in every build).
#include "backends/cuda/llama_gpu.h"
#include "core/error.h"

namespace mp::cuda {

std::unique_ptr<LlamaGpu> LlamaGpu::create(const LlamaGpuShapes& s, const WeightBindings&,
                                           const LlamaGpuOptions&) {
  s.check();
  throw not_supported("the GPU engine in a build without CUDA (nvcc was not found at configure time)");
}

std::unique_ptr<LlamaGpu> LlamaGpu::random(const LlamaGpuShapes& s, const LlamaGpuOptions&, uint64_t) {
  s.check();
  throw not_supported("the GPU engine in a build without CUDA (nvcc was not found at configure time)");
}

int visible_gpus() { return 0; }
bool have_nccl() { return false; }

}  // namespace mp::cuda
