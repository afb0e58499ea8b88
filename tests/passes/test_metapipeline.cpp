// The metapipeline pass: a loop body split into stages at loads, BUFFERs and nested loops, with Stream
// buffers between stages (double-buffered by default), State buffers for loop-carried values, and the
// per-stage work that backends schedule from.
#include <gtest/gtest.h>

#include "ir/analysis.h"
#include "ir/printer.h"
#include "ir/verify.h"
#include "passes/metapipeline.h"
#include "passes/tile.h"
#include "tests/passes/programs.h"
#include "tests/support/expect_user_error.h"
#include "tests/support/slide51.h"

using namespace mp;
using mp::test::gda;
using mp::test::has;
using mp::test::slide51;
using mp::test::softmax;

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
  EXPECT_FALSE(has(ir::print(p), "depth=2")) << ir::print(p);
  EXPECT_USER_ERROR(passes::metapipeline(passes::tile(softmax(64, 8), {.row_tile = 16}), {.depth = 0}),
                    "buffer depth must be >= 1, got 0");
}

TEST(Metapipeline, UntiledProgramRejected) {
  EXPECT_USER_ERROR(passes::metapipeline(softmax(64, 8), {}), "must be tiled first");
}
