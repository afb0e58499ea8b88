// The tile pass: whole-tensor programs split into row tiles that fit the budget and divide the rows (or
// are masked), explicitly tiled programs checked by the verifier after it.
#include <gtest/gtest.h>

#include "ir/printer.h"
#include "ir/verify.h"
#include "passes/tile.h"
#include "tests/passes/programs.h"
#include "tests/support/expect_user_error.h"
#include "tests/support/slide51.h"

using namespace mp;
using namespace mp::front;
using mp::test::has;
using mp::test::slide51;
using mp::test::softmax;

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
  // 96 rows: the chosen row tile must divide them and leave a loop of several iterations.
  auto p = passes::tile(softmax(96, 32), {});
  auto& m = p.body.back()->cast<ir::MetaPipe>();
  int64_t T = m.stages[0].ops[0]->out->shape[0];
  EXPECT_EQ(96 % T, 0) << T;
  EXPECT_EQ(m.trip() * T, 96);
  EXPECT_GE(m.trip(), 4);
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

TEST(Tile, RowTileOutOfRangeRejected) {
  EXPECT_USER_ERROR(passes::tile(softmax(64, 8), {.row_tile = 128}), "row_tile=128 must be in [1, 64]");
}

TEST(Tile, RowTileOnAnExplicitlyTiledProgramRejected) {
  EXPECT_USER_ERROR(passes::tile(slide51(128, 128, 32, 64, 64), {.row_tile = 16}),
                    "applies to whole-tensor programs");
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
  // The A strip is 256 x 1024 f32 = 1 MiB against a 512 KiB budget.
  EXPECT_USER_ERROR(ir::verify(passes::tile(slide51(256, 256, 1024, 256, 64), {.onchip_budget = 512 * 1024})),
                    "LoadTile #");
}

TEST(Tile, ReduceOverRowAxisOfWholeTensorNotSupportedYet) {
  ProgramBuilder b("colsum");
  auto X = b.input("X", {64, 8});
  auto Y = b.output("Y", {1, 8});
  STORE(Y, SUM(MAP(LOAD(X), [](Expr v) { return v * v; }), 0));
  auto p = b.finish();
  EXPECT_USER_ERROR(passes::tile(p, {}), "not supported yet: tiling Reduce #");
  EXPECT_USER_ERROR(passes::tile(p, {}), "write the accumulation with METAPIPE_FOLD over row tiles");
  EXPECT_THROW(passes::tile(p, {}), not_supported);  // the not-yet kind, not a plain user error
}
