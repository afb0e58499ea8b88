// NVRTC (what `--target cuda` compiles with) accepts the lowered unit of every registered program for
// sm_90a; needs the CUDA toolkit, not a GPU.
#include <gtest/gtest.h>

#include "backends/cuda/lower/runtime.h"
#include "examples/registry.h"

namespace mp {
namespace {

TEST(CudaLowerNvrtc, EveryProgramCompilesForSm90a) {
  ASSERT_FALSE(examples::programs().empty());
  for (auto* spec : examples::programs()) {
    SCOPED_TRACE(spec->name);
    auto params = examples::resolve(*spec, {});
    auto p = passes::compile(examples::build(*spec, params), examples::compile_options(params));
    std::string bin = cuda::compile_sm90a(cuda::lower(p).source);
    ASSERT_GT(bin.size(), 4u);
    EXPECT_EQ(bin.substr(0, 4), std::string("\x7f" "ELF")) << "not a cubin";
  }
}

}  // namespace
}  // namespace mp
