// Programs written in the front end, compiled by the passes and lowered to the simulator's stage graph:
// functional simulation equals the CPU backend's interpreter and each program's naive reference on both
// presets; the slide-51 matmul moves exactly the bytes its metapipeline implies and runs at the pace of its
// matmul stage; BlackScholes reproduces the published Spatial figure.
#include <gtest/gtest.h>

#include <cmath>
#include <set>

#include "backends/cpu/interpreter.h"
#include "backends/rdu/lower.h"
#include "backends/rdu/rdu.h"
#include "core/compare.h"
#include "core/error.h"
#include "core/random.h"
#include "examples/registry.h"
#include "examples/run.h"
#include "models/llama.h"

using namespace mp;

namespace {

void check_program(const rdu::Arch& arch, const examples::ProgramSpec& spec, uint64_t seed,
                   const std::vector<std::string>& sets = {}) {
  examples::Params params = examples::resolve(spec, sets);
  ir::Program p = examples::build(spec, params);
  ir::Program c = passes::compile(p, examples::compile_options(params));
  examples::HostInputs in = examples::make_inputs(spec, params, p, seed);
  examples::HostOutputs ref = spec.reference(params, in);
  ir::Memory mem = ir::make_memory(c, in);  // outputs poisoned with NaN
  rdu::Graph g = rdu::lower(c, &mem);
  rdu::RunOptions o;
  o.functional = true;
  o.place = arch.name != "sn40l";  // values do not depend on placement; keeps the test fast under ASan
  auto r = rdu::run(arch, g, o);
  EXPECT_GT(r.cycles, 0);
  EXPECT_GE(r.cycles, r.compute_roof_cycles) << spec.name;
  EXPECT_GE(r.cycles, r.memory_roof_cycles) << spec.name;
  // the CPU backend's reference interpreter on the same inputs
  ir::Memory cpu_mem = ir::make_memory(c, in);
  cpu::interpret(c, cpu_mem);
  for (auto& [name, want] : ref) {
    std::vector<double> cpu_out(cpu_mem.at(name).data.begin(), cpu_mem.at(name).data.end());
    auto same = compare(mem.at(name).data, cpu_out, 1e-6, 1e-6);
    EXPECT_TRUE(same.ok) << spec.name << " on " << arch.name << ": " << name
                         << " differs from the CPU interpreter: " << same.summary();
  }
  const double rtol = examples::output_tolerance(c);
  const examples::HostOutputs mags = examples::magnitudes_of(spec, params, in);
  for (auto& [name, want] : ref) {
    auto cmp = compare(mem.at(name).data, want, rtol, examples::check_atol(name, want, mags, rtol));
    EXPECT_TRUE(cmp.ok) << spec.name << " on " << arch.name << " (seed " << seed << "): " << name << ": "
                        << cmp.summary();
  }
}

}  // namespace

TEST(RduLower, EveryRegistryProgramMatchesItsReferenceOnBothPresets) {
  const uint64_t seed = fresh_seed();
  for (const char* an : {"plasticine", "sn40l"}) {
    rdu::Arch arch = rdu::load_arch(an);
    for (auto* spec : examples::programs()) check_program(arch, *spec, seed);
  }
}

// The Llama generator with streamed weights (every projection a METAPIPE over 16-row weight tiles, RoPE in
// the Q and K loops) computes the same on the simulated units as on the CPU and in the reference.
TEST(RduLower, LlamaWithStreamedWeightsMatchesItsReferenceOnBothPresets) {
  const uint64_t seed = fresh_seed();
  for (const char* an : {"plasticine", "sn40l"})
    check_program(rdu::load_arch(an), examples::find_program("llama_decoder"), seed, {"weight_tile=16"});
}

// A dot product whose random terms cancel to near zero (seed 333 gives 0.10 from 8192 terms of up to 1 in
// size) is judged against the scale of its terms (ProgramSpec::magnitude): sn40l's sum order differs from
// the reference's by ~2e-6 absolute, which failed 1e-5 relative to 0.10 (fresh seeds hit such a case about
// once in 300 runs).
TEST(RduLower, ACancellingDotProductIsJudgedAtTheScaleOfItsTerms) {
  const auto& spec = examples::find_program("dotproduct");
  const examples::Params params = examples::resolve(spec, {});
  const ir::Program p = examples::build(spec, params);
  const examples::HostInputs in = examples::make_inputs(spec, params, p, 333);
  const auto want = spec.reference(params, in).at("out");
  const auto mags = examples::magnitudes_of(spec, params, in);
  ASSERT_EQ(want.size(), 1u);
  EXPECT_LT(std::fabs(want[0]), 0.2);    // the seed does cancel
  EXPECT_GT(mags.at("out")[0], 1000.0);  // sum |a_i b_i| over 8192 terms
  EXPECT_GT(examples::check_atol("out", want, mags, 1e-5), 1e-3);
  EXPECT_LT(examples::check_atol("out", want, {}, 1e-5), 2e-7);  // without it: 1e-5 / 10 of 0.10
  check_program(rdu::load_arch("sn40l"), spec, 333);
}

// Slide 51: A's MM x K strip is loaded once per outer iteration and reused by every inner one, B's K x NN
// strip once per inner iteration, C written once; the product never leaves the chip. The matmul stage
// (row_par = 4 PCUs of 16 lanes x 6 stages) is the slowest, so the whole program takes its initiation
// interval per inner iteration, plus filling and draining the pipeline.
TEST(RduLower, TheSlide51MatmulMovesWhatItsMetapipelineImpliesAtThePaceOfItsMatmul) {
  rdu::Arch arch = rdu::load_arch("plasticine");
  const int64_t M = 512, N = 512, K = 512, MM = 128, NN = 64;
  const auto& spec = examples::find_program("matmul");
  examples::Params params = examples::resolve(spec, {"M=512", "N=512", "K=512", "MM=128", "NN=64"});
  ir::Program c = passes::compile(examples::build(spec, params), examples::compile_options(params));
  rdu::Graph g = rdu::lower(c);
  auto r = rdu::run(arch, g);
  EXPECT_EQ(r.bytes_read, 4 * (M * K + (M / MM) * K * N));
  EXPECT_EQ(r.bytes_written, 4 * M * N);
  EXPECT_EQ(r.kernel_calls, 1);
  const double ii = double(MM) * K * NN / (4.0 * arch.pcu_lanes * arch.pcu_stages);
  const double paced = (M / MM) * (N / NN) * ii;
  EXPECT_GE(r.cycles, paced);
  // filling the pipeline (the first A and B tiles: 384 KiB, 7.7 k cycles at the peak rate) and draining
  // it (the last C tile) cost a few percent; loads that did not overlap the matmul would add at least the
  // bandwidth roof (123 k cycles, 35 %)
  EXPECT_LE(r.cycles, 1.05 * paced) << "the loads should hide behind the matmul";
}

TEST(RduLower, LlamaDecoderIsOneKernelCallOnSn40lAndFiveOnPlasticine) {
  // The registered llama_decoder is the Llama generator at its toy default (2 layers, d 64, 4/2 heads of
  // 16, FFN 128, vocab 96, 4 tokens over a 32-position cache). Slide 57: the SN40L holds the whole model
  // in one kernel call. The 64-PCU Plasticine needs five: per layer, the call that holds the QKV block
  // ends where the attention's online-softmax fold (a loop-carried cycle, kept in one call) no longer
  // fits what is left, and the next ends when a stage runs out of PMUs; the last call holds the rest of
  // layer 1, the final norm and the LM head.
  const auto& spec = examples::find_program("llama_decoder");
  examples::Params params = examples::resolve(spec, {});
  ir::Program c = passes::compile(examples::build(spec, params), examples::compile_options(params));
  rdu::RunOptions no_place;  // the split into calls comes from the mapping, before placement
  no_place.place = false;
  rdu::Graph g1 = rdu::lower(c);
  EXPECT_EQ(rdu::run(rdu::load_arch("sn40l"), g1, no_place).kernel_calls, 1);
  rdu::Graph g2 = rdu::lower(c);
  auto r = rdu::run(rdu::load_arch("plasticine"), g2, no_place);
  EXPECT_EQ(r.kernel_calls, 5);
  ASSERT_EQ(r.split_reasons.size(), 4u);
  for (int layer = 0; layer < 2; ++layer) {
    const std::string& fold = r.split_reasons[size_t(2 * layer)];
    const std::string& pmus = r.split_reasons[size_t(2 * layer + 1)];
    EXPECT_NE(fold.find("kernel call " + std::to_string(2 * layer + 1) + " ends: the loop-carried cycle"),
              std::string::npos)
        << fold;
    EXPECT_NE(pmus.find("kernel call " + std::to_string(2 * layer + 2) + " ends: stage"), std::string::npos)
        << pmus;
    EXPECT_NE(pmus.find("PMUs"), std::string::npos) << pmus;
  }
}

// Issue-level check of weight streaming: at Llama-3.1-8B's shapes a 4096 x 4096 weight alone is more than
// an 8 MiB on-chip budget, so loading it whole cannot compile; streamed in row tiles (each projection a
// METAPIPE over its weight's tiles, double-buffered) one decoder layer compiles and maps onto the SN40L
// in one kernel call. Mapping only: the simulation of this layer is `metapipe sim llama`'s job.
TEST(RduLower, Llama31LayerStreamsItsWeightsInOneKernelCallOnSn40l) {
  models::LlamaConfig c = models::LlamaConfig::preset("llama3.1-8b");
  c.layers = 1;
  models::LlamaProgramOptions o;
  o.context = 1024;
  o.part = models::LlamaProgramOptions::Part::Decoders;
  o.weight_dtype = o.cache_dtype = ir::DType::bf16;
  passes::CompileOptions co;
  co.tile.onchip_budget = 8 << 20;
  try {
    passes::compile(models::build_llama_program(c, o), co);
    FAIL() << "a whole 4096 x 4096 weight fitted an 8 MiB budget";
  } catch (const user_error& e) {
    EXPECT_NE(std::string(e.what()).find("more than the on-chip budget"), std::string::npos) << e.what();
  }
  o.weight_tile = 64;
  ir::Program p = passes::compile(models::build_llama_program(c, o), co);
  const rdu::Arch a = rdu::load_arch("sn40l");
  rdu::Graph g = rdu::lower(p);
  rdu::Mapping m = rdu::map_graph(a, g);
  EXPECT_EQ(m.kernel_calls(), 1);
  // every weight is read by a load stage of 64-row tiles: 64 x 4096 bf16 = 512 KiB (ffn_down: 64 x 14336);
  // Q and K in whole heads (128 rows), since their RoPE runs in the same loop
  int streamed = 0;
  for (auto& s : m.configs[0].graph.stages)
    if (s.kind == rdu::StageKind::Load && s.name.find(".weight") != std::string::npos && s.iterations > 1) {
      ++streamed;
      const bool qk = s.name.find("attn_q") != std::string::npos || s.name.find("attn_k") != std::string::npos;
      const int64_t cols = s.name.find("ffn_down") != std::string::npos ? 14336 : 4096;
      EXPECT_EQ(s.access.bytes(), (qk ? 128 : 64) * cols * 2) << s.name;
    }
  EXPECT_EQ(streamed, 7);  // q, k, v, o, gate, up, down
}

// Imposed call boundaries (a fusion level): a split before every later statement gives one call per
// top-level statement that has a stage, each ending with the reason the caller gave.
TEST(RduLower, ImposedSplitsEndCallsWithTheCallersReason) {
  const auto& spec = examples::find_program("llama_decoder");
  examples::Params params = examples::resolve(spec, {"layers=1"});
  ir::Program c = passes::compile(examples::build(spec, params), examples::compile_options(params));
  rdu::Graph g = rdu::lower(c);
  std::set<int> statements;
  for (auto& s : g.stages) statements.insert(s.statement);
  rdu::MapOptions mo;
  mo.split_between = [](int, int b) { return "statement " + std::to_string(b) + " starts"; };
  rdu::Mapping m = rdu::map_graph(rdu::load_arch("sn40l"), g, mo);
  EXPECT_EQ(m.kernel_calls(), int(statements.size()));
  for (int k = 0; k + 1 < m.kernel_calls(); ++k)
    EXPECT_NE(m.configs[size_t(k)].why.find("statement"), std::string::npos) << m.configs[size_t(k)].why;
  EXPECT_EQ(rdu::map_graph(rdu::load_arch("sn40l"), g).kernel_calls(), 1);  // without them
}

TEST(RduLower, ProgramsMustBeMetapipelinedFirst) {
  const auto& spec = examples::find_program("softmax");
  examples::Params params = examples::resolve(spec, {});
  ir::Program p = examples::build(spec, params);
  try {
    rdu::lower(p);
    FAIL();
  } catch (const user_error& e) {
    EXPECT_NE(std::string(e.what()).find("is not metapipelined"), std::string::npos) << e.what();
  }
}

// The Spatial (PLDI 2018) figure again, now from the BlackScholes written in the front end
// (examples/spatial/blackscholes.cpp), compiled by the passes and lowered: 2.33 ms and 77.4 % of the load
// bandwidth for 960,000 options on Plasticine with one DDR3-1600 channel; within 15 %.
TEST(RduLower, FrontEndBlackScholesReproducesTheSpatialFigure) {
  rdu::Arch arch = rdu::load_arch("plasticine");
  rdu::apply_override(arch, "memory.ddr.channels=1");
  const auto& spec = examples::find_program("blackscholes");
  examples::Params params = examples::resolve(spec, {"N=960000", "TS=6400"});
  ir::Program c = passes::compile(examples::build(spec, params), examples::compile_options(params));
  rdu::Graph g = rdu::lower(c);
  auto r = rdu::run(arch, g);
  EXPECT_NEAR(r.seconds * 1e3, 2.33, 0.15 * 2.33);
  EXPECT_NEAR(r.load_bw_pct, 77.4, 0.15 * 77.4);
  EXPECT_EQ(r.bytes_read, 960000LL * 24);
}
