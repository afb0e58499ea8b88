// Small programs the pass tests share: whole-tensor softmax (the tile pass splits it into row tiles) and
// GDA (an explicitly tiled loop with a loop-carried accumulator and a gather).
#pragma once
#include <string>

#include "front/front.h"

namespace mp::test {

inline bool has(const std::string& s, const std::string& sub) { return s.find(sub) != std::string::npos; }

inline ir::Program softmax(int64_t R, int64_t C) {
  using namespace mp::front;
  ProgramBuilder b("softmax");
  auto X = b.input("X", {R, C});
  auto Y = b.output("Y", {R, C});
  auto e = MAP(LOAD(X), [](Expr v) { return exp(v); });
  STORE(Y, ZIP(e, SUM(e, 1), [](Expr a, Expr s) { return a / s; }));
  return b.finish();
}

inline ir::Program gda(int64_t R, int64_t C, int64_t TR) {
  using namespace mp::front;
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

}  // namespace mp::test
