// Times the tile layer's attention kernels (kernels/attention.h) on a list of shapes and prints one CSV
// row per shape: the time per launch is the median of settled batches of launches (time_attention: a
// batch of about --batch-ms of work to let the clock settle, then --samples timed batches, CUDA events).
// Each shape is checked first on fresh random inputs (sampled rows against CPU fp64); a shape that fails
// its check is printed with status FAIL and no time. --decode-config times every decode shape once per
// launch config listed (';'-separated, parse_attention_decode_config: e.g. "default;bps=3;waves=2"), each
// checked before it is timed, for choosing the decode's layout on a GPU; the configs change the speed,
// not the result.
//   usage: bench_attention [--set protocol|llama|decode|backward|all] [--samples N] [--batch-ms T]
//                          [--decode-config LIST]
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "core/device.h"
#include "core/error.h"
#include "kernels/attention.h"

using namespace mp::kernels;

namespace {
struct Case {
  const char* pass;  // fwd, bwd (the CUDA-core backward), bwd-wg (the wgmma backward), decode
  AttentionShape s;
  bool causal;
  AttentionDecodeConfig decode = {};
};
AttentionShape shape(int b, int h, int hkv, int nq, int nkv, int d) {
  AttentionShape s;
  s.batch = b, s.heads = h, s.kv_heads = hkv, s.seq_q = nq, s.seq_kv = nkv, s.dim = d;
  return s;
}
// FlashAttention-3's protocol: batch x seq = 16k tokens, 2048 hidden (d64: 32 heads, d128: 16, d256: 8).
void protocol(std::vector<Case>& v) {
  for (int d : {64, 128, 256})
    for (bool causal : {false, true})
      for (int n : {512, 2048, 8192, 16384})
        v.push_back({"fwd", shape(16384 / n, 2048 / d, 2048 / d, n, n, d), causal});
}
// Llama-3.1-8B: prefill of 4k (32 query heads, 8 KV heads, d128) and decode of one row against 8k and 32k.
void decode(std::vector<Case>& v) {
  for (int b : {1, 8})
    for (int kv : {8192, 32768}) v.push_back({"decode", shape(b, 32, 8, 1, kv, 128), false});
}
void llama(std::vector<Case>& v) {
  for (bool causal : {false, true}) v.push_back({"fwd", shape(1, 32, 8, 4096, 4096, 128), causal});
  decode(v);
}
// The backward at the protocol's 2k, d128, and the Llama prefill: the wgmma one on the protocol's dims 64
// and 128 too, the CUDA-core one (slow: about 100 ms a launch) on two shapes for the A/B.
void backward(std::vector<Case>& v) {
  for (bool causal : {false, true}) {
    for (int d : {64, 128})
      for (int n : {2048, 8192})
        v.push_back({"bwd-wg", shape(16384 / n, 2048 / d, 2048 / d, n, n, d), causal});
    v.push_back({"bwd-wg", shape(1, 32, 8, 4096, 4096, 128), causal});
    v.push_back({"bwd", shape(8, 16, 16, 2048, 2048, 128), causal});
  }
}
[[noreturn]] void usage(const char* why) {
  std::fprintf(stderr,
               "bench_attention: %s\nusage: bench_attention [--set protocol|llama|decode|backward|all] "
               "[--samples N] [--batch-ms T] [--decode-config 'default;bps=3;...']\n",
               why);
  std::exit(2);
}
}  // namespace

int main(int argc, char** argv) {
  std::string set = "all";
  int samples = 5;
  double batch_ms = 100;
  std::string decode_configs = "default";
  for (int i = 1; i < argc; ++i) {
    auto next = [&]() -> const char* {
      if (i + 1 >= argc) usage("an option lacks its value");
      return argv[++i];
    };
    if (!std::strcmp(argv[i], "--set"))
      set = next();
    else if (!std::strcmp(argv[i], "--samples"))
      samples = std::atoi(next());
    else if (!std::strcmp(argv[i], "--batch-ms"))
      batch_ms = std::atof(next());
    else if (!std::strcmp(argv[i], "--decode-config"))
      decode_configs = next();
    else
      usage((std::string("unknown option ") + argv[i]).c_str());
  }
  std::vector<Case> cases;
  if (set == "protocol" || set == "all") protocol(cases);
  if (set == "llama" || set == "all") llama(cases);
  if (set == "decode") decode(cases);
  if (set == "backward" || set == "all") backward(cases);
  if (cases.empty()) usage("--set is protocol, llama, decode, backward or all");
  std::vector<AttentionDecodeConfig> configs;
  try {
    for (size_t at = 0; at <= decode_configs.size();) {
      const size_t end = std::min(decode_configs.find(';', at), decode_configs.size());
      configs.push_back(parse_attention_decode_config(decode_configs.substr(at, end - at)));
      at = end + 1;
    }
  } catch (const mp::user_error& e) {
    usage(e.what());
  }
  std::vector<Case> expanded;
  for (const Case& c : cases)
    if (!std::strcmp(c.pass, "decode"))
      for (const auto& config : configs) expanded.push_back({c.pass, c.s, c.causal, config});
    else
      expanded.push_back(c);
  cases = expanded;
  try {  // a config that names something not built is a usage error before anything runs
    for (const Case& c : cases)
      if (!std::strcmp(c.pass, "decode")) attention_decode_plan(c.s, 1, c.decode);
  } catch (const mp::user_error& e) {
    usage(e.what());
  }
  std::printf("pass,dim,causal,batch,heads,kv_heads,seq_q,seq_kv,status,ms,tflops,gbps,decode_config\n");
  const auto gpu = mp::query_gpu();
  int failed = 0;
  for (const Case& c : cases) {
    const bool bwd_wgmma = !std::strcmp(c.pass, "bwd-wg");
    const auto impl = bwd_wgmma ? attention_backward_impl::wgmma : attention_backward_impl::cuda_core;
    const auto pass = !std::strcmp(c.pass, "fwd")                ? attention_pass::forward
                      : !std::strcmp(c.pass, "bwd") || bwd_wgmma ? attention_pass::backward
                                                                 : attention_pass::decode;
    const auto& s = c.s;
    std::string status = "ok";
    AttentionTiming t;
    try {
      AttentionCheckOptions opt;
      opt.causal = c.causal;
      opt.backward_impl = impl;
      opt.full_reference_limit = 0;  // sampled rows: the check must not take longer than the timing
      opt.decode = c.decode;
      const auto r = check_attention(s, pass, opt);
      if (!r.ok) status = "FAIL";
      if (r.ok) t = time_attention(s, pass, c.causal, samples, batch_ms, impl, c.decode);
    } catch (const mp::user_error& e) {
      std::fprintf(stderr, "%s %s: %s\n", c.pass, s.str().c_str(), e.what());
      status = "ERROR";
    }
    failed += status != "ok";
    const double gbps =
        pass == attention_pass::decode && t.ms > 0 ? double(s.kv_elems()) * 4 / (t.ms * 1e-3) / 1e9 : 0;
    // The decode's config and the plan it gave on this GPU, without commas (one CSV field).
    std::string config;
    if (pass == attention_pass::decode && gpu) {
      config = c.decode.str();
      std::replace(config.begin(), config.end(), ',', ' ');
      try {
        const auto plan = attention_decode_plan(s, gpu->sm_count, c.decode);
        config += ": " + std::to_string(plan.splits) + " slices " + std::to_string(plan.blocks) +
                  " blocks on " + std::to_string(plan.slots) + " slots (" + std::to_string(plan.ring.stages) +
                  "-stage ring)";
      } catch (const mp::user_error&) {
        config += ": not a valid plan";
      }
    }
    std::printf("%s,%d,%d,%d,%d,%d,%d,%d,%s,%.4f,%.1f,%.0f,%s\n", c.pass, s.dim, int(c.causal), s.batch,
                s.heads, s.kv_heads, s.seq_q, s.seq_kv, status.c_str(), t.ms, t.tflops, gbps, config.c_str());
    std::fflush(stdout);
  }
  return failed ? 1 : 0;
}
