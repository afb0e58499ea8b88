// Lesson 1 (docs/lesson_01_softmax_and_matmul.md): softmax as parallel patterns and the slide-51 matmul
// as a metapipeline, compiled, printed, run on the metapipelined CPU executor and checked. Built and run
// as a test (tests/docs), so the lesson cannot rot.
#include <cmath>
#include <cstdio>
#include <iostream>

#include "backends/cpu/executor.h"
#include "backends/cpu/interpreter.h"
#include "front/front.h"
#include "ir/printer.h"
#include "passes/pipeline.h"

using namespace mp;
using namespace mp::front;

// Step 1: softmax, slide 48. Whole tensors; the compiler picks the tiles.
ir::Program softmax(int64_t R, int64_t C) {
  ProgramBuilder b("softmax");
  auto X = b.input("X", {R, C});
  auto Y = b.output("Y", {R, C});
  auto e = MAP(LOAD(X), [](Expr v) { return exp(v); });              // Map(exp)
  auto s = REDUCE(e, /*axis=*/1, Combiner::Add);                     // Reduce(+)
  auto y = ZIP(e, s, [](Expr num, Expr den) { return num / den; });  // Zip(/)
  STORE(Y, y);
  return b.finish();
}

// Step 2: the slide-51 matmul. We choose the tiles and say how data flows.
ir::Program matmul(int64_t M, int64_t N, int64_t K, int64_t MM, int64_t NN) {
  ProgramBuilder b("matmul");
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
  return b.finish();
}

// Step 3: compile (tile -> fuse -> parallelize -> metapipeline), run on the executor, check.
bool run_and_check(const ir::Program& program, bool print_ir) {
  ir::Program p = passes::compile(program, {});
  if (print_ir) std::cout << ir::print(p) << "\n";
  auto inputs = cpu::random_inputs(p, /*seed=*/2026);
  auto mem = cpu::make_memory(p, inputs);
  cpu::ExecReport report = cpu::execute(p, mem);
  auto ref = cpu::make_memory(p, inputs);
  cpu::interpret(p, ref);  // the reference interpreter runs the same program, one iteration at a time
  bool same = true;
  for (auto& [name, t] : mem) same = same && t.data == ref.at(name).data;
  std::cout << program.name << ": executor " << (same ? "equals" : "DIFFERS FROM") << " the interpreter\n"
            << report.format() << "\n";
  return same;
}

int main() {
  bool ok = run_and_check(softmax(256, 64), /*print_ir=*/true);
  ok = run_and_check(matmul(256, 256, 64, 64, 64), true) && ok;

  // Step 4: check softmax against plain C++ as well.
  ir::Program p = passes::compile(softmax(32, 16), {});
  auto in = cpu::random_inputs(p, 1);
  auto mem = cpu::make_memory(p, in);
  cpu::execute(p, mem);
  double worst = 0;
  for (int r = 0; r < 32; ++r) {
    double sum = 0;
    for (int c = 0; c < 16; ++c) sum += std::exp(double(in["X"][r * 16 + c]));
    for (int c = 0; c < 16; ++c) {
      double want = std::exp(double(in["X"][r * 16 + c])) / sum;
      worst = std::max(worst, std::fabs(mem.at("Y").data[r * 16 + c] - want) / want);
    }
  }
  std::printf("softmax vs plain C++: max relative error %.1e\n", worst);
  ok = ok && worst < 1e-5;
  std::cout << (ok ? "lesson 1: ok" : "lesson 1: FAILED") << "\n";
  return ok ? 0 : 1;
}
