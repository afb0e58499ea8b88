// The fuse pass: a single-use element function folds into its consumer (Map into Zip, Map into a
// Reduce's pre-function); values with several uses, index-dependent functions and a disabled pass stay.
#include <gtest/gtest.h>

#include "ir/printer.h"
#include "ir/verify.h"
#include "passes/fuse.h"
#include "passes/tile.h"
#include "tests/passes/programs.h"

using namespace mp;
using namespace mp::front;
using mp::test::has;
using mp::test::softmax;

namespace {

// t = 2x feeds only the Zip; x*x feeds only the Reduce.
ir::Program map_into_zip_and_reduce() {
  ProgramBuilder b("f");
  auto X = b.input("X", {64, 8});
  auto Y = b.output("Y", {64, 8});
  auto Z = b.output("Z", {64, 1});
  auto x = LOAD(X);
  auto t = MAP(x, [](Expr v) { return v * 2.0; });
  STORE(Y, ZIP(t, x, [](Expr a, Expr c) { return a + c; }));
  STORE(Z, SUM(MAP(x, [](Expr v) { return v * v; }), 1));
  return b.finish();
}

}  // namespace

TEST(Fuse, MapIntoZipAndReduce) {
  auto p = passes::fuse(passes::tile(map_into_zip_and_reduce(), {.row_tile = 16}), {});
  ir::verify(p);
  std::string s = ir::print(p);
  EXPECT_TRUE(has(s, "((x * 2) + y)")) << s;
  EXPECT_TRUE(has(s, "pre(x) = (x * x)")) << s;
  EXPECT_FALSE(has(s, "map(")) << s;
}

TEST(Fuse, DisabledLeavesTheMaps) {
  auto p = passes::fuse(passes::tile(map_into_zip_and_reduce(), {.row_tile = 16}), {.enabled = false});
  std::string s = ir::print(p);
  EXPECT_TRUE(has(s, "map(x = %")) << s;
  EXPECT_FALSE(has(s, "pre(x)")) << s;
}

TEST(Fuse, SoftmaxExpHasTwoUsesAndStays) {
  auto p = passes::fuse(passes::tile(softmax(64, 8), {.row_tile = 16}), {});
  std::string s = ir::print(p);
  EXPECT_TRUE(has(s, "map(x = %")) << s;
  EXPECT_TRUE(has(s, "exp(x)")) << s;
  EXPECT_FALSE(has(s, "pre(x)")) << s;
}

TEST(Fuse, IndexDependentMapStays) {
  // The Map reads its element's row index. The pass never folds such a function: under broadcasting the
  // consumer's element is not the producer's, so the index would change meaning.
  ProgramBuilder b("idx");
  auto X = b.input("X", {64, 8});
  auto Y = b.output("Y", {64, 8});
  auto x = LOAD(X);
  auto t = MAP(x, [](Expr v) { return v + Expr::index(0); });
  STORE(Y, ZIP(t, x, [](Expr a, Expr c) { return a * c; }));
  auto p = passes::fuse(passes::tile(b.finish(), {.row_tile = 16}), {});
  std::string s = ir::print(p);
  EXPECT_TRUE(has(s, "map(x = %")) << s;
}
