// Tiled matmul, the slide-51 metapipeline: the outer loop loads an MM x K strip of A, the inner one a
// K x NN strip of B (row_par = 4), multiplies, buffers and stores the MM x NN tile of C.
#include "core/thread_pool.h"
#include "examples/registry.h"
#include "front/front.h"

namespace mp::examples {
namespace {

using namespace mp::front;

ir::Program build_matmul(const Params& p) {
  int64_t M = p.i("M"), N = p.i("N"), K = p.i("K"), MM = p.i("MM"), NN = p.i("NN");
  DType dt = p.dtype();
  MP_USER_CHECK(dt != DType::i32, "matmul: dtype must be f32, bf16 or f16, got i32");
  MP_USER_CHECK(MM >= 1 && NN >= 1 && MM <= M && NN <= N, "matmul: tiles MM=", MM, ", NN=", NN,
                " must be in [1, M=", M, "] and [1, N=", N, "]");
  ProgramBuilder b("matmul");
  auto A = b.input("A", {M, K}, dt);
  auto B = b.input("B", {K, N}, dt);
  auto C = b.output("C", {M, N}, dt);
  Shape a_tile_shape = {MM, K}, b_tile_shape = {K, NN};
  // As on slide 51 (cdiv(M, MM) is M / MM when MM divides M; with masking it also covers the rest).
  METAPIPE(cdiv(M, MM), [&]() {
    auto a_tile = LOAD_TILE(A, a_tile_shape);
    METAPIPE(cdiv(N, NN), [&]() {
      auto b_tile = LOAD_TILE(B, b_tile_shape, row_par = 4);
      auto c = MAT_MUL(a_tile, b_tile);
      auto c_tile = BUFFER(c);
      STORE_TILE(C, c_tile);
    });
  });
  return b.finish();
}

HostOutputs reference_matmul(const Params& p, const HostInputs& in) {
  int64_t M = p.i("M"), N = p.i("N"), K = p.i("K");
  const auto &A = in.at("A"), &B = in.at("B");
  std::vector<double> C(size_t(M * N), 0.0);
  // Rows on every core (each row's sums in the same order whatever the split): the GPU benchmark checks
  // 4096^3, 69 G multiply-adds.
  auto rows = [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i)
      for (int64_t k = 0; k < K; ++k)
        for (int64_t j = 0; j < N; ++j) C[i * N + j] += double(A[i * K + k]) * double(B[k * N + j]);
  };
  if (M * N * K < (int64_t(1) << 24)) {
    rows(0, M);
  } else {
    ThreadPool pool(ThreadPool::default_threads());
    pool.parallel_for(M, rows);
  }
  return {{"C", C}};
}

ProgramSpec matmul_spec() {
  return {"matmul",
          "tiled matmul C = A B as the slide-51 metapipeline (LOAD_TILE, MAT_MUL, BUFFER, STORE_TILE)",
          {{"M", "256", "rows of A and C"},
           {"N", "256", "columns of B and C"},
           {"K", "128", "inner dimension"},
           {"MM", "64", "tile size along M"},
           {"NN", "64", "tile size along N"},
           {"dtype", "f32", "f32 or bf16"}},
          build_matmul,
          reference_matmul,
          nullptr};
}
MP_REGISTER_PROGRAM(matmul_spec);

}  // namespace
}  // namespace mp::examples
