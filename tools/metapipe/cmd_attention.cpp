// `metapipe attention`: the tile layer's attention kernels (forward, split-KV decode, backward) on the GPU,
// checked against the CPU fp64 reference on fresh random inputs and timed. The references it is compared
// with (cuDNN and FlashAttention-2 through PyTorch SDPA) are timed in the same run by
// bench/attention/device-attention.sh, not here: the CLI links no PyTorch.
#include <cstdio>
#include <cstdlib>
#include <iostream>

#include "kernels/attention.h"
#include "tools/metapipe/cli.h"

namespace mp::cli {
namespace {

// "A" or "A:B" as two positive numbers (B = A when absent).
std::pair<long long, long long> pair_of(const std::string& option, const std::string& text) {
  auto number = [&](const std::string& s) {
    try {
      size_t used = 0;
      const long long v = std::stoll(s, &used);
      if (used != s.size() || v < 1 || v > (1ll << 30)) throw std::invalid_argument("");
      return v;
    } catch (const std::exception&) {
      throw usage_error(option + " takes a positive number or two as A:B, got '" + text + "'");
    }
  };
  const size_t colon = text.find(':');
  if (colon == std::string::npos) {
    const long long v = number(text);
    return {v, v};
  }
  return {number(text.substr(0, colon)), number(text.substr(colon + 1))};
}

int run_attention(Args& a) {
  const bool causal = a.flag({"--causal"});
  const bool backward = a.flag({"--backward"});
  const bool decode = a.flag({"--decode"});
  const bool check_only = a.flag({"--check-only"});
  const auto batch = a.integer({"--batch"});
  const auto heads = a.value({"--heads"});
  const auto seq = a.value({"--seq"});
  const auto dim = a.integer({"--dim"});
  const auto samples = a.integer({"--samples"});
  const auto seed = a.integer({"--seed"});
  const auto impl_name = a.value({"--backward-impl"});
  a.finish();
  if (backward && decode)
    throw usage_error("--backward and --decode exclude each other (the decode has no backward)");
  if (!seq) throw usage_error("--seq N[:Nkv] is needed (query length, and the KV length if different)");
  if (samples && (*samples < 1 || *samples > 1000)) throw usage_error("--samples is 1 to 1000");
  if (batch && (*batch < 1 || *batch > (1ll << 30))) throw usage_error("--batch is a positive number");
  if (dim && (*dim < 1 || *dim > (1ll << 30))) throw usage_error("--dim is a positive number");
  if (seed && *seed < 1) throw usage_error("--seed is a positive number");
  if (impl_name && !backward) throw usage_error("--backward-impl needs --backward");
  auto impl = kernels::attention_backward_impl::automatic;
  if (impl_name) {
    if (*impl_name == "wgmma")
      impl = kernels::attention_backward_impl::wgmma;
    else if (*impl_name == "cuda-core")
      impl = kernels::attention_backward_impl::cuda_core;
    else if (*impl_name != "auto")
      throw usage_error("--backward-impl is auto, cuda-core or wgmma, got '" + *impl_name + "'");
  }
  kernels::AttentionShape s;
  s.batch = int(batch.value_or(1));
  const auto [h, hkv] = pair_of("--heads", heads.value_or("16"));
  const auto [nq, nkv] = pair_of("--seq", *seq);
  s.heads = int(h), s.kv_heads = int(hkv), s.seq_q = int(nq), s.seq_kv = int(nkv);
  s.dim = int(dim.value_or(128));
  impl = kernels::attention_backward_resolve(impl, s.dim);
  if (impl == kernels::attention_backward_impl::wgmma && s.dim == 256)
    throw not_supported(
        "--backward-impl wgmma for --dim 256 (the dK and dV accumulators would need 256 "
        "registers per thread); use --backward-impl cuda-core");
  const auto pass = decode     ? kernels::attention_pass::decode
                    : backward ? kernels::attention_pass::backward
                               : kernels::attention_pass::forward;
  decode ? kernels::check_attention_decode_shape(s) : kernels::check_attention_shape(s);

  // (no "metapipe attention" in these messages: the error line names the command once)
  auto gpu = query_gpu();
  if (!gpu) fail_user("needs a Hopper GPU (sm_90): ", gpu_absent_reason());
  if (!gpu_is_hopper(*gpu)) fail_user("needs a Hopper GPU (sm_90); found ", gpu->name);

  kernels::AttentionCheckOptions opt;
  opt.causal = causal;
  opt.backward_impl = impl;
  if (seed) opt.seed = uint64_t(*seed);
  const auto r = kernels::check_attention(s, pass, opt);
  const std::string what =
      decode     ? "split-KV decode"
      : backward ? std::string("forward + backward (") + kernels::attention_backward_impl_name(impl) + ")"
                 : "forward";
  std::cout << "attention " << s.str() << (causal ? " causal" : "") << ", " << what << ", bf16, on "
            << gpu->name << "\n";
  if (decode)
    std::cout << "plan:   " << kernels::attention_decode_splits(s, gpu->sm_count)
              << " KV slices per KV head\n";
  std::cout << "check:  " << r.summary() << " against CPU fp64 (seed " << r.seed << ")\n";
  if (!check_only) {
    const auto t = kernels::time_attention(s, pass, causal, int(samples.value_or(10)), 200, impl);
    std::printf("ours:   %s  %.1f TFLOP/s", format_ms(t.ms).c_str(), t.tflops);
    if (decode) std::printf("  %.0f GB/s of K and V", double(s.kv_elems()) * 2 * 2 / (t.ms * 1e-3) / 1e9);
    std::printf(" (median of %d batches of %d launches)\n", int(samples.value_or(10)), t.batch_launches);
    std::printf(
        "reference: cuDNN and FlashAttention-2 (PyTorch SDPA) in the same run: "
        "bench/attention/device-attention.sh\n");
  }
  return r.ok ? 0 : 1;
}

MP_REGISTER_COMMAND(
    "attention", "FlashAttention forward, backward and split-KV decode on the GPU with the tile layer",
    "usage: metapipe attention --seq N[:Nkv] [--batch B] [--heads H[:Hkv]] [--dim D] [--causal]\n"
    "                          [--backward [--backward-impl auto|cuda-core|wgmma] | --decode] [--check-only]\n"
    "                          [--samples N] [--seed S]\n\n"
    "Runs attention on fresh random bf16 inputs of shape (batch, heads, seq, dim) with the tile layer's\n"
    "Hopper kernels, checks O and the row log-sum-exp (and with --backward dQ, dK, dV) against a CPU fp64\n"
    "reference (every row for small shapes, sampled rows for large ones), then times it (median of\n"
    "batches of launches, CUDA events) and prints TFLOP/s, counted as 4 * B * H * N * Nkv * D for the\n"
    "forward, halved when causal, 2.5x that for the backward. Needs a Hopper GPU; without one it says so\n"
    "and exits 1. cuDNN and FlashAttention-2 are timed on the same shapes by\n"
    "bench/attention/device-attention.sh.\n\n"
    "  --seq N[:Nkv]     query length, and the KV length when different (causal masks align the ends)\n"
    "  --batch B         batch size (default 1)\n"
    "  --heads H[:Hkv]   query heads, and KV heads when fewer (GQA; H a multiple of Hkv; default 16)\n"
    "  --dim D           head dim: 64, 128 (default) or 256\n"
    "  --causal          causal mask\n"
    "  --backward        also run and check the backward (dQ, dK, dV), and time it\n"
    "  --backward-impl I the backward's implementation: auto (default: wgmma, or cuda-core for dim 256),\n"
    "                    wgmma (Tensor Cores, dims 64 and 128) or cuda-core (CUDA cores, every dim)\n"
    "  --decode          the split-KV decode kernel (1 to 16 query rows)\n"
    "  --check-only      check, do not time\n"
    "  --samples N       timed batches (default 10)\n"
    "  --seed S          the inputs' seed (default: a fresh one, printed)\n\n"
    "MP_ATTENTION_GRID=auto|per-tile|persistent chooses how the forward's blocks take the query tiles\n"
    "(auto, the default: the persistent grid where it measured faster; docs/attention.md, \"Persistent\n"
    "grid\"); every choice computes the same results.\n"
    "MP_ATTENTION_BWD_DQ=auto|turns|atomic chooses how the wgmma backward adds dQ's partials (auto, the\n"
    "default: turns, one partial per row and block; atomic: one per consumer warpgroup, for A/B timing);\n"
    "both compute the same gradients up to fp32 rounding.\n",
    run_attention);

}  // namespace
}  // namespace mp::cli
