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

// The bf16 matmul lowered onto the tile layer (the unit includes its headers: NVRTC gets the repository
// root and libcu++'s standard headers) at each tile shape.
TEST(CudaLowerNvrtc, MatmulOnTheTileLayerCompilesForSm90a) {
  auto& spec = examples::find_program("matmul");
  for (auto tiles : std::vector<std::vector<std::string>>{{"MM=128", "NN=256"}, {"MM=64", "NN=64"}, {"MM=128", "NN=128"}}) {
    SCOPED_TRACE(tiles[0] + " " + tiles[1]);
    tiles.insert(tiles.end(), {"dtype=bf16", "M=512", "N=512", "K=512"});
    auto params = examples::resolve(spec, tiles);
    auto low = cuda::lower(passes::compile(examples::build(spec, params), examples::compile_options(params)));
    ASSERT_TRUE(low.uses_tile_layer);
    std::string bin = cuda::compile_sm90a(low.source);
    EXPECT_EQ(bin.substr(0, 4), std::string("\x7f" "ELF")) << "not a cubin";
  }
  auto& gemm = examples::find_program("gemm");  // the blocked form
  auto params = examples::resolve(gemm, {"dtype=bf16", "M=512", "N=512", "K=512", "MM=128", "NN=128", "KK=64"});
  auto low = cuda::lower(passes::compile(examples::build(gemm, params), examples::compile_options(params)));
  ASSERT_TRUE(low.uses_tile_layer);
  EXPECT_EQ(cuda::compile_sm90a(low.source).substr(0, 4), std::string("\x7f" "ELF")) << "not a cubin";
}

// The bf16 flash_attention statement on the tile layer's attention pipeline, at each head dimension and
// tile shape it takes, with the causal mask and dropout and without.
TEST(CudaLowerNvrtc, FlashAttentionOnTheTileLayerCompilesForSm90a) {
  auto& spec = examples::find_program("flash_attention");
  for (auto sets : std::vector<std::vector<std::string>>{{"S=4096", "D=128", "BR=128", "BC=128", "causal=0", "p_drop=0"},
                                                         {"S=1000", "D=64", "BR=64", "BC=64", "causal=1", "p_drop=0.1"},
                                                         {"S=1000", "D=256", "BR=128", "BC=64", "causal=1", "p_drop=0"}}) {
    SCOPED_TRACE(sets[1] + " " + sets[2] + " " + sets[3]);
    sets.insert(sets.end(), {"dtype=bf16", "mask=1"});
    auto params = examples::resolve(spec, sets);
    auto low = cuda::lower(passes::compile(examples::build(spec, params), examples::compile_options(params)));
    ASSERT_TRUE(low.uses_tile_layer);
    std::string bin = cuda::compile_sm90a(low.source);
    EXPECT_EQ(bin.substr(0, 4), std::string("\x7f" "ELF")) << "not a cubin";
  }
}

// The speed variants of the streaming programs (docs/cuda-lowering.md, "Speed") compile too: the ring
// off with 256 threads and nothing fused, the deepest rings, and the rings of bulk copies (TMA) at the
// default depth and the deepest with two barriers per iteration.
TEST(CudaLowerNvrtc, SpeedVariantsCompileForSm90a) {
  cuda::LowerOptions plain, deep, bulk, bulk_deep;
  cuda::set_ring_option(plain, "off");
  plain.threads = 256;
  plain.fuse_elementwise = false;
  cuda::set_ring_option(deep, "4096");
  cuda::set_copy_option(plain, "cp");
  cuda::set_copy_option(deep, "cp");
  cuda::set_copy_option(bulk, "bulk");
  cuda::set_copy_option(bulk_deep, "bulk");
  cuda::set_ring_option(bulk_deep, "4096");
  bulk_deep.one_barrier_ring = false;
  // (softmax's tile path with the rings; its rows in registers are the default, compiled above and by
  // `deep`; `plain` has 4-byte stores)
  bulk.warp_rows = bulk_deep.warp_rows = plain.warp_rows = false;
  plain.vector_stores = plain.prefetch = false;
  const std::vector<std::pair<const cuda::LowerOptions*, const char*>> variants = {
      {&plain, " (ring off, 256 threads, no fusion)"},
      {&deep, " (deepest ring)"},
      {&bulk, " (bulk copies)"},
      {&bulk_deep, " (bulk copies, deepest ring, 2 barriers)"}};
  for (const char* name : {"dotproduct", "tpchq6", "blackscholes", "softmax", "outerproduct"}) {
    auto& spec = examples::find_program(name);
    auto params = examples::resolve(spec, {});
    auto p = passes::compile(examples::build(spec, params), examples::compile_options(params));
    for (auto& [o, label] : variants) {
      SCOPED_TRACE(std::string(name) + label);
      std::string src = cuda::lower(p, *o).source;
      if (o->copy == cuda::LowerOptions::Copy::Bulk) {
        EXPECT_NE(src.find("// path: tile ring (bulk copies (TMA))"), std::string::npos);
      }
      std::string bin = cuda::compile_sm90a(src);
      EXPECT_EQ(bin.substr(0, 4), std::string("\x7f"
                                              "ELF"))
          << "not a cubin";
    }
  }
}

}  // namespace
}  // namespace mp
