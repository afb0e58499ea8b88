// The slide-51 matmul metapipeline (A: M x K, B: K x N, tiles MM x K and K x NN, row_par = 4), shared by
// the pass and CPU-backend tests. Tile counts round up, so sizes the tiles do not divide need masking.
#pragma once
#include "front/front.h"

namespace mp::test {

inline ir::Program slide51(int64_t M, int64_t N, int64_t K, int64_t MM, int64_t NN) {
  using namespace mp::front;
  ProgramBuilder b("matmul");
  auto A = b.input("A", {M, K}), B = b.input("B", {K, N});
  auto C = b.output("C", {M, N});
  METAPIPE(cdiv(M, MM), [&]() {
    auto a_tile = LOAD_TILE(A, {MM, K});
    METAPIPE(cdiv(N, NN), [&]() {
      auto b_tile = LOAD_TILE(B, {K, NN}, row_par = 4);
      STORE_TILE(C, BUFFER(MAT_MUL(a_tile, b_tile)));
    });
  });
  return b.finish();
}

}  // namespace mp::test
