// Each pass: a small program in, the printed IR out (checking only what the test is about), and the
// bad programs each pass or the verifier after it must reject, with their messages.
#include <gtest/gtest.h>

#include <sstream>

#include "front/front.h"
#include "ir/analysis.h"
#include "ir/printer.h"
#include "ir/verify.h"
#include "passes/pipeline.h"
#include "tests/support/expect_user_error.h"
#include "tests/support/slide51.h"

using namespace mp;
using namespace mp::front;

namespace {


bool has(const std::string& s, const std::string& sub) { return s.find(sub) != std::string::npos; }

ir::Program softmax(int64_t R, int64_t C) {
  ProgramBuilder b("softmax");
  auto X = b.input("X", {R, C});
  auto Y = b.output("Y", {R, C});
  auto e = MAP(LOAD(X), [](Expr v) { return exp(v); });
  STORE(Y, ZIP(e, SUM(e, 1), [](Expr a, Expr s) { return a / s; }));
  return b.finish();
}

using mp::test::slide51;

ir::Program gda(int64_t R, int64_t C, int64_t TR) {
  ProgramBuilder b("gda");
  auto X = b.input("X", {R, C});
  auto Y = b.input("y", {R, 1}, DType::i32);
  auto Mu = b.input("mu", {2, C});
  auto S = b.output("Sigma", {C, C});
  auto r = METAPIPE_FOLD(
      cdiv(R, TR), {FILL({C, C}, 0.0)}, [&](Idx, const std::vector<Value>& acc) -> std::vector<Value> {
        auto x = LOAD_TILE(X, {TR, C});
        auto d = ZIP(x, GATHER(Mu, LOAD_TILE(Y, {TR, 1})), [](Expr a, Expr m) { return a - m; });
        return {ZIP(acc[0], MAT_MUL(d, d, transpose_a), [](Expr s, Expr o) { return s + o; })};
      });
  STORE_TILE(S, r[0]);
  return b.finish();
}

}  // namespace

TEST(Tile, SplitsWholeTensorSoftmaxIntoRowTiles) {
  auto p = passes::tile(softmax(256, 64), {.row_tile = 64});
  ir::verify(p);
  std::string s = ir::print(p);
  EXPECT_TRUE(has(s, "[tiled]")) << s;
  EXPECT_TRUE(has(s, "< 4 {")) << s;
  EXPECT_TRUE(has(s, "load_tile X[64*i")) << s;
  EXPECT_TRUE(has(s, "exp(x) : f32[64, 64]")) << s;
  EXPECT_TRUE(has(s, "reduce add axis=1 %")) << s;
  EXPECT_TRUE(has(s, ": f32[64, 1]")) << s;
  EXPECT_TRUE(has(s, "store_tile Y[64*i")) << s;
}

TEST(Tile, ChoosesATileThatFitsAndDivides) {
  auto p = passes::tile(softmax(96, 32), {});
  auto& m = p.body.back()->cast<ir::MetaPipe>();
  EXPECT_GE(m.trip(), 4);
  EXPECT_EQ(96 % m.stages[0].ops[0]->out->shape[0], 0);
}

TEST(Tile, ChosenTileRespectsTheBudget) {
  // Rows of 1024 f32: x, exp(x) and the quotient are 4 KiB per row each, double buffered.
  auto p = passes::tile(softmax(256, 1024), {.onchip_budget = 64 * 1024});
  ir::verify(p);
  auto& m = p.body.back()->cast<ir::MetaPipe>();
  int64_t T = m.stages[0].ops[0]->out->shape[0];
  EXPECT_LE(T * 3 * 4096 * 2, 64 * 1024) << ir::print(p);
  EXPECT_EQ(256 % T, 0);
}

TEST(Tile, NonDividingRowTileNeedsMasking) {
  EXPECT_USER_ERROR(passes::tile(softmax(100, 8), {.row_tile = 16}),
                    "row tile 16 does not divide the 100 rows");
  EXPECT_USER_ERROR(passes::tile(softmax(100, 8), {.row_tile = 16}), "enable masking (--set mask=1)");
  auto p = passes::tile(softmax(100, 8), {.row_tile = 16, .masking = true});
  std::string s = ir::print(p);
  EXPECT_TRUE(has(s, "< 7 masked {")) << s;
  EXPECT_TRUE(has(s, "f32[16, 8] masked")) << s;
}

TEST(Tile, ExplicitNonDividingTileRejectedThenMasked) {
  EXPECT_USER_ERROR(ir::verify(passes::tile(slide51(100, 64, 32, 32, 32), {})),
                    "tile 32 does not divide dimension 100 of A");
  auto p = passes::tile(slide51(100, 64, 32, 32, 32), {.masking = true});
  ir::verify(p);
  EXPECT_TRUE(has(ir::print(p), "load_tile A[32*i")) << ir::print(p);
  EXPECT_TRUE(p.body[0]->cast<ir::MetaPipe>().masked);
}

TEST(Tile, BufferOverBudget) {
  // c is 64 x 64 f32 = 16 KiB; two slots are 32 KiB > 20 KiB.
  EXPECT_USER_ERROR(ir::verify(passes::tile(slide51(128, 128, 16, 64, 64), {.onchip_budget = 20 * 1024})),
                    "BUFFER Buffer #");
  EXPECT_USER_ERROR(ir::verify(passes::tile(slide51(128, 128, 16, 64, 64), {.onchip_budget = 20 * 1024})),
                    "more than the on-chip budget of 20.0 KiB; use smaller tiles");
}

TEST(Tile, ValueOverBudget) {
  EXPECT_USER_ERROR(ir::verify(passes::tile(slide51(256, 256, 1024, 256, 64), {.onchip_budget = 512 * 1024})),
                    "LoadTile #");
}

TEST(Tile, ReduceOverRowAxisOfWholeTensorNotSupportedYet) {
  ProgramBuilder b("colsum");
  auto X = b.input("X", {64, 8});
  auto Y = b.output("Y", {1, 8});
  STORE(Y, SUM(MAP(LOAD(X), [](Expr v) { return v * v; }), 0));
  auto p = b.finish();
  EXPECT_THROW(passes::tile(p, {}), not_supported);
}

TEST(Fuse, MapIntoZipAndReduce) {
  ProgramBuilder b("f");
  auto X = b.input("X", {64, 8});
  auto Y = b.output("Y", {64, 8});
  auto Z = b.output("Z", {64, 1});
  auto x = LOAD(X);
  auto t = MAP(x, [](Expr v) { return v * 2.0; });
  STORE(Y, ZIP(t, x, [](Expr a, Expr c) { return a + c; }));
  STORE(Z, SUM(MAP(x, [](Expr v) { return v * v; }), 1));
  auto p = passes::fuse(passes::tile(b.finish(), {.row_tile = 16}), {});
  std::string s = ir::print(p);
  EXPECT_TRUE(has(s, "((x * 2) + y)")) << s;
  EXPECT_TRUE(has(s, "pre(x) = (x * x)")) << s;
  EXPECT_FALSE(has(s, "map(")) << s;
  ir::verify(p);
}

TEST(Fuse, SoftmaxExpHasTwoUsesAndStays) {
  auto p = passes::fuse(passes::tile(softmax(64, 8), {.row_tile = 16}), {});
  std::string s = ir::print(p);
  EXPECT_TRUE(has(s, "map(x = %")) << s;
  EXPECT_TRUE(has(s, "exp(x)")) << s;
}

TEST(Parallelize, MatMulTakesRowParOfItsOperand) {
  auto p = passes::parallelize(passes::tile(slide51(128, 128, 32, 64, 64), {}), {.lanes = 16, .max_par = 4});
  std::string s = ir::print(p);
  EXPECT_TRUE(has(s, ": f32[64, 64] par=4 lanes=16")) << s;
  EXPECT_TRUE(has(s, "row_par=4 par=4 lanes=16")) << s;
}

TEST(Metapipeline, Slide51InnerLoopHasThreeStagesAndDoubleBuffers) {
  auto p = passes::metapipeline(passes::tile(slide51(128, 128, 32, 64, 64), {}), {.depth = 2});
  ir::verify(p);
  std::string s = ir::print(p);
  EXPECT_TRUE(has(s, "stage s2: store=16.0 KiB")) << s;
  EXPECT_TRUE(has(s, "s0 -> s1 depth=2 (16.0 KiB)")) << s;  // the b tile, K=32 x NN=64 f32, twice
  EXPECT_TRUE(has(s, "s1 -> s2 depth=2 (32.0 KiB)")) << s;  // c, 64 x 64 f32, twice
  EXPECT_TRUE(has(s, "graph s0->s1 s1->s2")) << s;
  auto& outer = p.body[0]->cast<ir::MetaPipe>();
  EXPECT_EQ(outer.stages.size(), 2u);   // load A strip | the inner metapipeline
  ASSERT_EQ(outer.buffers.size(), 1u);  // the A strip crosses into the nested loop's stage
  auto& inner = outer.stages[1].ops[0]->cast<ir::MetaPipe>();
  EXPECT_EQ(inner.stages.size(), 3u);
  EXPECT_EQ(inner.edges().size(), 2u);
  EXPECT_EQ(inner.stages[1].work.flops, 2.0 * 64 * 64 * 32);
}

TEST(Metapipeline, AllStagesWithTheirFiringCounts) {
  auto p = passes::metapipeline(passes::tile(slide51(128, 96, 32, 64, 32), {}), {});
  auto stages = ir::all_stages(p);
  ASSERT_EQ(stages.size(), 5u);  // outer: load A, inner loop; inner: load B, matmul, store
  EXPECT_EQ(stages[0].iterations, 2);
  EXPECT_TRUE(stages[1].holds_loop);
  EXPECT_EQ(stages[2].iterations, 2 * 3);
  EXPECT_EQ(stages[2].depth, 1);
  EXPECT_NE(stages[3].path.find(".s1/L"), std::string::npos) << stages[3].path;
  EXPECT_EQ(stages[3].pipe->stages[stages[3].index].ops[0]->kind, ir::NodeKind::MatMul);
}

TEST(Metapipeline, GdaIsFourStagesWithStateBuffer) {
  auto p = passes::metapipeline(passes::tile(gda(256, 8, 32), {}), {});
  ir::verify(p);
  const ir::MetaPipe* m = nullptr;
  for (auto& n : p.body)
    if (n->kind == ir::NodeKind::MetaPipe) m = &n->cast<ir::MetaPipe>();
  ASSERT_TRUE(m);
  std::string s = ir::print(p);
  EXPECT_EQ(m->stages.size(), 4u) << s;  // load+gather | subtract | outer product | accumulate
  EXPECT_EQ(m->stages[2].ops[0]->kind, ir::NodeKind::MatMul) << s;
  EXPECT_TRUE(has(s, "state in s3 depth=1")) << s;
}

TEST(Metapipeline, DepthOption) {
  auto p = passes::metapipeline(passes::tile(softmax(64, 8), {.row_tile = 16}), {.depth = 3});
  EXPECT_TRUE(has(ir::print(p), "depth=3")) << ir::print(p);
  EXPECT_USER_ERROR(passes::metapipeline(softmax(64, 8), {}), "must be tiled first");
}

TEST(Pipeline, DumpsAfterEveryPass) {
  std::ostringstream os;
  passes::CompileOptions o;
  o.dump = "after-all";
  o.dump_to = &os;
  auto p = passes::compile(softmax(64, 8), o);
  for (auto* name : {"tile", "fuse", "parallelize", "metapipeline"})
    EXPECT_TRUE(has(os.str(), std::string("IR after ") + name)) << name;
  EXPECT_TRUE(p.metapipelined);
  o.dump = "after-everything";
  EXPECT_USER_ERROR(passes::compile(softmax(64, 8), o), "unknown --dump-ir value");
}
