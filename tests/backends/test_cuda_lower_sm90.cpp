// Every registered program lowered onto the GPU (NVRTC, driver API) and checked against the reference
// interpreter on fresh random inputs, outputs poisoned with NaN first, with the tolerance of the
// program's output dtype; at the host test's sizes (masked tiles included) and at the defaults.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>

#include "backends/cpu/interpreter.h"
#include "backends/cuda/lower/runtime.h"
#include "core/random.h"
#include "examples/run.h"
#include "front/front.h"
#include "tests/backends/cuda_lower_cases.h"

namespace mp {
namespace {

// GTEST_SKIP returns from the function it is written in: a macro, so that is the test body.
#define MP_REQUIRE_GPU()                                                         \
  do {                                                                           \
    std::string why_;                                                            \
    if (!cuda::available(&why_)) GTEST_SKIP() << "no usable CUDA GPU: " << why_; \
  } while (0)

// Fails the test on a mismatch of any output.
void check_program(const examples::ProgramSpec& spec, const std::vector<std::string>& sets, uint64_t seed,
                   const cuda::RunOptions& opt = {}) {
  SCOPED_TRACE(spec.name + " seed " + std::to_string(seed));
  auto params = examples::resolve(spec, sets);
  ir::Program p = examples::build(spec, params);
  ir::Program c = passes::compile(p, examples::compile_options(params));
  auto in = examples::make_inputs(spec, params, p, seed);
  ir::Memory want = ir::make_memory(c, in), got = ir::make_memory(c, in);  // outputs NaN-poisoned
  cpu::interpret(c, want);
  cuda::RunReport rep = cuda::run(c, got, opt);
  EXPECT_EQ(rep.kernels.size(), c.body.size());
  double rtol = examples::output_tolerance(p);
  auto mags = examples::magnitudes_of(spec, params, in);
  int checked = 0;
  for (auto& t : c.tensors) {
    if (t->role != ir::TensorRole::Output && t->role != ir::TensorRole::InOut) continue;
    std::vector<double> w(want.at(t->name).data.begin(), want.at(t->name).data.end());
    auto cmp = compare(got.at(t->name).data, w, rtol, examples::check_atol(t->name, w, mags, rtol));
    EXPECT_TRUE(cmp.ok) << t->name << ": " << cmp.summary();
    ++checked;
  }
  EXPECT_GT(checked, 0);
}

TEST(SM90_CudaLower, EveryProgramAtTestSizes) {
  MP_REQUIRE_GPU();
  uint64_t seed = fresh_seed() % 1000000;
  for (auto* spec : examples::programs()) {
    auto it = cuda_test::small_sets().find(spec->name);
    check_program(*spec, it == cuda_test::small_sets().end() ? std::vector<std::string>{} : it->second, seed++);
  }
}

TEST(SM90_CudaLower, EveryProgramAtDefaults) {
  MP_REQUIRE_GPU();
  uint64_t seed = fresh_seed() % 1000000;
  for (auto* spec : examples::programs()) check_program(*spec, {}, seed++);
}

TEST(SM90_CudaLower, Bf16Programs) {
  MP_REQUIRE_GPU();
  uint64_t seed = fresh_seed() % 1000000;
  check_program(examples::find_program("matmul"), {"dtype=bf16"}, seed);
  check_program(examples::find_program("softmax"), {"dtype=bf16", "R=100", "C=64", "mask=1", "row_tile=32"},
                seed + 1);
}

// The slide-51 matmul in bf16 through the tile layer's pipeline (TMA ring, wgmma consumers, TMA-store
// finish): partial tiles in M, N and K (TMA's zero fill and clipped stores), one and two consumer
// warpgroups, every wgmma width, more tiles than SMs (a block's items wrap around the ring's phases), and
// a single tile (loops of one iteration); and the gemm program's blocked form.
TEST(SM90_CudaLower, MatmulOnWgmma) {
  MP_REQUIRE_GPU();
  uint64_t seed = fresh_seed() % 1000000;
  auto& spec = examples::find_program("matmul");
  const std::vector<std::vector<std::string>> cases = {
      {"M=300", "N=520", "K=200", "MM=128", "NN=256"}, {"M=1000", "N=264", "K=1032", "MM=64", "NN=128"},
      {"M=2048", "N=2048", "K=256", "MM=128", "NN=128"}, {"M=64", "N=64", "K=8", "MM=64", "NN=64"},
      {"M=70", "N=72", "K=24", "MM=64", "NN=64"}};
  for (auto sets : cases) {
    sets.insert(sets.end(), {"dtype=bf16", "mask=1"});
    auto params = examples::resolve(spec, sets);
    std::string src = cuda::lower(passes::compile(examples::build(spec, params), examples::compile_options(params))).source;
    ASSERT_NE(src.find("// path: the tile layer's pipeline"), std::string::npos) << sets[3] << " " << sets[4];
    check_program(spec, sets, seed++);
  }
  // The gemm program's blocked form (a K loop carrying the C tile) takes the same kernel.
  auto& gemm = examples::find_program("gemm");
  for (std::vector<std::string> sets : {std::vector<std::string>{"M=384", "N=512", "K=320", "MM=128", "NN=256", "KK=64"},
                                        std::vector<std::string>{"M=256", "N=192", "K=96", "MM=64", "NN=64", "KK=32"}}) {
    sets.push_back("dtype=bf16");
    auto params = examples::resolve(gemm, sets);
    std::string src = cuda::lower(passes::compile(examples::build(gemm, params), examples::compile_options(params))).source;
    ASSERT_NE(src.find("// path: the tile layer's pipeline"), std::string::npos) << sets[3] << " " << sets[4];
    check_program(gemm, sets, seed++);
  }
}

// The flash_attention program in bf16 on the tile layer's attention pipeline (TMA producer, wgmma
// consumers, the fold's element nodes in the accumulator layout) against the interpreter, output poisoned,
// fresh inputs: sequences that are not multiples of the tiles (partial query tiles, whose rows past S are
// not stored, and partial key tiles, whose keys past S the reductions skip), causal and not, dropout and
// not, d64 / d128 / d256, one and two consumer warpgroups. The tolerance is bf16's (1e-2 relative, 1e-3
// of the largest output absolute): the pipeline rounds P to bf16 before P V and takes exp as exp2 of
// x log2(e), where the interpreter keeps P in fp32 (docs/cuda-lowering.md, "Attention on wgmma").
TEST(SM90_CudaLower, FlashAttentionOnWgmma) {
  MP_REQUIRE_GPU();
  uint64_t seed = fresh_seed() % 1000000;
  auto& spec = examples::find_program("flash_attention");
  const std::vector<std::vector<std::string>> cases = {
      {"S=300", "D=64", "BR=64", "BC=64", "causal=1", "p_drop=0"},
      {"S=300", "D=128", "BR=128", "BC=128", "causal=0", "p_drop=0.1"},
      {"S=1000", "D=128", "BR=128", "BC=64", "causal=1", "p_drop=0.1"},
      {"S=1000", "D=64", "BR=64", "BC=128", "causal=0", "p_drop=0"},
      {"S=1000", "D=256", "BR=128", "BC=64", "causal=1", "p_drop=0"},
      {"S=2048", "D=128", "BR=128", "BC=128", "causal=0", "p_drop=0"},
      {"S=64", "D=64", "BR=64", "BC=64", "causal=1", "p_drop=0.1"}};
  for (auto sets : cases) {
    sets.insert(sets.end(), {"dtype=bf16", "mask=1"});
    auto params = examples::resolve(spec, sets);
    std::string src =
        cuda::lower(passes::compile(examples::build(spec, params), examples::compile_options(params))).source;
    ASSERT_NE(src.find("// path: the tile layer's wgmma attention pipeline"), std::string::npos)
        << sets[0] << " " << sets[1] << " " << sets[2] << " " << sets[3];
    check_program(spec, sets, seed++);
  }
}

// The streaming programs at sizes where a block runs many iterations (the ring wraps around its slots
// many times) and the last tiles are cut by the mask at lengths that are not multiples of four.
std::vector<std::pair<std::string, std::vector<std::string>>> ring_cases() {
  return {
      {"dotproduct", {"N=4194307", "TS=2048", "mask=1"}},
      {"tpchq6", {"N=1000003", "TS=1024", "mask=1"}},
      {"blackscholes", {"N=1000001", "TS=1024", "mask=1"}},
      {"softmax", {"R=1001", "C=256", "row_tile=8", "mask=1"}},
      {"outerproduct", {"M=1000", "N=512", "TM=8", "TN=128", "mask=1"}},
  };
}

TEST(SM90_CudaLower, StreamingProgramsThroughTheTileRing) {
  // Many iterations per block (the ring wraps around its slots many times), last tiles cut by the mask
  // at lengths that are not multiples of four (the 4-byte cp.async tail); each lowered unit must take
  // the ring path.
  MP_REQUIRE_GPU();
  uint64_t seed = fresh_seed() % 1000000;
  const auto cases = ring_cases();
  // Filled by cp.async here (MP_CUDA_LOWER_COPY=cp); the default bulk copies are the test below. softmax
  // on its tile path (MP_CUDA_LOWER_ROWS=tile; by default its rows are in registers, no ring).
  setenv("MP_CUDA_LOWER_COPY", "cp", 1);
  setenv("MP_CUDA_LOWER_ROWS", "tile", 1);
  for (auto& [name, sets] : cases) {
    auto& spec = examples::find_program(name);
    auto params = examples::resolve(spec, sets);
    auto src = cuda::lower(passes::compile(examples::build(spec, params), examples::compile_options(params)),
                           cuda::options_from_env())
                   .source;
    EXPECT_NE(src.find("// path: tile ring (cp.async)"), std::string::npos) << name;
    check_program(spec, sets, seed++);
  }
  unsetenv("MP_CUDA_LOWER_ROWS");
  unsetenv("MP_CUDA_LOWER_COPY");
}

TEST(SM90_CudaLower, StreamingProgramsThroughTheBulkCopyRing) {
  // The tile ring filled by bulk copies (TMA) on an mbarrier per slot (MP_CUDA_LOWER_COPY=bulk), at the
  // cases above: many iterations per block (every slot's mbarrier through many phases), masked tails
  // that are not multiples of four (plain loads), with one and two barriers per iteration.
  MP_REQUIRE_GPU();
  uint64_t seed = fresh_seed() % 1000000;
  auto cases = ring_cases();
  cases.push_back({"dotproduct", {"N=1048573", "TS=256", "mask=1"}});
  setenv("MP_CUDA_LOWER_COPY", "bulk", 1);
  setenv("MP_CUDA_LOWER_ROWS", "tile", 1);  // softmax on its tile path
  for (const char* barriers : {"1", "2"}) {
    setenv("MP_CUDA_LOWER_BARRIERS", barriers, 1);
    SCOPED_TRACE(std::string("MP_CUDA_LOWER_COPY=bulk MP_CUDA_LOWER_BARRIERS=") + barriers);
    for (auto& [name, sets] : cases) {
      auto& spec = examples::find_program(name);
      auto params = examples::resolve(spec, sets);
      auto c = passes::compile(examples::build(spec, params), examples::compile_options(params));
      EXPECT_NE(cuda::lower(c, cuda::options_from_env()).source.find("// path: tile ring (bulk copies (TMA))"),
                std::string::npos)
          << name;
      check_program(spec, sets, seed++);
    }
  }
  unsetenv("MP_CUDA_LOWER_BARRIERS");
  unsetenv("MP_CUDA_LOWER_ROWS");
  unsetenv("MP_CUDA_LOWER_COPY");
}

TEST(SM90_CudaLower, SpeedVariantsComputeTheSameResults) {
  // The run time's MP_CUDA_LOWER_* variants (docs/cuda-lowering.md, "Speed") on the streaming programs,
  // masked tails included: the direct path with 256 threads and nothing fused, the deepest rings, 256
  // threads with the default ring and fusion, and softmax's tile path (not rows in registers) with 4-byte
  // and with 16-byte fused stores.
  MP_REQUIRE_GPU();
  uint64_t seed = fresh_seed() % 1000000;
  const std::vector<std::pair<std::string, std::vector<std::string>>> cases = {
      {"dotproduct", {"N=1048579", "TS=2048", "mask=1"}},
      {"tpchq6", {"N=1000003", "TS=1024", "mask=1"}},
      {"blackscholes", {"N=1000001", "TS=1024", "mask=1"}},
      {"softmax", {"R=1001", "C=256", "row_tile=8", "mask=1"}},
      {"outerproduct", {"M=1000", "N=512", "TM=8", "TN=128", "mask=1"}},
  };
  const std::vector<std::vector<std::pair<const char*, const char*>>> variants = {
      {{"MP_CUDA_LOWER_RING", "off"}, {"MP_CUDA_LOWER_THREADS", "256"}, {"MP_CUDA_LOWER_FUSE", "off"}},
      {{"MP_CUDA_LOWER_RING", "4096"}},
      {{"MP_CUDA_LOWER_THREADS", "256"}},
      {{"MP_CUDA_LOWER_ROWS", "tile"}, {"MP_CUDA_LOWER_STORE", "scalar"}},
      {{"MP_CUDA_LOWER_ROWS", "tile"}},
  };
  for (auto& v : variants) {
    std::string label;
    for (auto& [k, val] : v) {
      setenv(k, val, 1);
      label += std::string(k) + "=" + val + " ";
    }
    SCOPED_TRACE(label);
    for (auto& [name, sets] : cases) check_program(examples::find_program(name), sets, seed++);
    for (auto& [k, val] : v) unsetenv(k);
  }
}

TEST(SM90_CudaLower, CarriedMaxAndMinFoldOverBlocks) {
  MP_REQUIRE_GPU();
  ir::Program c = cuda_test::compiled_extra("fold_max_min");
  uint64_t seed = fresh_seed() % 1000000;
  SCOPED_TRACE("seed " + std::to_string(seed));
  for (float sign : {-1.f, 1.f}) {
    std::vector<float> a = random_floats(1000, seed, 1.f, 100.f);
    for (auto& x : a) x *= sign;
    ir::Memory want = ir::make_memory(c, {{"A", a}}), got = ir::make_memory(c, {{"A", a}});
    cpu::interpret(c, want);
    auto rep = cuda::run(c, got);
    ASSERT_EQ(rep.kernels.size(), c.body.size());
    EXPECT_GT(rep.kernels[2].grid, 1) << "the folded loop runs on many blocks";
    EXPECT_EQ(got.at("hi").data, want.at("hi").data);
    EXPECT_EQ(got.at("lo").data, want.at("lo").data);
  }
}

TEST(SM90_CudaLower, CacheHitOnSecondRun) {
  MP_REQUIRE_GPU();
  auto dir = std::filesystem::temp_directory_path() / ("mp-cuda-cache-test-" + std::to_string(fresh_seed() % 1000000));
  cuda::RunOptions opt;
  opt.cache_dir = dir.string();
  auto& spec = examples::find_program("softmax");
  auto params = examples::resolve(spec, {});
  auto c = passes::compile(examples::build(spec, params), examples::compile_options(params));
  auto in = examples::make_inputs(spec, params, examples::build(spec, params), 7);
  ir::Memory m1 = ir::make_memory(c, in), m2 = ir::make_memory(c, in);
  auto r1 = cuda::run(c, m1, opt);
  auto r2 = cuda::run(c, m2, opt);
  EXPECT_FALSE(r1.cache_hit);
  EXPECT_TRUE(r2.cache_hit);
  EXPECT_EQ(r1.cache_file, r2.cache_file);
  EXPECT_TRUE(std::filesystem::exists(r1.cache_file));
  EXPECT_EQ(m1.at("Y").data, m2.at("Y").data);
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
}

TEST(SM90_CudaLower, GatherIndexOutOfRangeIsAUserError) {
  MP_REQUIRE_GPU();
  using namespace mp::front;
  ProgramBuilder b("gather_oob");
  auto table = b.input("table", {8, 4});
  auto idx = b.input("idx", {4, 1}, DType::i32);
  auto out = b.output("out", {4, 4});
  auto i = LOAD_TILE(idx, {4, 1});
  STORE_TILE(out, GATHER(table, i));
  ir::Program c = passes::compile(b.finish(), {});
  std::map<std::string, std::vector<float>> in = {{"table", std::vector<float>(32, 1.f)},
                                                  {"idx", {0.f, 3.f, 9.f, 1.f}}};
  ir::Memory mem = ir::make_memory(c, in);
  try {
    cuda::run(c, mem);
    FAIL() << "expected a user_error";
  } catch (const user_error& e) {
    EXPECT_NE(std::string(e.what()).find("Gather #"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("out of range of 'table'"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace mp
