// The front end: the slide-51 program as written on the slide, implicit tile offsets, folds, errors.
#include <gtest/gtest.h>

#include "front/front.h"
#include "ir/printer.h"
#include "ir/verify.h"
#include "tests/support/expect_user_error.h"

using namespace mp;
using namespace mp::front;

TEST(Front, Slide51ProgramAlmostVerbatim) {
  const int64_t M = 256, N = 128, K = 64, MM = 64, NN = 32;
  ProgramBuilder b("slide51");
  auto A = b.input("A", {M, K}), B = b.input("B", {K, N});
  auto C = b.output("C", {M, N});
  Shape a_tile_shape = {MM, K}, b_tile_shape = {K, NN};
  METAPIPE(M / MM, [&]() {
    auto a_tile = LOAD_TILE(A, a_tile_shape);
    METAPIPE(N / NN, [&]() {
      auto b_tile = LOAD_TILE(B, b_tile_shape, row_par = 4);
      auto c = MAT_MUL(a_tile, b_tile);
      auto c_tile = BUFFER(c);
      STORE_TILE(C, c_tile);
    });
  });
  ir::Program p = b.finish();
  ir::verify(p);
  std::string s = ir::print(p);
  // A binds to the outer loop, B to the inner one, C to both.
  EXPECT_NE(s.find("load_tile A[64*i"), std::string::npos) << s;
  EXPECT_NE(s.find("load_tile B[0, 32*i"), std::string::npos) << s;
  EXPECT_NE(s.find("row_par=4"), std::string::npos) << s;
  EXPECT_NE(s.find("buffer %"), std::string::npos) << s;
  auto& outer = p.body.at(0)->cast<ir::MetaPipe>();
  auto& inner = outer.stages[0].ops.at(1)->cast<ir::MetaPipe>();
  auto& store = inner.stages[0].ops.at(3)->cast<ir::StoreTile>();
  EXPECT_EQ(store.offset[0].coef_of(outer.var), MM);
  EXPECT_EQ(store.offset[1].coef_of(inner.var), NN);
}

TEST(Front, WholeTensorSoftmax) {
  ProgramBuilder b("softmax");
  auto X = b.input("X", {32, 8});
  auto Y = b.output("Y", {32, 8});
  auto e = MAP(LOAD(X), [](Expr v) { return exp(v); });
  auto y = ZIP(e, SUM(e, 1), [](Expr a, Expr s) { return a / s; });
  STORE(Y, y);
  ir::Program p = b.finish();
  ASSERT_EQ(p.body.size(), 5u);
  EXPECT_EQ(p.body[2]->kind, ir::NodeKind::Reduce);
  EXPECT_EQ(p.body[2]->out->shape, (Shape{32, 1}));
}

TEST(Front, FoldCarriesValues) {
  ProgramBuilder b("fold");
  auto X = b.input("X", {64, 8});
  auto S = b.output("S", {1, 8});
  auto r =
      METAPIPE_FOLD(4, {FILL({1, 8}, 0.0)}, [&](Idx, const std::vector<Value>& acc) -> std::vector<Value> {
        auto x = LOAD_TILE(X, {16, 8});
        return {ZIP(acc[0], SUM(x, 0), [](Expr a, Expr s) { return a + s; })};
      });
  STORE_TILE(S, r[0]);
  ir::Program p = b.finish();
  ir::verify(p);
  auto& m = p.body.at(1)->cast<ir::MetaPipe>();
  ASSERT_EQ(m.carried.size(), 1u);
  EXPECT_EQ(m.carried[0].result->shape, (Shape{1, 8}));
}

TEST(Front, TripCountMismatchIsExplained) {
  ProgramBuilder b("bad");
  auto A = b.input("A", {256, 64});
  try {
    METAPIPE(3, [&]() { LOAD_TILE(A, {64, 64}); });
    FAIL() << "expected an error";
  } catch (const user_error& e) {
    EXPECT_NE(std::string(e.what()).find("is bound to METAPIPE"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("give offsets with at(...)"), std::string::npos) << e.what();
  }
}

TEST(Front, PatternOutsideBuilderIsAnError) {
  EXPECT_USER_ERROR(METAPIPE(2, [] {}), "was used with no ProgramBuilder active");
}
