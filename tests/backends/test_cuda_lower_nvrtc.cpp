// NVRTC (what `--target cuda` compiles with) accepts the lowered unit of every registered program for
// sm_90a; needs the CUDA toolkit, not a GPU.
#include <gtest/gtest.h>

#include "backends/cuda/lower/lower.h"
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

// The speed variants of the streaming programs (docs/cuda-lowering.md, "Speed") compile too: the ring
// off with 256 threads and nothing fused, and the deepest rings.
TEST(CudaLowerNvrtc, SpeedVariantsCompileForSm90a) {
  cuda::LowerOptions plain, deep;
  cuda::set_ring_option(plain, "off");
  plain.threads = 256;
  plain.fuse_elementwise = false;
  cuda::set_ring_option(deep, "4096");
  for (const char* name : {"dotproduct", "tpchq6", "blackscholes", "softmax", "outerproduct"}) {
    auto& spec = examples::find_program(name);
    auto params = examples::resolve(spec, {});
    auto p = passes::compile(examples::build(spec, params), examples::compile_options(params));
    for (auto* o : {&plain, &deep}) {
      SCOPED_TRACE(std::string(name) +
                   (o == &plain ? " (ring off, 256 threads, no fusion)" : " (deepest ring)"));
      std::string bin = cuda::compile_sm90a(cuda::lower(p, *o).source);
      EXPECT_EQ(bin.substr(0, 4), std::string("\x7f"
                                              "ELF"))
          << "not a cubin";
    }
  }
}

}  // namespace
}  // namespace mp
