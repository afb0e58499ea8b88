// GEMM (Plasticine / Spatial benchmark): blocked over M, N and K; the C tile is accumulated on chip over
// the K loop (a loop-carried value) and stored once.
#include "examples/registry.h"
#include "front/front.h"

namespace mp::examples {
namespace {

using namespace mp::front;

ir::Program build_gemm(const Params& p) {
  int64_t M = p.i("M"), N = p.i("N"), K = p.i("K"), MM = p.i("MM"), NN = p.i("NN"), KK = p.i("KK");
  MP_USER_CHECK(M % MM == 0 && N % NN == 0 && K % KK == 0, "gemm: tiles MM=", MM, ", NN=", NN, ", KK=", KK,
                " must divide M=", M, ", N=", N, ", K=", K);
  DType dt = p.dtype();
  MP_USER_CHECK(dt != DType::i32, "gemm: dtype must be f32, bf16 or f16, got i32");
  ProgramBuilder b("gemm");
  auto A = b.input("A", {M, K}, dt);
  auto B = b.input("B", {K, N}, dt);
  auto C = b.output("C", {M, N}, dt);
  METAPIPE(M / MM, [&](Idx i) {
    METAPIPE(N / NN, [&](Idx j) {
      auto zero = FILL({MM, NN}, 0.0);
      auto c = METAPIPE_FOLD(K / KK, {zero}, [&](Idx k, const std::vector<Value>& acc) -> std::vector<Value> {
        auto a = LOAD_TILE(A, {MM, KK}, at(i * MM, k * KK));
        auto bt = LOAD_TILE(B, {KK, NN}, at(k * KK, j * NN));
        return {ZIP(acc[0], MAT_MUL(a, bt), [](Expr s, Expr x) { return s + x; })};
      });
      STORE_TILE(C, c[0], at(i * MM, j * NN));
    });
  });
  return b.finish();
}

HostOutputs reference_gemm(const Params& p, const HostInputs& in) {
  int64_t M = p.i("M"), N = p.i("N"), K = p.i("K");
  const auto &A = in.at("A"), &B = in.at("B");
  std::vector<double> C(size_t(M * N), 0.0);
  for (int64_t i = 0; i < M; ++i)
    for (int64_t k = 0; k < K; ++k)
      for (int64_t j = 0; j < N; ++j)
        C[size_t(i * N + j)] += double(A[size_t(i * K + k)]) * double(B[size_t(k * N + j)]);
  return {{"C", C}};
}

ProgramSpec gemm_spec() {
  return {"gemm",
          "GEMM blocked over M, N and K (Plasticine/Spatial benchmark), the C tile accumulated on chip",
          {{"M", "128", "rows of A and C"},
           {"N", "128", "columns of B and C"},
           {"K", "128", "inner dimension"},
           {"MM", "32", "tile along M"},
           {"NN", "32", "tile along N"},
           {"KK", "32", "tile along K"},
           {"dtype", "f32", "f32 or bf16 (the C tile accumulates in f32 either way)"}},
          build_gemm,
          reference_gemm,
          nullptr};
}
MP_REGISTER_PROGRAM(gemm_spec);

}  // namespace
}  // namespace mp::examples
