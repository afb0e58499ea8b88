// The registry holds every program examples/ defines; the five seed programs against their naive
// references through the interpreter and the metapipelined executor, at default sizes, at sizes their
// tiles do not divide (masked), and in bf16; the registry's parameter errors; the CLI commands list /
// compile / run.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <array>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <set>

#include "backends/cpu/interpreter.h"
#include "examples/run.h"
#include "tests/support/expect_user_error.h"
#include "tests/support/run_cli.h"

using namespace mp;
using namespace mp::examples;

namespace {

void check(const std::string& program, const std::vector<std::string>& sets, uint64_t seed = 7) {
  const auto& spec = find_program(program);
  auto params = resolve(spec, sets);
  for (auto mode : {CpuMode::Interpreter, CpuMode::Executor}) {
    auto r = run_on_cpu(spec, params, mode, seed);
    EXPECT_TRUE(r.ok) << program << " on " << r.target << ": " << r.summary();
    for (auto& c : r.checks) EXPECT_LT(c.cmp.max_rel_err, r.rtol) << program << " " << c.tensor;
    if (mode == CpuMode::Executor) {
      EXPECT_TRUE(r.report.has_value());
    }
  }
}

using Cli = mp::test::CliResult;
Cli cli(const std::string& args) { return mp::test::run_cli(args); }

}  // namespace

// Derived from the source tree, not from the registry: every .cpp under examples/ but the registry and
// the runner defines one program, named like its file (examples/spatial/tpchq6.cpp defines tpchq6).
TEST(Examples, EveryExampleFileIsRegistered) {
  const std::set<std::string> infrastructure = {"registry", "run"};
  std::set<std::string> expected;
  for (auto& e : std::filesystem::recursive_directory_iterator(std::string(MP_SOURCE_DIR) + "/examples"))
    if (e.path().extension() == ".cpp" && !infrastructure.count(e.path().stem().string()))
      expected.insert(e.path().stem().string());
  ASSERT_GE(expected.size(), 5u) << "no example sources found under " << MP_SOURCE_DIR;
  std::set<std::string> registered;
  for (auto* p : programs()) registered.insert(p->name);
  EXPECT_EQ(registered, expected);
  for (auto& name : expected) EXPECT_NO_THROW(find_program(name)) << name;
}

TEST(Examples, SoftmaxDefault) { check("softmax", {}); }
TEST(Examples, SoftmaxMaskedAndBf16) {
  check("softmax", {"R=100", "C=77", "mask=1"});
  check("softmax", {"R=64", "C=48", "dtype=bf16"});
}
TEST(Examples, MatmulDefault) { check("matmul", {}); }
TEST(Examples, MatmulMaskedAndBf16) {
  check("matmul", {"M=100", "N=70", "K=48", "MM=32", "NN=32", "mask=1"});
  check("matmul", {"M=64", "N=64", "K=32", "MM=32", "NN=16", "dtype=bf16"});
}
TEST(Examples, GdaDefault) { check("gda", {}); }
TEST(Examples, GdaMasked) { check("gda", {"R=300", "C=12", "TR=64", "mask=1"}); }
TEST(Examples, FlashAttentionDefault) { check("flash_attention", {}); }
TEST(Examples, FlashAttentionMaskedBf16AndNoDropout) {
  check("flash_attention", {"S=100", "D=24", "BR=32", "BC=16", "mask=1"});
  check("flash_attention", {"S=64", "D=16", "BR=16", "BC=32", "dtype=bf16"});
  check("flash_attention", {"S=48", "D=16", "BR=16", "BC=16", "p_drop=0", "causal=0"});
}
TEST(Examples, LlamaDecoderDefault) { check("llama_decoder", {}); }
// d_model apart from heads x head_dim, several attention tiles, one decode step at the cache's end
TEST(Examples, LlamaDecoderOtherShapes) {
  check("llama_decoder", {"layers=1", "d_model=40", "heads=6", "kv_heads=2", "head_dim=8", "ffn=36",
                          "vocab=50", "context=24", "tokens=1", "past=23", "attn_tile=8"});
}
// the streamed form (every weight read in row tiles inside its projection's METAPIPE) computes the same
TEST(Examples, LlamaDecoderStreamedWeights) {
  check("llama_decoder", {"weight_tile=16"});
  check("llama_decoder", {"layers=1", "heads=6", "kv_heads=3", "head_dim=8", "d_model=48", "ffn=40",
                          "vocab=30", "weight_tile=12", "attn_tile=8"});
}

// Every pass preserves meaning: the interpreter gives the same outputs after each of them (fusion may
// change the last bits: a fused element function rounds to f32 once instead of per step).
TEST(Examples, EveryPassPreservesTheResults) {
  const std::vector<std::pair<std::string, std::vector<std::string>>> cases = {
      {"softmax", {"R=40", "C=24", "row_tile=16", "mask=1"}},
      {"matmul", {"M=40", "N=24", "K=8", "MM=16", "NN=16", "mask=1"}},
      {"gda", {"R=50", "C=6", "TR=16", "mask=1"}},
      {"flash_attention", {"S=40", "D=8", "BR=16", "BC=16", "mask=1"}},
      {"llama_decoder", {"layers=1", "heads=2", "kv_heads=1", "head_dim=8", "d_model=16", "ffn=24",
                         "vocab=20", "context=12", "tokens=3", "past=5", "attn_tile=4"}},
      {"llama_decoder", {"layers=1", "heads=2", "kv_heads=1", "head_dim=8", "d_model=16", "ffn=24",
                         "vocab=20", "context=12", "tokens=3", "past=5", "weight_tile=8"}},
  };
  for (auto& [name, sets] : cases) {
    const auto& spec = find_program(name);
    auto params = resolve(spec, sets);
    auto opt = compile_options(params);
    std::vector<ir::Program> stages;
    stages.push_back(passes::tile(build(spec, params), opt.tile));
    stages.push_back(passes::fuse(stages.back(), opt.fuse));
    stages.push_back(passes::parallelize(stages.back(), opt.parallelize));
    stages.push_back(passes::metapipeline(stages.back(), opt.metapipeline));
    auto in = make_inputs(spec, params, stages[0], 11);
    std::vector<cpu::Memory> out;
    for (auto& p : stages) {
      out.push_back(cpu::make_memory(p, in));
      cpu::interpret(p, out.back());
    }
    for (size_t k = 1; k < out.size(); ++k)
      for (auto& [tensor, want] : spec.reference(params, in)) {
        auto& a = out[k - 1].at(tensor).data;
        auto& b = out[k].at(tensor).data;
        ASSERT_EQ(a.size(), b.size());
        for (size_t e = 0; e < a.size(); ++e)
          ASSERT_NEAR(a[e], b[e], 1e-6 * (1 + std::fabs(a[e]))) << name << " " << tensor << " after pass " << k;
      }
  }
}

TEST(Examples, ExecutorReportShowsStagesOfFlashAttention) {
  const auto& spec = find_program("flash_attention");
  auto r = run_on_cpu(spec, resolve(spec, {"S=64", "D=16", "BR=16", "BC=16"}), CpuMode::Executor, 3);
  ASSERT_TRUE(r.report);
  bool inner_three = false;
  for (auto& l : r.report->loops) inner_three = inner_three || l.stages >= 3;
  EXPECT_TRUE(inner_three) << r.report->format();
}

TEST(Examples, UnknownSetNameListsTheParameters) {
  const auto& spec = find_program("matmul");
  try {
    resolve(spec, {"MMM=3"});
    FAIL();
  } catch (const user_error& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("unknown parameter 'MMM' for program 'matmul'"), std::string::npos) << m;
    EXPECT_NE(m.find("its parameters: M, N, K, MM, NN, dtype"), std::string::npos) << m;
  }
  EXPECT_USER_ERROR(resolve(spec, {"M=abc"}), "parameter M=abc must be an integer");
  EXPECT_USER_ERROR(find_program("nope"), "unknown program 'nope' (programs: ");
  EXPECT_USER_ERROR(find_program("nope"), "see metapipe list");
}

TEST(ExamplesCli, ListShowsProgramsAndDefaults) {
  auto r = cli("list");
  EXPECT_EQ(r.status, 0) << r.out;
  for (auto* p : programs()) EXPECT_NE(r.out.find(p->name), std::string::npos) << p->name << "\n" << r.out;
  for (auto* s : {"MM=64", "mask=0"}) EXPECT_NE(r.out.find(s), std::string::npos) << s << "\n" << r.out;
}

TEST(ExamplesCli, RunChecksAndReports) {
  auto r = cli("run matmul --target cpu --set M=64 --set N=64 --set K=16 --set MM=32 --set NN=16 --seed 5");
  EXPECT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("cpu (interpreter)"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("per-stage report"), std::string::npos) << r.out;
  auto j = cli("run softmax --set R=32 --set C=8 --json --seed 5");
  EXPECT_EQ(j.status, 0) << j.out;
  EXPECT_EQ(j.out.rfind("{\"program\": \"softmax\"", 0), 0u) << j.out;
  EXPECT_NE(j.out.find("\"stages\": ["), std::string::npos) << j.out;
  EXPECT_NE(j.out.find("\"ok\": true}"), std::string::npos) << j.out;
}

TEST(ExamplesCli, BadProgramsAreOneLineErrors) {
  auto r = cli("run matmul --set M=100 --set MM=32");
  EXPECT_EQ(r.status, 1) << r.out;
  EXPECT_NE(r.out.find("does not divide dimension 100 of A"), std::string::npos) << r.out;
  auto u = cli("run softmax --set Q=1");
  EXPECT_EQ(u.status, 1) << u.out;
  EXPECT_NE(u.out.find("unknown parameter 'Q'"), std::string::npos) << u.out;
  auto t = cli("run softmax --target gpu");
  EXPECT_EQ(t.status, 2) << t.out;
}

TEST(ExamplesCli, CompileDumpsAfterEachPass) {
  auto r = cli("compile softmax --set R=64 --set C=16 --dump-ir=after-all");
  EXPECT_EQ(r.status, 0) << r.out;
  for (auto* s :
       {"IR after tile", "IR after fuse", "IR after parallelize", "IR after metapipeline", "graph s0->s1"})
    EXPECT_NE(r.out.find(s), std::string::npos) << s;
}
