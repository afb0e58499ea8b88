// The CUDA lowering on the CPU: the generated source of every registered program (self-contained, one
// entry per statement, comments naming the IR nodes), that source run on the host emulation of CUDA
// (cuda_lower_host.h) against the reference interpreter, and the lowering's errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <map>
#include <set>
#include <sstream>
#include <tuple>

#include "backends/cpu/interpreter.h"
#include "backends/cuda/lower/lower.h"
#include "backends/cuda/lower/runtime.h"
#include "core/random.h"
#include "examples/run.h"
#include "front/front.h"
#include "tests/backends/cuda_lower_cases.h"
#include "tests/backends/cuda_lower_host.h"
#include "tests/backends/cuda_lower_host_options.h"

namespace mp {
namespace {

using namespace mp::front;

std::vector<std::string> sets_of(const std::string& program) {
  auto it = cuda_test::small_sets().find(program);
  return it == cuda_test::small_sets().end() ? std::vector<std::string>{} : it->second;
}

ir::Program compiled(const examples::ProgramSpec& spec, const examples::Params& params) {
  return passes::compile(examples::build(spec, params), examples::compile_options(params));
}

TEST(CudaLower, EveryProgramLowersToOneSelfContainedUnit) {
  ASSERT_FALSE(examples::programs().empty());
  for (auto* spec : examples::programs()) {
    SCOPED_TRACE(spec->name);
    auto params = examples::resolve(*spec, {});
    ir::Program p = compiled(*spec, params);
    cuda::Lowered low = cuda::lower(p);
    ASSERT_EQ(low.kernels.size(), p.body.size()) << "one kernel per top-level statement";
    EXPECT_EQ(low.source.find("#include"), std::string::npos) << "the unit must need no header";
    std::set<std::string> entries;
    for (size_t s = 0; s < low.kernels.size(); ++s) {
      auto& k = low.kernels[s];
      EXPECT_TRUE(entries.insert(k.entry).second) << "duplicate entry " << k.entry;
      EXPECT_NE(low.source.find(") " + k.entry + "(void* const* mp_t"), std::string::npos) << k.entry;
      EXPECT_EQ(k.statement, p.body[s]->where());
      EXPECT_LE(k.smem_bytes, cuda::LowerOptions{}.smem_bytes);
      auto* m = p.body[s]->as<ir::MetaPipe>();
      EXPECT_EQ(k.distributed, m && (m->carried.empty() || k.fold));
      EXPECT_TRUE(!k.fold || (m && !m->carried.empty())) << "only a loop with carried sums folds";
    }
    EXPECT_NE(low.source.find("extern \"C\" __global__"), std::string::npos);
    // Every node's code is introduced by a comment naming it.
    ir::walk(p.body, [&](const ir::NodeRef& n, int) {
      EXPECT_NE(low.source.find("// " + n->where() + ": "), std::string::npos) << n->where();
    });
    // Lowering is a pure function of the program: the same text twice (what the NVRTC cache relies on).
    EXPECT_EQ(cuda::lower(p).source, low.source);
  }
}

TEST(CudaLower, TestListNamesEveryProgram) {
  std::vector<std::string> registered;
  for (auto* spec : examples::programs()) registered.push_back(spec->name);
  EXPECT_EQ(registered, cuda_test::program_names()) << "update tests/backends/cuda_lower_cases.h";
}

const mp_host::Program* host_unit(const std::string& name) {
  for (auto& h : mp_host::programs())
    if (h.name == name) return &h;
  return nullptr;
}

// The host-compiled unit `unit` of `program` at `sets`, run with at most `max_grid` blocks, against the
// interpreter on fresh random inputs (outputs NaN-poisoned); returns the outputs it produced.
std::map<std::string, std::vector<float>> check_on_host(
    const std::string& unit, const std::string& program, const std::vector<std::string>& sets, int max_grid,
    uint64_t seed, const cuda::LowerOptions& lo = cuda_test::host_options()) {
  SCOPED_TRACE(unit + " with " + std::to_string(max_grid) + " blocks, seed " + std::to_string(seed));
  std::map<std::string, std::vector<float>> outputs;
  auto& spec = examples::find_program(program);
  const mp_host::Program* hp = host_unit(unit);
  EXPECT_NE(hp, nullptr) << "unit not lowered by cuda_lower_emit (not supported?)";
  if (!hp) return outputs;
  auto params = examples::resolve(spec, sets);
  ir::Program p = examples::build(spec, params);
  ir::Program c = passes::compile(p, examples::compile_options(params));
  cuda::Lowered low = cuda::lower(c, lo);
  auto in = examples::make_inputs(spec, params, p, seed);
  ir::Memory want = ir::make_memory(c, in), got = ir::make_memory(c, in);  // outputs poisoned with NaN
  cpu::interpret(c, want);
  EXPECT_EQ(mp_host::run(*hp, low, got, max_grid), 0) << "device error raised";
  double rtol = examples::output_tolerance(p);
  auto mags = examples::magnitudes_of(spec, params, in);
  for (auto& t : c.tensors) {
    if (t->role != ir::TensorRole::Output && t->role != ir::TensorRole::InOut) continue;
    std::vector<double> w(want.at(t->name).data.begin(), want.at(t->name).data.end());
    auto cmp = compare(got.at(t->name).data, w, rtol, examples::check_atol(t->name, w, mags, rtol));
    EXPECT_TRUE(cmp.ok) << t->name << ": " << cmp.summary();
    outputs[t->name] = got.at(t->name).data;
  }
  EXPECT_FALSE(outputs.empty());
  return outputs;
}

// One test per program, so ctest runs them side by side.
class CudaLowerHost : public testing::TestWithParam<std::string> {};

TEST_P(CudaLowerHost, GeneratedCodeMatchesTheInterpreter) {
  check_on_host(GetParam(), GetParam(), sets_of(GetParam()), 3, fresh_seed() % 1000000);
}
INSTANTIATE_TEST_SUITE_P(EveryProgram, CudaLowerHost, testing::ValuesIn(cuda_test::program_names()),
                         [](const testing::TestParamInfo<std::string>& i) { return i.param; });

// The tile copies' tails and unaligned offsets, and folded sums, at the sizes of cuda_lower_cases.h.
class CudaLowerHostVariant : public testing::TestWithParam<cuda_test::Variant> {};

TEST_P(CudaLowerHostVariant, GeneratedCodeMatchesTheInterpreter) {
  const auto& v = GetParam();
  check_on_host(v.name, v.program, v.sets, 3, fresh_seed() % 1000000, cuda_test::host_options(v));
}
INSTANTIATE_TEST_SUITE_P(Sizes, CudaLowerHostVariant, testing::ValuesIn(cuda_test::variants()),
                         [](const testing::TestParamInfo<cuda_test::Variant>& i) { return i.param.name; });

TEST(CudaLower, TileCopiesTakeTheVectorPathWhereContiguous) {
  // dotproduct's [TS, 1] tiles of an [N, 1] tensor are one run: the float4 copy with its aligned check
  // and the element tail; matmul's [MM, K] tile of A spans A's rows, its B tile [K, NN] does not.
  auto lowered = [](const std::string& name, const std::vector<std::string>& sets, bool fuse = true) {
    auto& spec = examples::find_program(name);
    cuda::LowerOptions o;
    o.fuse_elementwise = fuse;
    return cuda::lower(compiled(spec, examples::resolve(spec, sets)), o);
  };
  // (TS=1026: tile offsets that are not always 16-byte aligned keep dotproduct's loads off the tile ring)
  std::string dot = lowered("dotproduct", {"TS=1026", "mask=1"}).source;
  EXPECT_NE(dot.find("the tile is contiguous in A: 16-byte copies"), std::string::npos);
  EXPECT_NE(dot.find("if ((g0_ & 3) == 0"), std::string::npos);
  EXPECT_NE(dot.find("for (int f_ = 4 * n4_ + threadIdx.x; f_ < n_; f_ += blockDim.x)"), std::string::npos);
  // The StoreTile too, where its value is stored (fusion off; on, the Zip's elements go to the tensor).
  EXPECT_NE(lowered("blackscholes", {}, false).source.find("the tile is contiguous in price"),
            std::string::npos);
  std::string bs = lowered("blackscholes", {}).source;
  EXPECT_NE(bs.find("Zip #22's elements, computed here and stored to price"), std::string::npos);
  // blackscholes' element function is a DAG: each shared subexpression once, in fp32.
  EXPECT_NE(bs.find("logf("), std::string::npos);
  EXPECT_NE(bs.find("= expf("), std::string::npos);
  EXPECT_EQ(bs.find("const double t"), std::string::npos) << "no fp64 arithmetic in an f32 program without indices";
  EXPECT_LT(bs.size(), size_t(200000)) << "the element function is emitted once per node, not per use";
}

TEST(CudaLower, ElementwiseResultsReuseADeadOperandsStorage) {
  // softmax: exp(x) over the loaded tile, then x / sum over exp's: one [rows, C] tile in shared memory,
  // not three (the host tests run every program with these aliases against the interpreter).
  // (on the tile path, MP_CUDA_LOWER_ROWS=tile; rows in registers store no value at all)
  auto& spec = examples::find_program("softmax");
  auto params = examples::resolve(spec, {});
  cuda::LowerOptions tile;
  tile.warp_rows = false;
  cuda::Lowered low = cuda::lower(compiled(spec, params), tile);
  ASSERT_EQ(low.kernels.size(), 1u);
  size_t n = 0;
  for (size_t at = 0; (at = low.source.find("written over its dead operand", at)) != std::string::npos; ++at) ++n;
  EXPECT_EQ(n, 2u) << "the Map and the Zip";
  ASSERT_NE(low.source.find("path: tile ring (bulk copies (TMA)), 2 slots per tile: X"), std::string::npos);
  EXPECT_LT(low.kernels[0].smem_bytes, 3 * 64 * 128 * 4)
      << "the two ring slots of one tile of the default 64 x 128 (the results live in the slot), and the row sums";
}

TEST(CudaLower, StreamingLoopsTakeTheTileRing) {
  // The streaming programs' loads have addresses known from the loop index, 16-byte aligned: a ring of
  // slots, the copies of later iterations issued before this one computes; here filled by cp.async
  // (MP_CUDA_LOWER_COPY=cp; the bulk copies are the default, StreamingLoopsTakeTheBulkCopyRing). Tiles
  // whose offsets are not always aligned take the direct copy, and the unit says why. (softmax on its
  // tile path, MP_CUDA_LOWER_ROWS=tile: by default its rows are in registers, RowsInRegisters.)
  auto lowered = [](const std::string& name, const std::vector<std::string>& sets) {
    auto& spec = examples::find_program(name);
    cuda::LowerOptions o;
    cuda::set_copy_option(o, "cp");
    o.warp_rows = false;
    return cuda::lower(compiled(spec, examples::resolve(spec, sets)), o).source;
  };
  for (const char* name : {"dotproduct", "tpchq6", "blackscholes", "softmax", "outerproduct"}) {
    SCOPED_TRACE(name);
    std::string src = lowered(name, {});
    EXPECT_NE(src.find("// path: tile ring (cp.async), "), std::string::npos);
    EXPECT_NE(src.find("mp_cp_async16(d_ + 4 * q_, g_ + 4 * q_);"), std::string::npos);
    EXPECT_NE(src.find("mp_cp_async4(d_ + f_, g_ + f_);"), std::string::npos) << "the masked tail";
    EXPECT_NE(src.find("__syncthreads();  // ... and every thread's"), std::string::npos);
    EXPECT_NE(src.find("cp.async.cg.shared.global"), std::string::npos);
    EXPECT_NE(src.find("mp_cp_wait<0>();"), std::string::npos);
  }
  for (auto& v : cuda_test::variants()) {
    if (v.name.find("unaligned") == std::string::npos) continue;
    SCOPED_TRACE(v.name);
    std::string src = lowered(v.program, v.sets);
    EXPECT_EQ(src.find("// path: tile ring"), std::string::npos);
    EXPECT_NE(src.find("takes the direct copy: its offset is not always 16-byte aligned"), std::string::npos);
  }
  // The ring on the host with one block (8 iterations through a ring of 4 slots, the last tile cut at
  // 1001 - 896 = 105 elements: 26 16-byte copies and one 4-byte one) and with 2 blocks.
  uint64_t seed = fresh_seed() % 1000000;
  for (int grid : {1, 2}) check_on_host("dotproduct_tail", "dotproduct", {"N=1001", "TS=128", "mask=1"}, grid, seed);
}

TEST(CudaLower, CarriedSumsFoldOverBlocksDeterministically) {
  // dotproduct's accumulator and tpchq6's revenue: one folded kernel over many blocks; the combine of the
  // last block gives the interpreter's result (within fp32's tolerance) for every grid size, and the
  // same bits for the same grid.
  for (const char* name : {"dotproduct", "tpchq6"}) {
    auto& spec = examples::find_program(name);
    cuda::Lowered low = cuda::lower(compiled(spec, examples::resolve(spec, sets_of(name))), cuda_test::host_options());
    int folds = 0;
    for (auto& k : low.kernels) folds += k.fold && k.distributed && k.trip > 1 ? 1 : 0;
    EXPECT_EQ(folds, 1) << name;
    EXPECT_NE(low.source.find("the last block to finish combines them"), std::string::npos);
    uint64_t seed = fresh_seed() % 1000000;
    for (int grid : {1, 3}) check_on_host(name, name, sets_of(name), grid, seed);
    auto a = check_on_host(name, name, sets_of(name), 8, seed);
    auto b = check_on_host(name, name, sets_of(name), 8, seed);
    EXPECT_EQ(a, b) << name << ": not deterministic with 8 blocks";
  }
  // A loop whose carried value is not a plain running sum (kmeans' centroids) stays on one block.
  auto& km = examples::find_program("kmeans");
  for (auto& k : cuda::lower(compiled(km, examples::resolve(km, {}))).kernels) EXPECT_FALSE(k.fold) << k.statement;
}

TEST(CudaLower, CarriedMaxAndMinFoldOverBlocks) {
  // A running max and a running min (cuda_lower_cases.h's fold_max_min) fold over the blocks like a
  // sum: each block's partial starts from the identity, the last block combines them; max and min are
  // exact, so every grid gives the interpreter's bits.
  ir::Program c = cuda_test::compiled_extra("fold_max_min");
  cuda::Lowered low = cuda::lower(c, cuda_test::host_options());
  int folds = 0;
  for (auto& k : low.kernels) folds += k.fold && k.distributed && k.trip > 1 ? 1 : 0;
  EXPECT_EQ(folds, 1);
  EXPECT_NE(low.source.find("= (float)(-mp_inf());"), std::string::npos) << "max's identity";
  EXPECT_NE(low.source.find("= (float)mp_inf();"), std::string::npos) << "min's identity";
  const mp_host::Program* hp = host_unit("fold_max_min");
  ASSERT_NE(hp, nullptr);
  uint64_t seed = fresh_seed() % 1000000;
  SCOPED_TRACE("seed " + std::to_string(seed));
  // All negative, then all positive: a partial that started from 0 instead of the identity would show.
  for (float sign : {-1.f, 1.f})
  for (int grid : {1, 8}) {
    SCOPED_TRACE(std::to_string(grid) + " blocks, sign " + std::to_string(sign));
    std::vector<float> a = random_floats(1000, seed, 1.f, 100.f);
    for (auto& x : a) x *= sign;
    ir::Memory want = ir::make_memory(c, {{"A", a}}), got = ir::make_memory(c, {{"A", a}});
    cpu::interpret(c, want);
    ASSERT_EQ(mp_host::run(*hp, low, got, grid), 0);
    EXPECT_EQ(got.at("hi").data, want.at("hi").data);
    EXPECT_EQ(got.at("lo").data, want.at("lo").data);
    EXPECT_EQ(got.at("hi").data[0], *std::max_element(a.begin(), a.end()));
    EXPECT_EQ(got.at("lo").data[0], *std::min_element(a.begin(), a.end()));
  }
  // A running product stays on one block.
  using namespace mp::front;
  ProgramBuilder b("fold_product");
  auto A = b.input("A", {256, 1});
  auto out = b.output("out", {1, 1});
  auto acc = METAPIPE_FOLD(4, {FILL({1, 1}, 1.0)}, [&](Idx, const std::vector<Value>& s) -> std::vector<Value> {
    return {ZIP(s[0], REDUCE(LOAD_TILE(A, {64, 1}), 0, Combiner::Mul), [](Expr x, Expr y) { return x * y; })};
  });
  STORE_TILE(out, acc[0]);
  for (auto& k : cuda::lower(passes::compile(b.finish(), {})).kernels) EXPECT_FALSE(k.fold) << k.statement;
}

TEST(CudaLower, SpillsToGlobalScratchWhenSharedMemoryIsSmall) {
  // The host test's 8 KiB budget sends matmul's default 64 x 128 and 128 x 64 f32 tiles past shared memory.
  auto& spec = examples::find_program("matmul");
  auto params = examples::resolve(spec, {});
  cuda::Lowered low = cuda::lower(compiled(spec, params), cuda_test::host_options());
  ASSERT_EQ(low.kernels.size(), 1u);
  EXPECT_GT(low.kernels[0].scratch_floats, 0);
  EXPECT_LE(low.kernels[0].smem_bytes, 8 * 1024);
  EXPECT_NE(low.source.find("global scratch"), std::string::npos);
}

// A unit lowered onto one of the tile layer's pipelines: it includes the tile layer, names its path, runs
// the template's block and has a ring of `stages` stages.
void expect_tile_layer_unit(const cuda::Lowered& low, const std::string& path, int stages) {
  EXPECT_TRUE(low.uses_tile_layer);
  EXPECT_NE(low.source.find("#include \"tile/tile.cuh\""), std::string::npos);
  EXPECT_NE(low.source.find(path), std::string::npos);
  EXPECT_NE(low.source.find("mp::tile::pc::run_block<"), std::string::npos);
  EXPECT_NE(low.source.find("stages = " + std::to_string(stages) + ";"), std::string::npos) << low.source;
}

// The slide-51 matmul in bf16 with wgmma-sized tiles lowers onto the tile layer's pipeline: one kernel of
// a producer and MM / 64 consumer warpgroups, three tensor maps (A, B, C) with the tiles' boxes, the
// ring as deep as shared memory allows, and the unit includes the tile layer. (It runs on the GPU only:
// SM90_CudaLower.MatmulOnWgmma checks it against the interpreter.)
TEST(CudaLower, Bf16MatmulLowersOntoTheTilePipeline) {
  auto& spec = examples::find_program("matmul");
  struct Want {
    std::vector<std::string> sets;
    int threads, stages;
  };
  for (const Want& w : {Want{{"M=300", "N=520", "K=200", "MM=128", "NN=256"}, 384, 4},
                        Want{{"M=256", "N=256", "K=128", "MM=64", "NN=64"}, 256, 13},
                        Want{{"M=4096", "N=4096", "K=4096", "MM=128", "NN=128"}, 384, 6},
                        Want{{"M=64", "N=64", "K=8", "MM=64", "NN=64"}, 256, 13}}) {  // one tile: i, j folded
    std::vector<std::string> sets = w.sets;
    sets.insert(sets.end(), {"dtype=bf16", "mask=1"});
    SCOPED_TRACE(sets[3] + " " + sets[4]);
    auto params = examples::resolve(spec, sets);
    cuda::Lowered low = cuda::lower(compiled(spec, params));
    ASSERT_EQ(low.kernels.size(), 1u);
    const auto& k = low.kernels[0];
    expect_tile_layer_unit(low, "// path: the tile layer's pipeline", w.stages);
    EXPECT_EQ(k.threads, w.threads);
    EXPECT_TRUE(k.distributed);
    const int64_t M = params.i("M"), N = params.i("N"), K = params.i("K"), MM = params.i("MM"), NN = params.i("NN");
    EXPECT_EQ(k.trip, ((M + MM - 1) / MM) * ((N + NN - 1) / NN));
    EXPECT_LE(k.smem_bytes, 227 * 1024);
    ASSERT_EQ(k.maps.size(), 3u);
    auto tensor = [&](const cuda::TensorMapSpec& m) { return low.tensors[size_t(m.tensor)]->name; };
    EXPECT_EQ(tensor(k.maps[0]), "A");
    EXPECT_EQ(tensor(k.maps[1]), "B");
    EXPECT_EQ(tensor(k.maps[2]), "C");
    EXPECT_EQ(k.maps[0].rows, M);
    EXPECT_EQ(k.maps[0].cols, K);
    EXPECT_EQ(k.maps[0].box_rows, MM);
    EXPECT_EQ(k.maps[1].rows, K);
    EXPECT_EQ(k.maps[1].cols, N);
    EXPECT_EQ(k.maps[2].rows, M);
    for (auto& m : k.maps) EXPECT_EQ(m.box_cols, 64);
  }
}

// The kernel struct of a unit with the comments dropped (the IR's names in them differ between programs).
std::string pipeline_struct(const std::string& src) {
  auto a = src.find("struct K {"), b = src.find("\n};\n", a);
  if (a == std::string::npos || b == std::string::npos) return "";
  std::string code, line;
  std::istringstream in(src.substr(a, b - a));
  while (std::getline(in, line)) {
    auto c = line.find("//");
    code += (c == std::string::npos ? line : line.substr(0, c)) + "\n";
  }
  return code;
}

// The gemm program's blocked form (the K loop carrying the C tile) lowers onto the same pipeline kernel
// as the slide-51 matmul of the same shapes: the pipeline's K loop runs over all of K either way. The
// matmul's kernel is the one checked on the GPU (SM90_CudaLower.MatmulOnWgmma, which runs gemm too).
TEST(CudaLower, BlockedGemmLowersToTheMatmulsPipelineKernel) {
  auto& gemm = examples::find_program("gemm");
  auto& matmul = examples::find_program("matmul");
  for (auto [mm, nn, kk] : {std::tuple{"128", "256", "64"}, std::tuple{"64", "64", "128"}, std::tuple{"128", "128", "32"}}) {
    SCOPED_TRACE(std::string("MM=") + mm + " NN=" + nn + " KK=" + kk);
    std::vector<std::string> shape = {"dtype=bf16", "M=512", "N=512", "K=512", std::string("MM=") + mm,
                                      std::string("NN=") + nn};
    auto gsets = shape;
    gsets.push_back(std::string("KK=") + kk);
    cuda::Lowered g = cuda::lower(compiled(gemm, examples::resolve(gemm, gsets)));
    cuda::Lowered m = cuda::lower(compiled(matmul, examples::resolve(matmul, shape)));
    ASSERT_TRUE(g.uses_tile_layer) << g.source.substr(0, 4000);
    EXPECT_NE(g.source.find("(its carried tile: the accumulator, in registers)"), std::string::npos);
    std::string gs = pipeline_struct(g.source), ms = pipeline_struct(m.source);
    ASSERT_FALSE(gs.empty());
    EXPECT_EQ(gs, ms);
    ASSERT_EQ(g.kernels.size(), 1u);
    EXPECT_EQ(g.kernels[0].smem_bytes, m.kernels[0].smem_bytes);
    EXPECT_EQ(g.kernels[0].threads, m.kernels[0].threads);
    EXPECT_EQ(g.kernels[0].trip, m.kernels[0].trip);
    ASSERT_EQ(g.kernels[0].maps.size(), 3u);
    for (size_t i = 0; i < 3; ++i) {
      EXPECT_EQ(g.kernels[0].maps[i].rows, m.kernels[0].maps[i].rows);
      EXPECT_EQ(g.kernels[0].maps[i].cols, m.kernels[0].maps[i].cols);
      EXPECT_EQ(g.kernels[0].maps[i].box_rows, m.kernels[0].maps[i].box_rows);
    }
  }
  // The f32 gemm (its default) stays on the element loops.
  EXPECT_FALSE(cuda::lower(compiled(gemm, examples::resolve(gemm, {}))).uses_tile_layer);
}

// What the tile pipeline cannot take stays on the element loops, the reason in the kernel's comment; the
// f32 program and MP_CUDA_LOWER_MATMUL=generic never include the tile layer.
TEST(CudaLower, MatmulOffTheTilePipelineSaysWhy) {
  auto& spec = examples::find_program("matmul");
  struct Case {
    std::vector<std::string> sets;
    const char* why;
  };
  for (const Case& c :
       {Case{{"dtype=f32", "MM=64", "NN=64"}, "A, B and C are not all bf16"},
        Case{{"dtype=bf16", "MM=32", "NN=64"}, "MM=32 (wgmma tiles take MM = 64 or 128)"},
        Case{{"dtype=bf16", "MM=64", "NN=32"}, "NN=32 (wgmma tiles take NN = 64, 128 or 256)"},
        Case{{"dtype=bf16", "MM=64", "NN=64", "K=100", "mask=1"}, "K and N multiples of 8"}}) {
    SCOPED_TRACE(c.why);
    cuda::Lowered low = cuda::lower(compiled(spec, examples::resolve(spec, c.sets)));
    EXPECT_FALSE(low.uses_tile_layer);
    EXPECT_EQ(low.source.find("#include"), std::string::npos);
    EXPECT_TRUE(low.kernels[0].maps.empty());
    EXPECT_NE(low.source.find(std::string("the MatMul takes the element loops, not the tile layer's wgmma pipeline: ")),
              std::string::npos);
    EXPECT_NE(low.source.find(c.why), std::string::npos) << low.source.substr(0, 3000);
  }
  cuda::LowerOptions generic;
  cuda::set_matmul_option(generic, "generic");
  cuda::Lowered low =
      cuda::lower(compiled(spec, examples::resolve(spec, {"dtype=bf16", "MM=128", "NN=128"})), generic);
  EXPECT_FALSE(low.uses_tile_layer);
  EXPECT_NE(low.source.find("MP_CUDA_LOWER_MATMUL=generic"), std::string::npos);
  try {
    cuda::set_matmul_option(generic, "tensor-cores");
    FAIL() << "expected a user_error";
  } catch (const user_error& e) {
    EXPECT_NE(std::string(e.what()).find("MP_CUDA_LOWER_MATMUL='tensor-cores' is not wgmma or generic"),
              std::string::npos)
        << e.what();
  }
}

// The flash_attention program in bf16: its statement lowers onto the tile layer's pipeline as an attention
// kernel (a TMA producer for Q once and the K / V ring, wgmma consumers with the fold's element nodes in
// the accumulator layout), launched one block per query tile. Its results are checked on the GPU
// (SM90_CudaLower.FlashAttentionOnWgmma); the host emulator cannot run wgmma.
TEST(CudaLower, Bf16FlashAttentionLowersOntoTheAttentionPipeline) {
  auto& spec = examples::find_program("flash_attention");
  struct Want {
    std::vector<std::string> sets;
    int threads, stages;
  };
  for (const Want& w : {Want{{"S=4096", "D=128", "BR=128", "BC=128", "p_drop=0", "causal=0"}, 384, 3},
                        Want{{"S=1000", "D=64", "BR=64", "BC=64", "p_drop=0.1", "causal=1", "mask=1"}, 256, 4},
                        Want{{"S=300", "D=128", "BR=128", "BC=64", "p_drop=0", "causal=1", "mask=1"}, 384, 4},
                        Want{{"S=1000", "D=256", "BR=128", "BC=64", "p_drop=0.1", "causal=0", "mask=1"}, 384, 2},
                        Want{{"S=64", "D=64", "BR=64", "BC=64"}, 256, 4}}) {  // one tile each way
    std::vector<std::string> sets = w.sets;
    sets.push_back("dtype=bf16");
    SCOPED_TRACE(sets[0] + " " + sets[1] + " " + sets[2] + " " + sets[3]);
    auto params = examples::resolve(spec, sets);
    cuda::Lowered low = cuda::lower(compiled(spec, params));
    ASSERT_EQ(low.kernels.size(), 1u);
    const auto& k = low.kernels[0];
    expect_tile_layer_unit(low, "// path: the tile layer's wgmma attention pipeline", w.stages);
    EXPECT_NE(low.source.find("warpgroup::mm_ABt("), std::string::npos);
    EXPECT_NE(low.source.find("warpgroup::mma_AB(st.o, pb_, s.v, true);"), std::string::npos);
    EXPECT_NE(low.source.find("pingpong = consumers == 2;"), std::string::npos);
    // With the causal select, the key tiles past an item's last row are proven to leave the carried values
    // as they are (with dropout too: 0 / (1 - p) and 0 on both sides of its select): the fold stops there.
    EXPECT_EQ(low.source.find("return {q0, min(kv_iters, last / BN + 1)};") != std::string::npos,
              params.i("causal") != 0);
    EXPECT_EQ(low.source.find("mp_random2(1234ull") != std::string::npos, params.f("p_drop") > 0);
    EXPECT_EQ(k.threads, w.threads);
    EXPECT_TRUE(k.distributed);
    EXPECT_TRUE(k.block_per_item);
    const int64_t S = params.i("S"), D = params.i("D"), BR = params.i("BR"), BC = params.i("BC");
    EXPECT_EQ(k.trip, (S + BR - 1) / BR);
    EXPECT_LE(k.smem_bytes, 227 * 1024);
    EXPECT_NE(low.source.find("shared_bytes == " + std::to_string(k.smem_bytes)), std::string::npos);
    ASSERT_EQ(k.maps.size(), 3u);
    const char* names[3] = {"Q", "K", "V"};
    for (int i = 0; i < 3; ++i) {
      EXPECT_EQ(low.tensors[size_t(k.maps[size_t(i)].tensor)]->name, names[i]);
      EXPECT_EQ(k.maps[size_t(i)].rows, S);
      EXPECT_EQ(k.maps[size_t(i)].cols, D);
      EXPECT_EQ(k.maps[size_t(i)].box_rows, i == 0 ? 64 : BC);
      EXPECT_EQ(k.maps[size_t(i)].box_cols, 64);
    }
  }
}

TEST(CudaLower, FlashAttentionOffTheAttentionPipelineSaysWhy) {
  auto& spec = examples::find_program("flash_attention");
  struct Case {
    std::vector<std::string> sets;
    const char* why;
  };
  for (const Case& c :
       {Case{{"dtype=f32"}, "Q, K, V and O are not all bf16"},
        Case{{"dtype=bf16", "D=96"}, "D=96 (the attention pipeline takes D = 64, 128 or 256)"},
        Case{{"dtype=bf16", "BR=32"}, "BR=32 (one 64-row consumer warpgroup per 64 query rows: BR = 64 or 128)"},
        Case{{"dtype=bf16", "BC=32"}, "BC=32 (the scores' wgmma width: BC = 64 or 128)"},
        Case{{"dtype=bf16", "S=512", "D=256", "BR=128", "BC=128"}, "KiB K / V stages do not fit beside the"}}) {
    SCOPED_TRACE(c.why);
    cuda::Lowered low = cuda::lower(compiled(spec, examples::resolve(spec, c.sets)));
    EXPECT_FALSE(low.uses_tile_layer);
    EXPECT_EQ(low.source.find("#include"), std::string::npos);
    for (auto& k : low.kernels) {
      EXPECT_TRUE(k.maps.empty());
      EXPECT_FALSE(k.block_per_item);
    }
    EXPECT_NE(low.source.find("the fold takes the element loops, not the tile layer's wgmma attention pipeline: "),
              std::string::npos);
    EXPECT_NE(low.source.find(c.why), std::string::npos) << low.source.substr(0, 3000);
  }
  cuda::LowerOptions generic;
  cuda::set_matmul_option(generic, "generic");
  cuda::Lowered low = cuda::lower(
      compiled(spec, examples::resolve(spec, {"dtype=bf16", "S=512", "D=128", "BR=128", "BC=128"})), generic);
  EXPECT_FALSE(low.uses_tile_layer);
  EXPECT_NE(low.source.find("the fold takes the element loops, not the tile layer's wgmma attention pipeline: "
                            "MP_CUDA_LOWER_MATMUL=generic"),
            std::string::npos);
}

TEST(CudaLower, UncompiledProgramIsRejected) {
  auto& spec = examples::find_program("matmul");
  auto p = examples::build(spec, examples::resolve(spec, {}));
  try {
    cuda::lower(p);
    FAIL() << "expected a user_error";
  } catch (const user_error& e) {
    EXPECT_NE(std::string(e.what()).find("is not compiled: run the pass pipeline"), std::string::npos) << e.what();
  }
}

TEST(CudaLower, UnsupportedLoopIsNamed) {
  // Two carried values that swap every iteration: the in-order copies next -> arg cannot express it yet.
  ProgramBuilder b("swap");
  auto A = b.input("A", {16, 4});
  auto out = b.output("out", {1, 4});
  auto x = FILL({1, 4}, 1.0), y = FILL({1, 4}, 2.0);
  auto r = METAPIPE_FOLD(4, {x, y}, [&](Idx, const std::vector<Value>& s) -> std::vector<Value> {
    auto t = LOAD_TILE(A, {4, 4});
    (void)t;
    return {s[1], s[0]};
  });
  STORE_TILE(out, ZIP(r[0], r[1], [](Expr u, Expr v) { return u - v; }));
  ir::Program c = passes::compile(b.finish(), {});
  try {
    cuda::lower(c);
    FAIL() << "expected cuda_not_supported";
  } catch (const cuda::cuda_not_supported& e) {
    std::string m = e.what();
    EXPECT_EQ(m.rfind("not supported yet on cuda: MetaPipe #", 0), 0u) << m;
    EXPECT_NE(m.find(" in swap"), std::string::npos) << m;
  }
}

// The source of `name` at `sets` lowered with `o` (the GPU's defaults unless given).
std::string unit_of(const std::string& name, const std::vector<std::string>& sets,
                    const cuda::LowerOptions& o = {}) {
  auto& spec = examples::find_program(name);
  return cuda::lower(compiled(spec, examples::resolve(spec, sets)), o).source;
}
// "N slots per tile" of the first tile ring in `src` (cp.async or bulk copies), 0 without one.
int ring_slots(const std::string& src) {
  auto at = src.find("// path: tile ring (");
  if (at == std::string::npos) return 0;
  at = src.find("), ", at);
  return std::stoi(src.substr(at + 3));
}

TEST(CudaLower, RingDepthFollowsTheSpeedOptions) {
  // softmax's rows of 1,024 at 16 rows a tile (64 KiB): two slots would leave one block of 512 threads
  // per SM instead of two, over a body of several passes: auto keeps the direct path and says why.
  // (the tile path, MP_CUDA_LOWER_ROWS=tile: by default softmax's rows are in registers, no ring)
  const std::vector<std::string> rows16 = {"R=16384", "C=1024", "row_tile=16", "mask=1"};
  cuda::LowerOptions tile;
  tile.warp_rows = false;
  std::string src = unit_of("softmax", rows16, tile);
  EXPECT_EQ(ring_slots(src), 0);
  EXPECT_NE(src.find("no tile ring: 2 slots would leave 1 block(s) per SM instead of the direct path's 2"),
            std::string::npos);
  cuda::LowerOptions per_sm = tile;
  cuda::set_ring_option(per_sm, "128");
  src = unit_of("softmax", rows16, per_sm);
  EXPECT_EQ(ring_slots(src), 3)
      << "128 KiB per SM at one block: two 64 KiB tiles in flight beyond the one computed on";
  EXPECT_NE(src.find("(asked: 128)"), std::string::npos);
  cuda::LowerOptions off = tile;
  cuda::set_ring_option(off, "off");
  for (const char* name : {"dotproduct", "tpchq6", "blackscholes", "softmax"}) {
    SCOPED_TRACE(name);
    src = unit_of(name, {}, off);
    EXPECT_EQ(ring_slots(src), 0);
    EXPECT_NE(src.find("no tile ring: switched off (MP_CUDA_LOWER_RING=off)"), std::string::npos);
    EXPECT_NE(src.find("// path: direct tile copies"), std::string::npos);
  }
  // Smaller tiles, deeper rings: dotproduct's 2 x 8 KiB a block and 2 blocks per SM need 4 slots beyond
  // the one computed on for 64 KiB per SM; 4096 KiB asks for as many as fit (at most 8).
  EXPECT_EQ(ring_slots(unit_of("dotproduct", {"N=16777216", "TS=2048"})), 3);
  EXPECT_EQ(ring_slots(unit_of("dotproduct", {"N=16777216", "TS=1024"})), 5);
  cuda::LowerOptions deep;
  cuda::set_ring_option(deep, "4096");
  EXPECT_EQ(ring_slots(unit_of("dotproduct", {"N=16777216", "TS=1024"}, deep)), 8);
  // The host units of the deep variants (run against the interpreter by CudaLowerHostVariant) are deep.
  for (auto& v : cuda_test::variants()) {
    if (v.name.find("ring_deep") == std::string::npos) continue;
    SCOPED_TRACE(v.name);
    const std::string u = unit_of(v.program, v.sets, cuda_test::host_options(v));
    EXPECT_GT(ring_slots(u), 4);
    // One barrier per iteration by default (wait, barrier, issue); two with MP_CUDA_LOWER_BARRIERS=2.
    EXPECT_EQ(u.find("iteration mp_k - 1 is done everywhere") != std::string::npos, v.barriers != 2);
    EXPECT_EQ(u.find("is read no more: the next issue refills it") != std::string::npos, v.barriers == 2);
  }
  // 256 threads: four blocks per SM by registers, a shallower ring for the same bytes per SM.
  cuda::LowerOptions t256;
  t256.threads = 256;
  src = unit_of("dotproduct", {"N=16777216", "TS=2048"}, t256);
  EXPECT_NE(src.find("__launch_bounds__(256, 4)"), std::string::npos);
  EXPECT_EQ(ring_slots(src), 2);
}

TEST(CudaLower, SpeedOptionsComeFromTheEnvironment) {
  cuda::LowerOptions o;
  cuda::set_ring_option(o, "off");
  EXPECT_EQ(o.ring, cuda::LowerOptions::Ring::Off);
  cuda::set_ring_option(o, "96");
  EXPECT_EQ(o.ring, cuda::LowerOptions::Ring::PerSm);
  EXPECT_EQ(o.ring_kib_per_sm, 96);
  cuda::set_ring_option(o, "auto");
  EXPECT_EQ(o.ring, cuda::LowerOptions::Ring::Auto);
  for (const char* bad : {"", "0", "-4", "12k", "99999", "on"}) {
    try {
      cuda::set_ring_option(o, bad);
      ADD_FAILURE() << "accepted MP_CUDA_LOWER_RING=" << bad;
    } catch (const user_error& e) {
      EXPECT_NE(std::string(e.what()).find("is not one of off, auto or a number of KiB per SM"),
                std::string::npos)
          << e.what();
    }
  }
  setenv("MP_CUDA_LOWER_RING", "off", 1);
  setenv("MP_CUDA_LOWER_THREADS", "256", 1);
  setenv("MP_CUDA_LOWER_FUSE", "off", 1);
  cuda::LowerOptions env = cuda::options_from_env();
  EXPECT_EQ(env.ring, cuda::LowerOptions::Ring::Off);
  EXPECT_EQ(env.threads, 256);
  EXPECT_FALSE(env.fuse_elementwise);
  setenv("MP_CUDA_LOWER_THREADS", "100", 1);
  try {
    (void)cuda::options_from_env();
    ADD_FAILURE() << "accepted MP_CUDA_LOWER_THREADS=100";
  } catch (const user_error& e) {
    EXPECT_NE(std::string(e.what()).find("MP_CUDA_LOWER_THREADS='100' is not a multiple of 32"),
              std::string::npos)
        << e.what();
  }
  setenv("MP_CUDA_LOWER_THREADS", "256", 1);
  setenv("MP_CUDA_LOWER_BARRIERS", "2", 1);
  EXPECT_FALSE(cuda::options_from_env().one_barrier_ring);
  setenv("MP_CUDA_LOWER_BARRIERS", "3", 1);
  try {
    (void)cuda::options_from_env();
    ADD_FAILURE() << "accepted MP_CUDA_LOWER_BARRIERS=3";
  } catch (const user_error& e) {
    EXPECT_NE(std::string(e.what()).find("MP_CUDA_LOWER_BARRIERS='3' is not 1 or 2"), std::string::npos)
        << e.what();
  }
  unsetenv("MP_CUDA_LOWER_BARRIERS");
  cuda::set_copy_option(o, "bulk");
  EXPECT_EQ(o.copy, cuda::LowerOptions::Copy::Bulk);
  cuda::set_copy_option(o, "cp");
  EXPECT_EQ(o.copy, cuda::LowerOptions::Copy::Cp);
  for (const char* bad : {"", "tma", "Bulk", "cp.async", "on"}) {
    try {
      cuda::set_copy_option(o, bad);
      ADD_FAILURE() << "accepted MP_CUDA_LOWER_COPY=" << bad;
    } catch (const user_error& e) {
      EXPECT_NE(std::string(e.what()).find("' is not cp or bulk"), std::string::npos) << e.what();
    }
  }
  setenv("MP_CUDA_LOWER_COPY", "bulk", 1);
  EXPECT_EQ(cuda::options_from_env().copy, cuda::LowerOptions::Copy::Bulk);
  setenv("MP_CUDA_LOWER_COPY", "tma", 1);
  try {
    (void)cuda::options_from_env();
    ADD_FAILURE() << "accepted MP_CUDA_LOWER_COPY=tma";
  } catch (const user_error& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("MP_CUDA_LOWER_COPY='tma' is not cp or bulk"), std::string::npos) << m;
    EXPECT_EQ(m.find('\n'), std::string::npos) << m;
  }
  unsetenv("MP_CUDA_LOWER_COPY");
  setenv("MP_CUDA_LOWER_ROWS", "tile", 1);
  setenv("MP_CUDA_LOWER_STORE", "scalar", 1);
  env = cuda::options_from_env();
  EXPECT_FALSE(env.warp_rows);
  EXPECT_FALSE(env.vector_stores);
  setenv("MP_CUDA_LOWER_ROWS", "warp", 1);
  setenv("MP_CUDA_LOWER_STORE", "vec", 1);
  env = cuda::options_from_env();
  EXPECT_TRUE(env.warp_rows);
  EXPECT_TRUE(env.vector_stores);
  setenv("MP_CUDA_LOWER_PREFETCH", "off", 1);
  EXPECT_FALSE(cuda::options_from_env().prefetch);
  unsetenv("MP_CUDA_LOWER_PREFETCH");
  setenv("MP_CUDA_LOWER_PRODUCER", "thread", 1);
  EXPECT_FALSE(cuda::options_from_env().producer_warp);
  setenv("MP_CUDA_LOWER_PRODUCER", "warp", 1);
  EXPECT_TRUE(cuda::options_from_env().producer_warp);
  unsetenv("MP_CUDA_LOWER_PRODUCER");
  EXPECT_TRUE(cuda::options_from_env().fast_math);  // the default
  setenv("MP_CUDA_LOWER_MATH", "exact", 1);
  EXPECT_FALSE(cuda::options_from_env().fast_math);
  setenv("MP_CUDA_LOWER_MATH", "fast", 1);
  EXPECT_TRUE(cuda::options_from_env().fast_math);
  unsetenv("MP_CUDA_LOWER_MATH");
  for (auto [name, bad, why] :
       {std::tuple{"MP_CUDA_LOWER_ROWS", "on", "MP_CUDA_LOWER_ROWS='on' is not warp or tile"},
        std::tuple{"MP_CUDA_LOWER_STORE", "16", "MP_CUDA_LOWER_STORE='16' is not vec or scalar"},
        std::tuple{"MP_CUDA_LOWER_PREFETCH", "no", "MP_CUDA_LOWER_PREFETCH='no' is not on or off"},
        std::tuple{"MP_CUDA_LOWER_PRODUCER", "warps", "MP_CUDA_LOWER_PRODUCER='warps' is not warp or thread"},
        std::tuple{"MP_CUDA_LOWER_MATH", "ieee", "MP_CUDA_LOWER_MATH='ieee' is not fast or exact"}}) {
    setenv(name, bad, 1);
    try {
      (void)cuda::options_from_env();
      ADD_FAILURE() << "accepted " << name << "=" << bad;
    } catch (const user_error& e) {
      EXPECT_NE(std::string(e.what()).find(why), std::string::npos) << e.what();
    }
    unsetenv(name);
  }
  unsetenv("MP_CUDA_LOWER_ROWS");
  unsetenv("MP_CUDA_LOWER_STORE");
  setenv("MP_CUDA_LOWER_FUSE", "yes", 1);
  EXPECT_THROW((void)cuda::options_from_env(), user_error);
  unsetenv("MP_CUDA_LOWER_RING");
  unsetenv("MP_CUDA_LOWER_THREADS");
  unsetenv("MP_CUDA_LOWER_FUSE");
  env = cuda::options_from_env();
  EXPECT_EQ(env.ring, cuda::LowerOptions::Ring::Auto);
  EXPECT_EQ(env.threads, 512);
  EXPECT_TRUE(env.fuse_elementwise);
  EXPECT_TRUE(env.one_barrier_ring);
  EXPECT_EQ(env.copy, cuda::LowerOptions::Copy::Bulk);
  EXPECT_TRUE(env.warp_rows);
  EXPECT_TRUE(env.vector_stores);
  EXPECT_TRUE(env.prefetch);
  EXPECT_FALSE(env.producer_warp);
}

TEST(CudaLower, StreamingLoopsTakeTheBulkCopyRing) {
  // MP_CUDA_LOWER_COPY=bulk: the same rings at the same depths, each slot filled by one thread's bulk
  // copies (one per tile) that complete on the slot's mbarrier, every thread waiting for its phase; the
  // masked tails as plain loads; no cp.async in the loop.
  // (softmax on its tile path, MP_CUDA_LOWER_ROWS=tile)
  // (thread 0 issuing, MP_CUDA_LOWER_PRODUCER=thread: the producer warp is ProducerWarpFillsTheBulkCopyRing)
  cuda::LowerOptions bulk, cpo, tile;
  cuda::set_copy_option(bulk, "bulk");
  cuda::set_copy_option(cpo, "cp");
  bulk.warp_rows = cpo.warp_rows = tile.warp_rows = false;
  bulk.producer_warp = cpo.producer_warp = tile.producer_warp = false;
  for (const char* name : {"dotproduct", "tpchq6", "blackscholes", "softmax", "outerproduct"}) {
    SCOPED_TRACE(name);
    const std::string cp = unit_of(name, {}, cpo), src = unit_of(name, {}, bulk);
    EXPECT_EQ(unit_of(name, {}, tile), src) << "bulk copies are the default";
    EXPECT_NE(src.find("// path: tile ring (bulk copies (TMA)), "), std::string::npos);
    EXPECT_EQ(src.find("// path: tile ring (cp.async)"), std::string::npos);
    EXPECT_EQ(ring_slots(src), ring_slots(cp)) << "the depth does not depend on how the slots are filled";
    for (const char* s :
         {"mp_bar_init(mp_bar + s_, 1);", "mp_bar_fence_init();", "mp_bar_expect(b_, 16u * (unsigned)((n0_ >> 2)",
          "if (n0_ >= 4) mp_bulk_copy(d0_, g0_, 16u * (unsigned)(n0_ >> 2), b_);", "mp_bar_wait(mp_bar + mp_k % ",
          "mp_fence_proxy_async();", "for (int f_ = (n0_ & ~3) + threadIdx.x; f_ < n0_; f_ += blockDim.x) d0_[f_] = g0_[f_];",
          "a tile's last n % 4 elements (a masked tail) are plain loads", "__syncthreads();  // ... and every thread's",
          // the prelude's PTX
          "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes", "mbarrier.try_wait.parity",
          "mbarrier.arrive.expect_tx", "fence.proxy.async.shared::cta", "fence.mbarrier_init"})
      EXPECT_NE(src.find(s), std::string::npos) << s;
    EXPECT_EQ(src.find("mp_cp_async16(d_"), std::string::npos);
    EXPECT_EQ(src.find("mp_cp_wait<"), std::string::npos);
    EXPECT_EQ(src.find("mp_cp_commit();"), std::string::npos);
    EXPECT_NE(cp.find("mp_cp_wait<0>();"), std::string::npos) << "MP_CUDA_LOWER_COPY=cp: the cp.async ring";
  }
  // Tiles the ring cannot serve stay on the direct path with bulk copies too.
  EXPECT_EQ(unit_of("dotproduct", {"N=1000", "TS=126", "mask=1"}, bulk).find("// path: tile ring"),
            std::string::npos);
  // The host units of the bulk variants take that path, and run against the interpreter with one block
  // (every iteration on it: each slot's mbarrier through many phases) and two.
  uint64_t seed = fresh_seed() % 1000000;
  int ran = 0;
  for (auto& v : cuda_test::variants()) {
    if (v.copy != "bulk") continue;
    SCOPED_TRACE(v.name);
    EXPECT_GT(ring_slots(unit_of(v.program, v.sets, cuda_test::host_options(v))), 1);
    EXPECT_NE(unit_of(v.program, v.sets, cuda_test::host_options(v)).find("path: tile ring (bulk copies (TMA))"),
              std::string::npos);
    for (int grid : {1, 2}) check_on_host(v.name, v.program, v.sets, grid, seed, cuda_test::host_options(v));
    ++ran;
  }
  EXPECT_GE(ran, 5);
}

// The text of the kernel of `src` whose comment block contains `marker`, from its entry to its end.
std::string kernel_with(const std::string& src, const std::string& marker) {
  auto at = src.find(marker);
  if (at == std::string::npos) return "";
  auto begin = src.find("__global__ void", at);
  auto end = src.find("\n}\n", begin);
  return begin == std::string::npos ? "" : src.substr(begin, end - begin);
}

TEST(CudaLower, ProducerWarpFillsTheBulkCopyRing) {
  // MP_CUDA_LOWER_PRODUCER=warp (not the default yet): every ring of bulk copies gets one more warp per block,
  // the producer, which waits for a slot's "empty" mbarrier and issues the next iteration's tails and
  // bulk copies on its "full" one; the computing warps wait on "full", compute, and arrive on "empty".
  // After the mbarriers' initialization no block-wide barrier is left in the kernel: the loop body's
  // barriers are the computing warps' named barrier, and the element loops stride by their count.
  cuda::LowerOptions def, thread0;
  def.warp_rows = thread0.warp_rows = false;  // (softmax on its tile path, where it rings)
  def.producer_warp = true;
  thread0.producer_warp = false;
  struct Case {
    const char* name;
    std::vector<std::string> sets;
  };
  for (const Case& c : std::vector<Case>{{"dotproduct", {}},
                                         {"tpchq6", {}},
                                         {"blackscholes", {}},
                                         {"softmax", {}},
                                         {"outerproduct", {}},
                                         {"flash_attention", {}},
                                         {"matmul", {"dtype=f32"}}}) {
    SCOPED_TRACE(c.name);
    auto& spec = examples::find_program(c.name);
    cuda::Lowered low = cuda::lower(compiled(spec, examples::resolve(spec, c.sets)), def);
    const std::string& src = low.source;
    const std::string k = kernel_with(src, "; filled by a producer warp, up to ");
    ASSERT_FALSE(k.empty()) << "the ring's kernel names the producer path in its comment";
    EXPECT_EQ(ring_slots(src), ring_slots(unit_of(c.name, c.sets, thread0))) << "the same depth as thread 0's ring";
    EXPECT_NE(src.find("// producer warp: the block's last warp (threads 512..543)"), std::string::npos);
    EXPECT_NE(k.find("__launch_bounds__(544, "), std::string::npos);
    bool has_544 = false;
    for (auto& kl : low.kernels) has_544 = has_544 || kl.threads == 544;
    EXPECT_TRUE(has_544) << "the launch has the producer warp's 32 threads more";
    const auto split = k.find("if (threadIdx.x >= 512) {  // the producer warp");
    ASSERT_NE(split, std::string::npos);
    const std::string before = k.substr(0, split), after = k.substr(split);
    EXPECT_NE(before.find("__syncthreads();  // the mbarriers initialized before anyone uses them"), std::string::npos);
    EXPECT_EQ(after.find("__syncthreads()"), std::string::npos) << "no block-wide barrier in or after the ring loop";
    EXPECT_EQ(after.find("blockDim.x"), std::string::npos) << "the computing warps stride by their own count";
    for (const char* s : {"mp_bar_init(mp_bar + s_, 1);", "mp_bar_init(mp_bar + ", ", 16);  // one arrival per computing warp",
                          "mp_bar_wait(mp_bar + mp_k % ", "(unsigned)(mp_k / ", " - 1) & 1u);",
                          "f_ += 32) d0_[f_] = g0_[f_];  // masked tail",
                          "__syncwarp();  // the lanes' tail stores before lane 0's arrival",
                          "if (lane_ == 0) {", "mp_bar_expect(b_, 16u * (unsigned)((n0_ >> 2)",
                          "if (n0_ >= 4) mp_bulk_copy(d0_, g0_, 16u * (unsigned)(n0_ >> 2), b_);",
                          "} else {  // the computing warps", "__syncwarp();  // the warp has left slot mp_k % ",
                          "if ((threadIdx.x & 31) == 0) mp_bar_arrive(mp_bar + ",
                          "mp_sync_consumers(512u);  // the last iteration done in every computing warp"})
      EXPECT_NE(k.find(s), std::string::npos) << s;
    // the prelude's PTX
    for (const char* s : {"mbarrier.arrive.release.cta.shared::cta.b64 _, [%0];", "bar.sync 1, %0;"})
      EXPECT_NE(src.find(s), std::string::npos) << s;
    // thread 0 issuing (MP_CUDA_LOWER_PRODUCER=thread): no producer warp, no named barrier.
    const std::string t = unit_of(c.name, c.sets, thread0);
    EXPECT_EQ(t.find("filled by a producer warp"), std::string::npos);
    EXPECT_EQ(t.find("mp_sync_consumers(512u)"), std::string::npos);
    EXPECT_NE(t.find("// no producer warp: switched off (MP_CUDA_LOWER_PRODUCER=thread)."), std::string::npos);
  }
  // Results written over a ring tile (softmax's quotient and exp live in the slot): the computing
  // threads fence the generic proxy before arriving on "empty".
  EXPECT_NE(kernel_with(unit_of("softmax", {}, def), "; filled by a producer warp")
                .find("mp_fence_proxy_async();  // this thread's stores to the slot before the bulk copies that refill it"),
            std::string::npos);
  // A block of 1,024 threads has no room for the producer warp: thread 0 issues, and the unit says why.
  cuda::LowerOptions big = def;
  big.threads = 1024;
  const std::string b = unit_of("blackscholes", {}, big);
  EXPECT_EQ(b.find("filled by a producer warp"), std::string::npos);
  EXPECT_NE(b.find("// no producer warp: a block of 1024 threads leaves no room for a 33rd warp."), std::string::npos);
  // cp.async rings have no producer warp.
  cuda::LowerOptions cp = def;
  cuda::set_copy_option(cp, "cp");
  EXPECT_EQ(unit_of("dotproduct", {}, cp).find("filled by a producer warp"), std::string::npos);
  // The host units of the producer variants take the path and run against the interpreter with one
  // block (every iteration on it: the producer waits for "empty" from the (N + 1)-th on) and two.
  uint64_t seed = fresh_seed() % 1000000;
  int ran = 0;
  for (auto& v : cuda_test::variants()) {
    if (v.producer != "warp") continue;
    SCOPED_TRACE(v.name);
    const std::string u = unit_of(v.program, v.sets, cuda_test::host_options(v));
    EXPECT_NE(u.find("; filled by a producer warp, up to "), std::string::npos);
    const std::string k = kernel_with(u, "; filled by a producer warp, up to ");
    EXPECT_EQ(k.substr(k.find("// the producer warp")).find("__syncthreads()"), std::string::npos);
    for (int grid : {1, 2}) check_on_host(v.name, v.program, v.sets, grid, seed, cuda_test::host_options(v));
    ++ran;
  }
  EXPECT_GE(ran, 10);
}

TEST(CudaLower, HostBulkCopiesLandAtIssueOrAtTheWait) {
  // The host's bulk copies (cuda_lower_host.h), which the bulk-copy units above run on: a phase's copies
  // land only when a thread waits for it (a read before the wait sees the poison) or, every other phase,
  // at issue (a slot refilled too early shows the later data); a misaligned copy, more bytes than
  // announced and a wait on what is no mbarrier are errors.
  mp_host::bars.clear();
  alignas(16) float src[8] = {1, 2, 3, 4, 5, 6, 7, 8};
  alignas(16) float dst[8];
  alignas(8) unsigned long long bar = 0;
  auto poison = [&] { std::fill(std::begin(dst), std::end(dst), std::nanf("")); };
  auto wait = [&](unsigned parity) {
    while (!mp_bar_try_wait(&bar, parity)) {
    }
  };
  mp_bar_init(&bar, 1);
  poison();
  mp_bar_expect(&bar, 32);
  mp_bulk_copy(dst, src, 32, &bar);
  EXPECT_TRUE(std::isnan(dst[0])) << "phase 0 lands at its wait";
  wait(0);
  EXPECT_EQ(std::vector<float>(dst, dst + 8), std::vector<float>(src, src + 8));
  poison();
  mp_bar_expect(&bar, 16);
  mp_bulk_copy(dst + 4, src + 4, 16, &bar);
  EXPECT_EQ(dst[4], 5.f) << "phase 1 lands at issue";
  EXPECT_TRUE(std::isnan(dst[0]));
  wait(1);
  EXPECT_FALSE(mp_host::bad_bulk.exchange(false));
  mp_bar_expect(&bar, 16);
  mp_bulk_copy(dst + 1, src, 16, &bar);  // not 16-byte aligned
  wait(0);
  EXPECT_TRUE(mp_host::bad_bulk.exchange(false));
  mp_bar_expect(&bar, 16);
  mp_bulk_copy(dst, src, 16, &bar);
  mp_bulk_copy(dst + 4, src + 4, 16, &bar);  // 32 bytes on a phase that expects 16
  EXPECT_TRUE(mp_host::bad_bulk.exchange(false));
  unsigned long long other = 0;
  EXPECT_TRUE(mp_bar_try_wait(&other, 0));
  EXPECT_TRUE(mp_host::bad_bulk.exchange(false)) << "no mbarrier there";
  mp_host::bars.clear();
}

TEST(CudaLower, ElementwiseChainsFuse) {
  // dotproduct's product and tpchq6's predicate are computed in their Reduce's loop, the running sums
  // kept in registers over the iterations; flash attention's [BR, 1] chain of Zips has no barrier between
  // its links. MP_CUDA_LOWER_FUSE=off emits every node on its own (all run on the host: the variants).
  cuda::LowerOptions nofuse;
  nofuse.fuse_elementwise = false;
  for (const char* name : {"dotproduct", "tpchq6"}) {
    SCOPED_TRACE(name);
    std::string src = unit_of(name, {});
    EXPECT_NE(src.find("its only reader: never stored"), std::string::npos);
    EXPECT_NE(src.find("the running sum stays in the threads' registers"), std::string::npos);
    EXPECT_NE(src.find("this block's partial += the threads' register sums"), std::string::npos);
    EXPECT_NE(src.find("(the ring's next barrier keeps what this read from being rewritten)"), std::string::npos)
        << "thread 0 filling the ring (the default)";
    cuda::LowerOptions warp;
    warp.producer_warp = true;
    EXPECT_NE(unit_of(name, {}, warp).find(
                  "(it read ring slots only, kept until every computing warp arrives on their empty mbarrier)"),
              std::string::npos)
        << "the producer warp's ring";
    src = unit_of(name, {}, nofuse);
    EXPECT_EQ(src.find("its only reader: never stored"), std::string::npos);
    EXPECT_EQ(src.find("mp_facc"), std::string::npos);
  }
  EXPECT_NE(unit_of("flash_attention", sets_of("flash_attention")).find("// no barrier here: Zip #"),
            std::string::npos);
  // The last Map / Zip of a stage goes straight to the StoreTile that starts the next (blackscholes'
  // price, softmax's quotient on its tile path, outerproduct's product); with fusion off it is stored in
  // shared memory.
  cuda::LowerOptions tile;
  tile.warp_rows = nofuse.warp_rows = false;
  for (const char* name : {"blackscholes", "softmax", "outerproduct"}) {
    SCOPED_TRACE(name);
    EXPECT_NE(unit_of(name, {}, tile).find("'s elements, computed here "), std::string::npos);
    EXPECT_EQ(unit_of(name, {}, nofuse).find("computed here "), std::string::npos);
  }
  EXPECT_EQ(unit_of("flash_attention", sets_of("flash_attention"), nofuse).find("// no barrier here"),
            std::string::npos);
  // The register sums over 1 and 2 blocks (many iterations each) against the interpreter.
  uint64_t seed = fresh_seed() % 1000000;
  for (auto& v : cuda_test::variants())
    if (v.name == "tpchq6_ring_deep")
      for (int grid : {1, 2})
        check_on_host(v.name, v.program, v.sets, grid, seed, cuda_test::host_options(v));
}

TEST(CudaLower, RowsInRegisters) {
  // softmax's loop body works row by row: by default (MP_CUDA_LOWER_ROWS=warp) each warp takes whole
  // rows, its registers hold them (float4 loads where C is a multiple of 4), the row sum is a warp
  // shuffle tree, the quotient goes from the registers to Y; no shared memory for the values and no
  // block barrier. MP_CUDA_LOWER_ROWS=tile is the tile path. The host variants (softmax_rows_*) run it
  // against the interpreter; here over 1, 2 and 3 blocks.
  const std::vector<std::string> rows16 = {"R=16384", "C=1024", "row_tile=16", "mask=1"};
  auto& spec = examples::find_program("softmax");
  cuda::Lowered low = cuda::lower(compiled(spec, examples::resolve(spec, rows16)));
  ASSERT_EQ(low.kernels.size(), 1u);
  const std::string& src = low.source;
  EXPECT_NE(src.find("// path: rows in registers: each warp takes whole rows of the tiles (16 x 1024), 32 registers"),
            std::string::npos);
  EXPECT_NE(src.find("    q_ = *(const float4*)(g_ + c_);\n"), std::string::npos) << "no check: 1024 columns, 8 chunks a lane";
  EXPECT_NE(src.find("*(float4*)(g_ + c_) = q_;"), std::string::npos);
  EXPECT_NE(src.find("__shfl_xor_sync(0xffffffffu, acc_, d_)"), std::string::npos);
  EXPECT_NE(src.find("for (int t_ = (int)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5); t_ < 16384;"),
            std::string::npos);
  const std::string kernel = src.substr(src.find("extern \"C\" __global__"));
  EXPECT_EQ(kernel.find("__syncthreads"), std::string::npos) << "no block barrier in the row-wise kernel";
  EXPECT_EQ(kernel.find("mp_smem + "), std::string::npos) << "no value in shared memory";
  EXPECT_LT(low.kernels[0].smem_bytes, 1024);
  EXPECT_NE(src.find("__launch_bounds__(512, 2)"), std::string::npos);
  // One element a chunk where C is not a multiple of 4; the tile path where switched off or where a row
  // would take more than 32 registers a lane.
  EXPECT_NE(unit_of("softmax", {"R=40", "C=130", "row_tile=16", "mask=1"}).find("4-byte loads and stores"),
            std::string::npos);
  cuda::LowerOptions tile;
  tile.warp_rows = false;
  EXPECT_EQ(unit_of("softmax", rows16, tile).find("path: rows in registers"), std::string::npos);
  std::string wide = unit_of("softmax", {"R=64", "C=2048", "row_tile=4", "mask=1"});
  EXPECT_EQ(wide.find("path: rows in registers"), std::string::npos);
  EXPECT_NE(wide.find("not rows in registers: C=2048 (more than 32 registers per lane a row"), std::string::npos);
  // Loops that are not row-wise say why (dotproduct's fold is not considered; blackscholes has no Reduce).
  EXPECT_NE(unit_of("blackscholes", {}).find("not rows in registers: "), std::string::npos);
  uint64_t seed = fresh_seed() % 1000000;
  for (int grid : {1, 2, 3}) check_on_host("softmax", "softmax", sets_of("softmax"), grid, seed);
  // The host variants of softmax take it unless they ask for the tile path.
  int rows = 0;
  for (auto& v : cuda_test::variants()) {
    if (v.program != "softmax") continue;
    const bool on = unit_of(v.program, v.sets, cuda_test::host_options(v)).find("path: rows in registers") !=
                    std::string::npos;
    EXPECT_EQ(on, v.rows != "tile") << v.name;
    rows += on ? 1 : 0;
  }
  EXPECT_GE(rows, 4);
}

TEST(CudaLower, FusedStoresAre16Bytes) {
  // A Map / Zip computed in its StoreTile into an f32 tensor: four consecutive elements a thread, one
  // float4 store where they are within the extents and aligned, else element by element
  // (MP_CUDA_LOWER_STORE=scalar: one element a thread, 4-byte stores). blackscholes' price keeps one
  // element a thread (its element function is too large to compute four at once in registers).
  cuda::LowerOptions tile, scalar;
  tile.warp_rows = scalar.warp_rows = false;
  scalar.vector_stores = false;
  for (const char* name : {"softmax", "outerproduct"}) {
    SCOPED_TRACE(name);
    std::string src = unit_of(name, {}, tile);
    EXPECT_NE(src.find("'s elements, computed here four at a time and stored to "), std::string::npos);
    EXPECT_NE(src.find("if (x1b_ + 4 <= c1_ && (g_ & 3) == 0) {"), std::string::npos);
    EXPECT_NE(src.find("mp_st4(T"), std::string::npos) << "the 16-byte store in PTX";
    src = unit_of(name, {}, scalar);
    EXPECT_EQ(src.find("four at a time"), std::string::npos);
    EXPECT_NE(src.find("'s elements, computed here and stored to "), std::string::npos);
  }
  EXPECT_EQ(unit_of("blackscholes", {}).find("four at a time"), std::string::npos);
  EXPECT_NE(unit_of("blackscholes", {}).find("'s elements, computed here and stored to price"), std::string::npos);
  uint64_t seed = fresh_seed() % 1000000;
  for (auto& v : cuda_test::variants())
    if (v.name == "outerproduct_vec_odd_rows" || v.name == "outerproduct_store_scalar")
      for (int grid : {1, 2})
        check_on_host(v.name, v.program, v.sets, grid, seed, cuda_test::host_options(v));
}

TEST(CudaLower, F32DivisionIsTheHardwaresApproximationUnlessExact) {
  // LowerOptions::fast_math (the default): blackscholes' divisions, reciprocals and square root go through
  // the prelude's div.full / rcp.approx / sqrt.approx helpers; exact: the C++ operators (IEEE rounded),
  // and the helpers, though still in the prelude, are called nowhere. The element loops test 32-bit
  // extents, hoisted before the loop.
  cuda::LowerOptions exact;
  exact.fast_math = false;
  const std::string fast = unit_of("blackscholes", {}), ieee = unit_of("blackscholes", {}, exact);
  EXPECT_NE(fast.find("asm(\"div.full.f32 %0, %1, %2;\""), std::string::npos);
  EXPECT_NE(fast.find("= mp_fdiv(t"), std::string::npos);
  EXPECT_NE(fast.find("= mp_frcp(t"), std::string::npos);
  EXPECT_NE(fast.find("mp_fsqrt(a"), std::string::npos);
  EXPECT_EQ(ieee.find("= mp_fdiv("), std::string::npos);
  EXPECT_EQ(ieee.find("= mp_frcp("), std::string::npos);
  EXPECT_NE(ieee.find("= (1.0f / t"), std::string::npos);
  EXPECT_NE(ieee.find("sqrtf(a"), std::string::npos);
  EXPECT_NE(fast.find("const int xe0_ = (int)mp_clip("), std::string::npos);
  EXPECT_NE(fast.find(" >= xe0_) continue;"), std::string::npos);
  // f64 arithmetic stays exact (a double term never takes the helpers).
  EXPECT_EQ(fast.find("mp_fdiv((double)"), std::string::npos);
}

TEST(CudaLower, InnerLoopTilesArePrefetched) {
  // outerproduct's inner loop loads a [1, TN] tile of B per iteration: by default each thread loads its
  // four elements of the next iteration's tile into registers after this iteration's copy, and writes
  // them into the tile at the top of the next (MP_CUDA_LOWER_PREFETCH=off: every iteration loads its own
  // tile first). Tiles of more than four elements per thread are not prefetched.
  const std::vector<std::string> big = {"M=8192", "N=8192", "TM=64", "TN=256"};
  std::string src = unit_of("outerproduct", big);
  EXPECT_NE(src.find("the next iteration's tiles are loaded into registers while this one computes: LoadTile #10 (B)"),
            std::string::npos);
  EXPECT_NE(src.find("'s tile, in flight during this one"), std::string::npos);
  EXPECT_NE(src.find("the tile the previous iteration prefetched into registers"), std::string::npos);
  cuda::LowerOptions off;
  off.prefetch = false;
  EXPECT_EQ(unit_of("outerproduct", big, off).find("prefetched"), std::string::npos);
  cuda::LowerOptions t32;
  t32.threads = 32;  // 128 elements at most: a tile of 256 is not prefetched
  EXPECT_EQ(unit_of("outerproduct", big, t32).find("prefetched"), std::string::npos);
  uint64_t seed = fresh_seed() % 1000000;
  for (auto& v : cuda_test::variants())
    if (v.name == "outerproduct_prefetch_odd" || v.name == "outerproduct_prefetch_off") {
      SCOPED_TRACE(v.name);
      EXPECT_EQ(unit_of(v.program, v.sets, cuda_test::host_options(v)).find("prefetched into registers") !=
                    std::string::npos,
                v.prefetch != "off");
      for (int grid : {1, 2}) check_on_host(v.name, v.program, v.sets, grid, seed, cuda_test::host_options(v));
    }
}

TEST(CudaLower, BadThreadCountIsAUserError) {
  auto& spec = examples::find_program("softmax");
  auto c = compiled(spec, examples::resolve(spec, {}));
  cuda::LowerOptions o;
  o.threads = 100;
  EXPECT_THROW(cuda::lower(c, o), user_error);
}

TEST(CudaLower, RunWithoutGpuIsOneLineError) {
  std::string why;
  if (cuda::available(&why)) GTEST_SKIP() << "a CUDA GPU is present (SM90_CudaLower runs the programs)";
  EXPECT_FALSE(why.empty());
  auto& spec = examples::find_program("softmax");
  auto params = examples::resolve(spec, {});
  auto c = compiled(spec, params);
  ir::Memory mem = ir::make_memory(c, examples::make_inputs(spec, params, examples::build(spec, params), 1));
  try {
    cuda::run(c, mem);
    FAIL() << "expected a user_error";
  } catch (const user_error& e) {
    std::string m = e.what();
    EXPECT_EQ(m.rfind("no CUDA GPU: ", 0), 0u) << m;
    EXPECT_EQ(m.find('\n'), std::string::npos) << m;
  }
}

TEST(CudaLower, SourceHashAndCacheDir) {
  EXPECT_EQ(cuda::source_hash("a"), cuda::source_hash("a"));
  EXPECT_NE(cuda::source_hash("a"), cuda::source_hash("b"));
  EXPECT_EQ(cuda::source_hash("").size(), 16u);
  EXPECT_NE(cuda::default_cache_dir().find("metapipe/cuda"), std::string::npos);
}

TEST(CudaLower, DeviceBytesRoundTrip) {
  for (auto dt : {ir::DType::f32, ir::DType::bf16, ir::DType::f16, ir::DType::i32}) {
    std::vector<float> x = {1.5f, -2.0f, 0.25f, 7.0f, -3.0f};
    if (dt == ir::DType::i32) x = {1.f, -2.f, 0.f, 70000.f, -3.f};
    ir::HostTensor h{{5}, dt, x};
    auto b = cuda::to_device_bytes(h);
    EXPECT_EQ(b.size(), size_t(5 * cuda::device_bytes_of(dt)));
    ir::HostTensor back = h;
    std::fill(back.data.begin(), back.data.end(), 0.f);
    cuda::from_device_bytes(b, back);
    EXPECT_EQ(back.data, h.data) << ir::to_string(dt);
  }
}

}  // namespace
}  // namespace mp
