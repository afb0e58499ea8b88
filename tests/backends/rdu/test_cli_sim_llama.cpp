// `metapipe sim llama` end to end at the toy shapes (2 layers): calls per token at each fusion level,
// the JSON fields, the tensor tiers, and the errors for bad input. Most runs skip place & route
// (--no-place): none of what they check depends on it, and it keeps the suite fast under ASan.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "tests/support/run_cli.h"

namespace {

using Out = mp::test::CliResult;
Out sh(const std::string& args) { return mp::test::run_cli(args); }

// The number after "key": in a JSON object printed one key per line (or inline).
double num(const std::string& json, const std::string& key) {
  const auto at = json.find("\"" + key + "\": ");
  if (at == std::string::npos) {
    ADD_FAILURE() << "no key " << key << " in " << json;
    return -1;
  }
  return std::strtod(json.c_str() + at + key.size() + 4, nullptr);
}
// The first number after "key": following `from` (for nested objects such as "lone_layer").
double num_after(const std::string& json, const std::string& from, const std::string& key) {
  const auto at = json.find("\"" + from + "\"");
  if (at == std::string::npos) {
    ADD_FAILURE() << "no key " << from;
    return -1;
  }
  return num(json.substr(at), key);
}

}  // namespace

TEST(SimLlama, CallsPerTokenAtEachFusionLevel) {
  // all: the embedding, both layers (one configuration that the layer loop reruns) and the LM head, a
  // call each (slide 58); per-layer: the embedding, each layer and the head on their own (layers + 2);
  // per-op: every top-level statement its own call, the lone layer's calls repeated for the second layer.
  auto all = sh("sim llama --shapes toy --fuse all --json --no-place");
  auto layer = sh("sim llama --shapes toy --fuse per-layer --json --no-place");
  auto op = sh("sim llama --shapes toy --fuse per-op --json --no-place");
  ASSERT_EQ(all.status, 0) << all.out;
  ASSERT_EQ(layer.status, 0) << layer.out;
  ASSERT_EQ(op.status, 0) << op.out;
  EXPECT_EQ(num(all.out, "calls_per_token"), 3);
  EXPECT_NE(all.out.find("all-decoder fusion: the embedding ends"), std::string::npos) << all.out;
  EXPECT_NE(all.out.find("all-decoder fusion: the decoder layers end"), std::string::npos) << all.out;
  EXPECT_EQ(num(layer.out, "calls_per_token"), 4);
  EXPECT_NE(layer.out.find("per-layer fusion: the embedding ends"), std::string::npos) << layer.out;
  EXPECT_NE(layer.out.find("per-layer fusion: decoder layer 0 ends"), std::string::npos) << layer.out;
  const double op_calls = num(op.out, "calls_per_token");
  EXPECT_EQ(op_calls, num_after(op.out, "one_layer_model", "calls") + num_after(op.out, "lone_layer", "calls"));
  EXPECT_GT(op_calls, 20);  // a norm alone is a reduction, a zip and a load
  EXPECT_NE(op.out.find("calls end at a statement boundary (per-op fusion)"), std::string::npos) << op.out;
  // every call loads its configuration: more calls, more time at these sizes
  EXPECT_LT(num(all.out, "ms_per_token"), num(layer.out, "ms_per_token"));
  EXPECT_LT(num(layer.out, "ms_per_token"), num(op.out, "ms_per_token"));
}

TEST(SimLlama, JsonCarriesTheRequiredFields) {
  auto o = sh("sim llama --shapes toy --json --tokens 3 --context 32");
  ASSERT_EQ(o.status, 0) << o.out;
  const double ms = num(o.out, "ms_per_token"), tps = num(o.out, "tokens_per_s"), f = num(o.out, "hbm_fraction");
  EXPECT_GT(ms, 0);
  EXPECT_NEAR(tps, 1e3 / ms, 1e-3 * tps);
  EXPECT_GT(f, 0);
  EXPECT_LE(f, 1);
  EXPECT_NEAR(num(o.out, "ms_total"), 3 * ms, 1e-3 * ms);
  EXPECT_EQ(num(o.out, "context"), 32);
  EXPECT_NE(o.out.find("\"method\": \"simulated cycle by cycle"), std::string::npos) << o.out;
}

TEST(SimLlama, TiersNameWhereEachTensorLives) {
  // 16-row weight tiles of d_model 64 in bf16: 2 KiB, double-buffered through PMUs; the program memory
  // is HBM on the SN40L and DDR on Plasticine
  auto o = sh("sim llama --shapes toy --weight-tile 16 --json --no-place");
  ASSERT_EQ(o.status, 0) << o.out;
  EXPECT_NE(o.out.find("{\"tensor\": \"blk.0.ffn_up.weight\", \"tier\": \"HBM\", \"bytes\": 16384, "
                       "\"tile_bytes\": 2048, \"depth\": "),
            std::string::npos)
      << o.out;
  EXPECT_GE(num_after(o.out, "blk.0.ffn_up.weight", "depth"), 2);  // at least double-buffered
  auto t = sh("sim llama --shapes toy --weight-tile 16 --no-place");
  ASSERT_EQ(t.status, 0) << t.out;
  EXPECT_NE(t.out.find("on-chip buffers (largest call)  SRAM"), std::string::npos) << t.out;
  auto p = sh("sim llama --shapes toy --arch plasticine --json --no-place");
  ASSERT_EQ(p.status, 0) << p.out;
  EXPECT_NE(p.out.find("\"tier\": \"DDR\""), std::string::npos) << p.out;
}

TEST(SimLlama, BadInputIsAOneLineError) {
  struct Case {
    const char* args;
    int status;
    const char* message;
  };
  for (const Case& c : {
           Case{"--fuse layerwise", 2, "--fuse must be per-op, per-layer or all (got 'layerwise')"},
           Case{"--sockets 0", 2, "--sockets must be >= 1 (got 0)"},
           Case{"--sockets 2", 1, "not supported yet: --sockets 2: tensor-parallel"},
           Case{"--functional", 1, "not supported yet: sim llama --functional"},
           Case{"--model no-such-model.gguf", 1, "no-such-model.gguf: cannot open the model file"},
           Case{"--model a.gguf --shapes toy", 2, "give either --model or --shapes, not both"},
           Case{"--shapes toy --context 65", 2, "--context must be in [1, 64]"},
           Case{"--shapes toy --tokens 0", 2, "--tokens must be in [1, 16777216] (got 0)"},
           Case{"--shapes bogus", 1, "unknown model shapes 'bogus'"},
           Case{"--shapes toy --weight-tile 0", 2, "--weight-tile must be in [1, 1048576] rows (got 0)"},
           Case{"--shapes toy --frobnicate", 2, "unknown option '--frobnicate'"},
       }) {
    auto o = sh(std::string("sim llama ") + c.args);
    EXPECT_EQ(o.status, c.status) << c.args << ": " << o.out;
    EXPECT_NE(o.out.find(c.message), std::string::npos) << c.args << ": " << o.out;
    EXPECT_EQ(o.out.find('\n'), o.out.size() - 1) << c.args << ": one line: " << o.out;
  }
}
