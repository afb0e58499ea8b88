// The run time of a build without CUDA: nothing can run, and saying so is the whole job.
#include "backends/cuda/lower/runtime.h"

namespace mp::cuda {

bool available(std::string* why) {
  if (why) *why = "metapipe was built without CUDA (configured without nvcc or with MP_ENABLE_CUDA=OFF)";
  return false;
}

std::string compile_sm90a(const std::string&) {
  fail_user("no CUDA toolkit: metapipe was built without CUDA, so NVRTC is not available");
}

RunReport run(const ir::Program&, ir::Memory&, const RunOptions&) {
  fail_user("no CUDA GPU: metapipe was built without CUDA; rebuild with the CUDA toolkit (cmake --preset default) "
            "on a machine with an sm_90 GPU, or use --target cpu");
}

}  // namespace mp::cuda
