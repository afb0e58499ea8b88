// The parallelize pass: par (units) and lanes (SIMD width) on every node: a MatMul takes its operand's
// LOAD_TILE row_par, else N / lanes units up to max_par; loads take their row_par; element-wise nodes one
// unit; lanes never exceed the innermost extent.
#include <gtest/gtest.h>

#include "ir/printer.h"
#include "passes/parallelize.h"
#include "passes/tile.h"
#include "tests/passes/programs.h"
#include "tests/support/expect_user_error.h"
#include "tests/support/slide51.h"

using namespace mp;
using namespace mp::front;
using mp::test::has;
using mp::test::slide51;
using mp::test::softmax;

namespace {

const ir::Node* first_of(const ir::Program& p, ir::NodeKind k) {
  const ir::Node* found = nullptr;
  ir::walk(p.body, [&](const ir::NodeRef& n, int) {
    if (!found && n->kind == k) found = n.get();
  });
  return found;
}

}  // namespace

TEST(Parallelize, MatMulTakesRowParOfItsOperand) {
  auto p = passes::parallelize(passes::tile(slide51(128, 128, 32, 64, 64), {}), {.lanes = 16, .max_par = 4});
  std::string s = ir::print(p);
  EXPECT_TRUE(has(s, ": f32[64, 64] par=4 lanes=16")) << s;
  EXPECT_TRUE(has(s, "row_par=4 par=4 lanes=16")) << s;
}

TEST(Parallelize, MatMulWithoutHintUsesColumnsOverLanesUpToMaxPar) {
  // No row_par on either operand: N = 64 columns over 16 lanes allow 4 units; max_par caps that.
  auto build = [] {
    ProgramBuilder b("mm");
    auto A = b.input("A", {64, 32}), B = b.input("B", {32, 64});
    auto C = b.output("C", {64, 64});
    METAPIPE(1, [&]() { STORE_TILE(C, MAT_MUL(LOAD_TILE(A, {64, 32}), LOAD_TILE(B, {32, 64}))); });
    return passes::tile(b.finish(), {});
  };
  auto four = passes::parallelize(build(), {.lanes = 16, .max_par = 8});
  EXPECT_EQ(first_of(four, ir::NodeKind::MatMul)->par, 4);
  auto capped = passes::parallelize(build(), {.lanes = 16, .max_par = 2});
  EXPECT_EQ(first_of(capped, ir::NodeKind::MatMul)->par, 2);
  auto wide = passes::parallelize(build(), {.lanes = 128, .max_par = 8});
  EXPECT_EQ(first_of(wide, ir::NodeKind::MatMul)->par, 1);  // fewer columns than lanes: one unit
}

TEST(Parallelize, ElementwiseNodesUseOneUnitAndAtMostTheirWidthInLanes) {
  // Softmax rows of 8 columns: the Map gets 8 lanes (not 16) on one unit; the row sum is 1 wide.
  auto p = passes::parallelize(passes::tile(softmax(64, 8), {.row_tile = 16}), {.lanes = 16, .max_par = 4});
  auto* map = first_of(p, ir::NodeKind::Map);
  ASSERT_TRUE(map);
  EXPECT_EQ(map->par, 1);
  EXPECT_EQ(map->lanes, 8);
  auto* sum = first_of(p, ir::NodeKind::Reduce);
  ASSERT_TRUE(sum);
  EXPECT_EQ(sum->lanes, 1);
  EXPECT_TRUE(p.parallelized);
}

TEST(Parallelize, BadOptionsRejected) {
  auto p = passes::tile(softmax(64, 8), {.row_tile = 16});
  EXPECT_USER_ERROR(passes::parallelize(p, {.lanes = 0, .max_par = 4}), "lanes and max_par must be >= 1");
  EXPECT_USER_ERROR(passes::parallelize(p, {.lanes = 16, .max_par = 0}), "lanes and max_par must be >= 1");
}
