// `metapipe sim llama` end to end at the toy shapes (2 layers): calls per token at each fusion level,
// the JSON fields, the tensor tiers, and the errors for bad input. Most runs skip place & route
// (--no-place): none of what they check depends on it, and it keeps the suite fast under ASan.
#include <gtest/gtest.h>

#include <algorithm>
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
  EXPECT_EQ(op_calls,
            num_after(op.out, "one_layer_model", "calls") + num_after(op.out, "lone_layer", "calls"));
  EXPECT_GT(op_calls, 20);  // a norm alone is a reduction, a zip and a load
  EXPECT_NE(op.out.find("calls end at a statement boundary (per-op fusion)"), std::string::npos) << op.out;
  // every call loads its configuration: more calls, more time at these sizes
  EXPECT_LT(num(all.out, "ms_per_token"), num(layer.out, "ms_per_token"));
  EXPECT_LT(num(layer.out, "ms_per_token"), num(op.out, "ms_per_token"));
}

TEST(SimLlama, JsonCarriesTheRequiredFields) {
  auto o = sh("sim llama --shapes toy --json --tokens 3 --context 32");
  ASSERT_EQ(o.status, 0) << o.out;
  const double ms = num(o.out, "ms_per_token"), tps = num(o.out, "tokens_per_s"),
               f = num(o.out, "hbm_fraction");
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
           Case{"--sockets 0", 2, "--sockets must be in [1, 1024] (got 0)"},
           Case{"--shapes toy --sockets 4", 2,
                "--sockets 4 must divide the model's heads (4), KV heads (2) and FFN width (128): use one of "
                "1, 2"},
           Case{"--shapes smollm2-135m --sockets 2", 2,
                "--sockets 2 must divide the model's heads (9), KV heads (3) and FFN width (1536): use one "
                "of 1, 3"},
           Case{"--shapes toy --sockets 2 --set socket.link_gbs=0", 1,
                "key 'socket.link_gbs' expects a number in [0.001, 100000], got '0'"},
           Case{"--shapes toy --functional --sockets 2", 2,
                "--functional runs one socket (drop --sockets 2)"},
           Case{"--shapes toy --functional --tokens 20 --context 16", 2,
                "--functional decodes one token per cache position: --tokens 20 needs --context >= 20 (got "
                "16)"},
           Case{"--shapes toy --layers 3", 2, "--layers must be in [1, 2] (the model's layers; got 3)"},
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

TEST(SimLlama, SocketsSplitTheModelAndOverlapTheAllReduces) {
  // Toy shapes (2 layers, 4/2 heads, FFN 128) on two sockets: each simulates a shard of 2/1 heads and
  // FFN 64; two all-reduces per layer of the [1, 64] f32 partial sums (256 B), each one exchange with the
  // other socket (recursive doubling, faster than a ring's 2 steps of 128 B): 1000 ns + 256 B / 64 GB/s
  // = 1.004 us with the SN40L's links.
  auto one = sh("sim llama --shapes toy --json --no-place");
  auto two = sh("sim llama --shapes toy --sockets 2 --json --no-place");
  ASSERT_EQ(one.status, 0) << one.out;
  ASSERT_EQ(two.status, 0) << two.out;
  EXPECT_EQ(num(one.out, "sockets"), 1);
  EXPECT_EQ(num(one.out, "all_reduces_per_token"), 4);  // counted, but free on one socket
  EXPECT_EQ(num(one.out, "all_reduce_ms_per_token"), 0);
  EXPECT_EQ(num(two.out, "sockets"), 2);
  EXPECT_NE(two.out.find("\"shard\": \"2 layers, d 64, 2/1 heads of 16, FFN 64, vocab 48"), std::string::npos)
      << two.out;
  EXPECT_EQ(num(two.out, "calls_per_token"), 3);  // every socket runs the same calls
  EXPECT_EQ(num(two.out, "all_reduces_per_token"), 4);
  EXPECT_EQ(num(two.out, "all_reduce_bytes"), 256);
  EXPECT_NEAR(num(two.out, "all_reduce_us_each"), 1.004, 1e-3);
  EXPECT_NEAR(num(two.out, "all_reduce_ms_per_token"), 4 * 1.004e-3, 1e-5);
  const double hidden = num(two.out, "all_reduce_hidden_fraction");
  EXPECT_GE(hidden, 0);
  EXPECT_LE(hidden, 1);
  EXPECT_LE(num(two.out, "all_reduce_exposed_ms_per_token"), num(two.out, "all_reduce_ms_per_token"));
  // An all-reduce far longer than anything it could overlap with (100 us per ring step against a layer of
  // a few us): almost all of it is exposed, and the token takes that much longer.
  auto slow = sh("sim llama --shapes toy --sockets 2 --json --no-place --set socket.link_latency_ns=100000");
  ASSERT_EQ(slow.status, 0) << slow.out;
  const double slow_ar = num(slow.out, "all_reduce_ms_per_token");
  EXPECT_NEAR(slow_ar, 4 * 0.1, 1e-3);
  EXPECT_LT(num(slow.out, "all_reduce_hidden_fraction"), 0.1);
  EXPECT_GT(num(slow.out, "ms_per_token") - num(two.out, "ms_per_token"), 0.9 * slow_ar);
  // At these sizes the token is mostly configuration loads and latency: two sockets pay only with a free
  // link (then they are faster: half the weights each), not with the SN40L's 1 us per transfer.
  auto free = sh("sim llama --shapes toy --sockets 2 --json --no-place --set socket.link_latency_ns=0");
  ASSERT_EQ(free.status, 0) << free.out;
  EXPECT_LT(num(free.out, "ms_per_token"), num(one.out, "ms_per_token"));
  EXPECT_GT(num(two.out, "ms_per_token"), num(one.out, "ms_per_token"));
  // half of every weight per socket
  EXPECT_NEAR(num(two.out, "bytes_per_token"), num(one.out, "bytes_per_token") / 2,
              0.1 * num(one.out, "bytes_per_token"));
}

TEST(SimLlama, SocketsPayOnlyWhereTheLinkIsFastEnough) {
  // SmolLM2's shapes (30 layers of 576, 9/3 heads: 3 sockets) over a 64-position cache. Its layers are
  // small enough that every weight is on chip before the all-reduce that precedes it, so nothing hides
  // it: with 1 us per link transfer the 60 all-reduces (4 ring steps each) cost more than a third of the
  // weights saves, and 3 sockets are slower than one; with 100 ns links they are faster.
  const std::string base = "sim llama --shapes smollm2-135m --context 64 --json --no-place";
  auto one = sh(base);
  auto slow = sh(base + " --sockets 3");
  auto fast = sh(base + " --sockets 3 --set socket.link_latency_ns=100");
  ASSERT_EQ(one.status, 0) << one.out;
  ASSERT_EQ(slow.status, 0) << slow.out;
  ASSERT_EQ(fast.status, 0) << fast.out;
  EXPECT_EQ(num(slow.out, "all_reduces_per_token"), 60);
  EXPECT_GT(num(slow.out, "ms_per_token"), num(one.out, "ms_per_token"));
  EXPECT_LT(num(fast.out, "ms_per_token"), num(one.out, "ms_per_token"));
  EXPECT_LT(num(fast.out, "all_reduce_ms_per_token"), num(slow.out, "all_reduce_ms_per_token") / 5);
  for (auto* o : {&slow, &fast}) {
    EXPECT_GE(num(o->out, "all_reduce_hidden_fraction"), 0);
    EXPECT_LE(num(o->out, "all_reduce_hidden_fraction"), 1);
  }
}

TEST(SimLlama, FunctionalDecodingGivesTheCpuInterpretersGreedyTokens) {
  // The toy shapes with random weights, 8 tokens decoded greedily one per step, the KV cache kept in the
  // simulated memory between steps (the CLI's default is SmolLM2 from its file and 16 tokens: minutes,
  // too slow for a test). Every simulated unit computes: a token-ordering bug changes the logits.
  auto o = sh("sim llama --shapes toy --functional --tokens 8 --json");
  ASSERT_EQ(o.status, 0) << o.out;
  EXPECT_NE(o.out.find("\"match\": true"), std::string::npos) << o.out;
  EXPECT_EQ(num(o.out, "matching_tokens"), 8);
  const auto list = [&](const std::string& key) {
    const auto at = o.out.find("\"" + key + "\": [");
    return at == std::string::npos
               ? std::string("missing")
               : o.out.substr(at + key.size() + 4, o.out.find(']', at) - at - key.size() - 4);
  };
  EXPECT_EQ(list("tokens_simulated"), list("tokens_cpu"));
  const std::string cpu = list("tokens_cpu");
  EXPECT_EQ(std::count(cpu.begin(), cpu.end(), ','), 7) << cpu;
  EXPECT_LT(num(o.out, "max_logit_abs_diff"), 1e-4);
  EXPECT_GT(num(o.out, "simulated_cycles"), 0);
  // one decoder layer: a different program, the same agreement
  auto one = sh("sim llama --shapes toy --functional --tokens 4 --layers 1");
  ASSERT_EQ(one.status, 0) << one.out;
  EXPECT_NE(one.out.find("4 of 4 tokens equal"), std::string::npos) << one.out;
}
