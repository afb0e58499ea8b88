// The CPU backends: the executor equals the interpreter (bit for bit: same node evaluations), its stages
// overlap, it reports busy / stall time, and it shuts down cleanly when a stage fails.
#include <gtest/gtest.h>

#include <cmath>

#include "backends/cpu/executor.h"
#include "backends/cpu/interpreter.h"
#include "front/front.h"
#include "passes/pipeline.h"
#include "tests/support/slide51.h"

using namespace mp;
using namespace mp::front;

namespace {

using mp::test::slide51;

ir::Program compiled(const ir::Program& p, bool masking = false) {
  passes::CompileOptions o;
  o.tile.masking = masking;
  return passes::compile(p, o);
}

}  // namespace

TEST(Cpu, ExecutorEqualsInterpreterAndNaiveMatmul) {
  const int64_t M = 70, N = 50, K = 24;  // tiles 32 x 16 do not divide: masked
  auto p = compiled(slide51(M, N, K, 32, 16), true);
  auto in = cpu::random_inputs(p, 42);
  auto m1 = cpu::make_memory(p, in), m2 = cpu::make_memory(p, in);
  cpu::interpret(p, m1);
  cpu::execute(p, m2);
  const auto &A = in.at("A"), &B = in.at("B");
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j) {
      double want = 0;
      for (int64_t k = 0; k < K; ++k) want += double(A[i * K + k]) * B[k * N + j];
      ASSERT_NEAR(m1.at("C").data[i * N + j], want, 1e-5) << i << "," << j;
    }
  EXPECT_EQ(m1.at("C").data, m2.at("C").data);
}

TEST(Cpu, ThreeStagePipelineOverlaps) {
  // Four stages per row tile: load | element work | matmul | store, 16 iterations, two heavy stages, so
  // iteration i+1 of the element stage runs while the matmul stage works on iteration i.
  ProgramBuilder b("overlap");
  auto X = b.input("X", {512, 128});
  auto W = b.input("W", {128, 128});
  auto Y = b.output("Y", {512, 128});
  auto w = LOAD(W);
  auto y = MAP(LOAD(X), [](Expr v) {
    Expr r = v;
    for (int k = 0; k < 12; ++k) r = sin(r) * 0.9 + 0.1;  // a chain, not a tree: 36 ops per element
    return r;
  });
  STORE(Y, MAT_MUL(y, w));
  passes::CompileOptions o;
  o.tile.row_tile = 32;
  auto p = passes::compile(b.finish(), o);
  auto in = cpu::random_inputs(p, 1);
  auto mem = cpu::make_memory(p, in);
  // Overlap needs two stage threads inside their work at the same moment; on a loaded machine one run
  // may be scheduled stage after stage, so give it a few runs.
  cpu::ExecReport rep;
  for (int attempt = 0; attempt < 5; ++attempt) {
    mem = cpu::make_memory(p, in);
    rep = cpu::execute(p, mem);
    if (!rep.loops.empty() && rep.loops[0].overlap_ms > 0) break;
  }
  ASSERT_EQ(rep.loops.size(), 1u);
  EXPECT_GE(rep.loops[0].stages, 3);
  EXPECT_GT(rep.loops[0].overlap_ms, 0.0) << rep.format();
  // Every stage ran every iteration, and the report names them.
  for (auto& s : rep.stages) EXPECT_EQ(s.iterations, 16) << s.name;
  EXPECT_NE(rep.format().find("stall in ms"), std::string::npos);
  EXPECT_NE(rep.format().find("timeline of L"), std::string::npos) << rep.format();
  ASSERT_EQ(rep.loops[0].first_run.size(), size_t(rep.loops[0].stages));
  for (auto& st : rep.loops[0].first_run) EXPECT_EQ(st.size(), 16u);
  auto ref = cpu::make_memory(p, in);
  cpu::interpret(p, ref);
  EXPECT_EQ(ref.at("Y").data, mem.at("Y").data);
}

TEST(Cpu, FailingStageStopsThePipelineWithItsError) {
  ProgramBuilder b("badindex");
  auto T = b.input("T", {4, 8});
  auto I = b.input("I", {64, 1}, DType::i32);
  auto Y = b.output("Y", {64, 8});
  METAPIPE(8, [&]() { STORE_TILE(Y, MAP(GATHER(T, LOAD_TILE(I, {8, 1})), [](Expr v) { return v + 1.0; })); });
  auto p = compiled(b.finish());
  auto in = cpu::random_inputs(p, 3);
  for (auto& v : in["I"]) v = 1;
  in["I"][40] = 9;  // out of range in iteration 5
  auto mem = cpu::make_memory(p, in);
  try {
    cpu::execute(p, mem);
    FAIL() << "expected an error";
  } catch (const user_error& e) {
    EXPECT_NE(std::string(e.what()).find("index 9 at row 0 is out of range [0, 4) of 'T'"), std::string::npos)
        << e.what();
  }
}

TEST(Cpu, ExecutorNeedsAMetapipelinedProgram) {
  auto p = slide51(64, 64, 16, 32, 32);
  auto mem = cpu::make_memory(p, cpu::random_inputs(p, 1));
  EXPECT_THROW(cpu::execute(p, mem), user_error);
}

TEST(Cpu, Bf16RoundingOnStore) {
  EXPECT_EQ(cpu::round_to(ir::DType::bf16, 1.0f), 1.0f);
  float x = 1.0f + 1.0f / 256;  // halfway between two bf16 values: rounds to even (1.0)
  EXPECT_EQ(cpu::round_to(ir::DType::bf16, x), 1.0f);
  EXPECT_EQ(cpu::round_to(ir::DType::bf16, 1.0f + 3.0f / 256), 1.0f + 4.0f / 256);
}

TEST(Cpu, WholeTensorMatMulIsRowTiledWithTheWeightLoadedOnce) {
  ProgramBuilder b("mlp");
  auto X = b.input("X", {96, 24});
  auto W = b.input("W", {24, 40});
  auto Y = b.output("Y", {96, 40});
  STORE(Y, MAP(MAT_MUL(LOAD(X), LOAD(W)), [](Expr v) { return silu(v); }));
  auto p = compiled(b.finish());
  ASSERT_EQ(p.body.size(), 2u);  // load W, then the loop over row tiles of X
  EXPECT_EQ(p.body[0]->kind, ir::NodeKind::LoadTile);
  auto in = cpu::random_inputs(p, 9);
  auto mem = cpu::make_memory(p, in);
  cpu::execute(p, mem);
  for (int i = 0; i < 96; ++i)
    for (int j = 0; j < 40; ++j) {
      double acc = 0;
      for (int k = 0; k < 24; ++k) acc += double(in["X"][i * 24 + k]) * in["W"][k * 40 + j];
      ASSERT_NEAR(mem.at("Y").data[i * 40 + j], acc / (1 + std::exp(-acc)), 1e-5);
    }
}

TEST(Cpu, CustomAssociativeCombiner) {
  ProgramBuilder b("custom");
  auto X = b.input("X", {40, 12});
  auto A = b.output("A", {40, 1});
  auto B = b.output("B", {40, 1});
  auto x = LOAD(X);
  STORE(A, REDUCE(x, 1, [](Expr acc, Expr v) { return max(acc, abs(v)); }, 0.0));  // max |x|
  STORE(B, MAX(MAP(x, [](Expr v) { return abs(v); }), 1));
  auto p = compiled(b.finish());
  auto mem = cpu::make_memory(p, cpu::random_inputs(p, 4));
  cpu::execute(p, mem);
  EXPECT_EQ(mem.at("A").data, mem.at("B").data);
}
