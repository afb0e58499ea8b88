// The IR: expressions, checking factories (errors name the node and the fix), printer, analysis. The
// verifier has its own file, test_verify.cpp.
#include <gtest/gtest.h>

#include <cmath>

#include "front/front.h"
#include "ir/analysis.h"
#include "ir/printer.h"
#include "tests/support/expect_user_error.h"

using namespace mp;
using namespace mp::ir;

TEST(Expr, PrintsAndEvaluates) {
  Expr x = Expr::arg(0), y = Expr::arg(1);
  Expr f = exp(x - y) / (y + 2.0);
  EXPECT_EQ(f.str(), "(exp((x - y)) / (y + 2))");
  EXPECT_EQ(f.max_arg(), 1);
  ExprEval ev(f);
  double args[2] = {1.5, 0.5};
  EXPECT_NEAR(ev(args, {}), std::exp(1.0) / 2.5, 1e-12);
  ExprEval sel(select(Expr::index(1) <= Expr::index(0), x, -1.0));
  int64_t below[2] = {3, 2}, above[2] = {2, 3};
  EXPECT_EQ(sel(args, below), 1.5);
  EXPECT_EQ(sel(args, above), -1.0);
}

TEST(Expr, RandomDependsOnlyOnSeedAndIndex) {
  int64_t a[2] = {5, 7}, b[2] = {7, 5};
  EXPECT_EQ(random_uniform(3, a), random_uniform(3, a));
  EXPECT_NE(random_uniform(3, a), random_uniform(3, b));
  EXPECT_NE(random_uniform(3, a), random_uniform(4, a));
  ExprEval r(Expr::random(3));
  EXPECT_EQ(r({}, a), random_uniform(3, a));
  double sum = 0;
  for (int64_t i = 0; i < 1000; ++i) {
    int64_t idx[1] = {i};
    double u = random_uniform(9, idx);
    ASSERT_GE(u, 0.0);
    ASSERT_LT(u, 1.0);
    sum += u;
  }
  EXPECT_NEAR(sum / 1000, 0.5, 0.05);
}

TEST(Expr, SubstituteComposes) {
  Expr inner = Expr::arg(0) * 2.0, outer = Expr::arg(0) + Expr::arg(1);
  EXPECT_EQ(outer.substitute({inner, Expr::arg(1)}).str(), "((x * 2) + y)");
}

TEST(Factories, MatMulShapeMismatchNamesNodeAndFix) {
  Program p;
  auto A = p.add_tensor("A", {64, 128}, DType::f32, TensorRole::Input);
  auto B = p.add_tensor("B", {96, 64}, DType::f32, TensorRole::Input);
  auto a = make_load(p, A, {64, 128}, {0, 0}, false);
  auto b = make_load(p, B, {96, 64}, {0, 0}, false);
  EXPECT_USER_ERROR(make_matmul(p, a->out, b->out, false, false), "MatMul #");
  EXPECT_USER_ERROR(make_matmul(p, a->out, b->out, false, false), "shape mismatch");
  EXPECT_USER_ERROR(make_matmul(p, a->out, b->out, false, false), "make the inner dimensions equal");
}

TEST(Factories, ReduceOverMissingAxis) {
  Program p;
  auto X = p.add_tensor("X", {8, 16}, DType::f32, TensorRole::Input);
  auto x = make_load(p, X, {8, 16}, {0, 0}, false);
  EXPECT_USER_ERROR(make_reduce(p, x->out, 2, Combiner::Add),
                    "Reduce over axis 2 of a value of shape [8, 16]");
  EXPECT_USER_ERROR(make_reduce(p, x->out, 2, Combiner::Add), "pick an existing axis");
}

TEST(Factories, ZipBroadcastsAndRejectsMismatch) {
  Program p;
  auto X = p.add_tensor("X", {8, 16}, DType::f32, TensorRole::Input);
  auto x = make_load(p, X, {8, 16}, {0, 0}, false);
  auto s = make_reduce(p, x->out, 1, Combiner::Add);
  auto z = make_zip(p, {x->out, s->out}, Expr::arg(0) / Expr::arg(1), DType::f32);
  EXPECT_EQ(z->out->shape, (Shape{8, 16}));
  auto y = make_load(p, X, {8, 8}, {0, 0}, false);
  EXPECT_USER_ERROR(make_zip(p, {x->out, y->out}, Expr::arg(0), DType::f32), "shape mismatch on axis 1");
}

TEST(Factories, StoreIntoInputRejected) {
  Program p;
  auto X = p.add_tensor("X", {8, 16}, DType::f32, TensorRole::Input);
  auto x = make_load(p, X, {8, 16}, {0, 0}, false);
  EXPECT_USER_ERROR(make_store(p, X, x->out, {0, 0}, false), "declare it as an output");
}

TEST(Printer, ShowsTensorsNodesAndLoops) {
  front::ProgramBuilder b("print");
  auto X = b.input("X", {64, 16});
  auto Y = b.output("Y", {64, 16});
  front::METAPIPE(4, [&]() {
    auto x = front::LOAD_TILE(X, {16, 16});
    front::STORE_TILE(Y, front::MAP(x, [](Expr v) { return exp(v); }));
  });
  std::string s = print(b.finish());
  EXPECT_NE(s.find("tensor X : f32[64, 16] input"), std::string::npos) << s;
  EXPECT_NE(s.find("metapipe i"), std::string::npos) << s;
  EXPECT_NE(s.find("load_tile X[16*i"), std::string::npos) << s;
  EXPECT_NE(s.find("exp(x) : f32[16, 16]"), std::string::npos) << s;
  EXPECT_NE(s.find("store_tile Y[16*i"), std::string::npos) << s;
}

TEST(Analysis, AccessPatternsAndWork) {
  Program p;
  auto A = p.add_tensor("A", {256, 128}, DType::f32, TensorRole::Input);
  auto rows = make_load(p, A, {64, 128}, {0, 0}, false);  // full rows: one contiguous run
  auto a = access_of(*rows);
  ASSERT_TRUE(a);
  EXPECT_EQ(a->pattern, OffChipAccess::Pattern::Contiguous);
  EXPECT_EQ(a->bytes, 64 * 128 * 4);
  auto cols = make_load(p, A, {128, 32}, {0, 0}, false);  // a column strip: 128 runs of 128 bytes
  auto c = access_of(*cols);
  EXPECT_EQ(c->pattern, OffChipAccess::Pattern::Strided);
  EXPECT_EQ(c->runs, 128);
  EXPECT_EQ(c->run_bytes, 32 * 4);
  EXPECT_EQ(c->stride_bytes, 128 * 4);
  auto mm = make_matmul(p, rows->out, cols->out, false, false);
  EXPECT_EQ(work_of(*mm).flops, 2.0 * 64 * 32 * 128);
}
