// GPU tests of the attention kernels on Hopper: the forward over head dims 64 / 128 / 256, causal and not,
// GQA and MQA, lengths 1, 17, 1000 and 4097 (partial 64-, 128-row and K/V tiles), seq_q != seq_kv both
// ways; the split-KV decode with 1, 4 and 16 rows and long caches, and its launch configs; the backward
// against the fp64 gradients. Every run is check_attention: fresh random inputs, the outputs poisoned with
// NaN first, every row against CPU fp64 for the small shapes and sampled rows for the large ones.
// Tolerance (stated in kernels/attention_check.cu): max |err| <= 2e-2 * max |ref| per bf16 output tensor
// (bf16 rounds by 2^-9, and the forward rounds P to bf16 too; a wrong mask, tile or head is an error of
// order 1), |LSE err| <= 1e-3.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>

#include "core/device.h"
#include "kernels/attention.h"
#include "tests/support/watchdog.h"

using namespace mp::kernels;

namespace {
bool have_hopper() {
  auto g = mp::query_gpu();
  return g && mp::gpu_is_hopper(*g);
}
AttentionShape shape(int b, int h, int hkv, int nq, int nkv, int d) {
  AttentionShape s;
  s.batch = b, s.heads = h, s.kv_heads = hkv, s.seq_q = nq, s.seq_kv = nkv, s.dim = d;
  return s;
}

void expect_ok(const AttentionShape& s, attention_pass pass, bool causal,
               attention_backward_impl impl = attention_backward_impl::cuda_core,
               const AttentionDecodeConfig& decode = {}) {
  mp::test::Watchdog dog(60, "attention check");
  AttentionCheckOptions opt;
  opt.causal = causal;
  opt.backward_impl = impl;
  opt.decode = decode;
  opt.full_reference_limit = 1ll << 25;  // every row up to about 0.1 s of CPU reference, sampled rows above
  const auto r = check_attention(s, pass, opt);
  EXPECT_TRUE(r.ok) << s.str() << (causal ? " causal" : "")
                    << (pass == attention_pass::backward
                            ? std::string(" ") + attention_backward_impl_name(impl)
                            : std::string())
                    << (pass == attention_pass::decode ? " " + decode.str() : std::string()) << " seed "
                    << r.seed << ": " << r.summary();
}
}  // namespace

TEST(SM90_AttentionForward, DimsMasksAndOddLengths) {
  if (!have_hopper()) GTEST_SKIP() << "no Hopper GPU: " << mp::gpu_absent_reason();
  for (int d : attention_dims)
    for (bool causal : {false, true})
      for (int n : {1, 17, 1000}) expect_ok(shape(2, 4, 4, n, n, d), attention_pass::forward, causal);
}

TEST(SM90_AttentionForward, GqaMqaAndUnequalLengths) {
  if (!have_hopper()) GTEST_SKIP() << "no Hopper GPU: " << mp::gpu_absent_reason();
  for (int d : attention_dims)
    for (bool causal : {false, true}) {
      expect_ok(shape(1, 8, 2, 300, 300, d), attention_pass::forward, causal);  // GQA 8:2
      expect_ok(shape(1, 4, 1, 129, 129, d), attention_pass::forward, causal);  // MQA 4:1
      expect_ok(shape(1, 4, 2, 100, 777, d), attention_pass::forward, causal);  // a cache before the rows
      expect_ok(shape(1, 4, 2, 500, 200, d), attention_pass::forward, causal);  // rows that see no key
    }
}

TEST(SM90_AttentionForward, LongSequences) {
  if (!have_hopper()) GTEST_SKIP() << "no Hopper GPU: " << mp::gpu_absent_reason();
  for (int d : attention_dims)
    for (bool causal : {false, true})
      expect_ok(shape(1, 2, 1, 4097, 4097, d), attention_pass::forward, causal);
  expect_ok(shape(2, 32, 8, 2048, 2048, 128), attention_pass::forward, true);  // the Llama-3.1-8B layout
}

TEST(SM90_AttentionDecode, RowsGroupsAndLongCaches) {
  if (!have_hopper()) GTEST_SKIP() << "no Hopper GPU: " << mp::gpu_absent_reason();
  for (int d : attention_dims)
    for (int rows : {1, 4, 16}) {
      for (bool causal : {false, true}) {
        expect_ok(shape(1, 4, 4, rows, 17, d), attention_pass::decode, causal);
        expect_ok(shape(1, 8, 2, rows, 1000, d), attention_pass::decode, causal);
      }
      expect_ok(shape(2, 8, 2, rows, 8193, d), attention_pass::decode,
                rows == 4);  // long caches: many slices
    }
  expect_ok(shape(1, 32, 8, 1, 32768, 128), attention_pass::decode, false);  // Llama-3.1-8B, batch 1
  expect_ok(shape(8, 32, 8, 1, 8192, 128), attention_pass::decode, false);   // batch 8
  expect_ok(shape(1, 32, 1, 16, 1000, 64), attention_pass::decode, true);    // MQA: 512 rows, 32 row groups
}

// The edges of the decode kernel's layout: 8 rows per block (one 8-row tile of O^T) and 9 (two), a last
// row group of fewer rows, caches that end inside a chunk and inside a warp's 16 keys, one slice (no
// combine) and many; the same shape twice in a row, since the slices' counters must be back at zero for
// the next launch.
TEST(SM90_AttentionDecode, RowTilesChunkEdgesAndRepeats) {
  if (!have_hopper()) GTEST_SKIP() << "no Hopper GPU: " << mp::gpu_absent_reason();
  for (int d : attention_dims) {
    expect_ok(shape(1, 8, 1, 1, 5003, d), attention_pass::decode, false);  // 8 rows
    expect_ok(shape(1, 9, 1, 1, 3001, d), attention_pass::decode, false);  // 9 rows
    expect_ok(shape(2, 6, 2, 3, 777, d), attention_pass::decode, true);    // 9 rows, causal
    expect_ok(shape(1, 20, 1, 1, 70, d), attention_pass::decode, true);    // 20 rows: 16 + 4, one slice
    expect_ok(shape(3, 4, 2, 2, 4104, d), attention_pass::decode, true);   // ends 8 keys into a chunk
  }
  for (int repeat = 0; repeat < 3; ++repeat)
    expect_ok(shape(1, 32, 8, 1, 8192, 128), attention_pass::decode, false);
}

// The decode's launch configs (AttentionDecodeConfig: what bench_attention --decode-config times) must
// all give the same result: the 2-stage ring at 3 blocks per SM and the 6-stage one at 1 (d128), grids of
// two waves, fixed slice counts that deal the chunks unevenly (64 slices of 8193 keys: 129 chunks, the
// last of one key; 33 of 4104 keys: slices of 1 or 2 chunks; 7 of 1000), and programmatic dependent
// launch (three launches back to back in check_attention, sharing the workspace and counters), for 4, 9
// and 16 rows per block, causal and not.
TEST(SM90_AttentionDecode, LaunchConfigs) {
  if (!have_hopper()) GTEST_SKIP() << "no Hopper GPU: " << mp::gpu_absent_reason();
  constexpr auto decode = attention_pass::decode;
  constexpr auto any = attention_backward_impl::automatic;
  for (const char* text :
       {"bps=3", "bps=1", "waves=2", "bps=3,waves=2", "splits=64", "splits=33", "splits=7", "pdl=on"})
    for (int d : attention_dims) {
      const AttentionDecodeConfig c = parse_attention_decode_config(text);
      if (!attention_decode_residency_built(
              d, c.blocks_per_sm > 0 ? c.blocks_per_sm : attention_decode_default_residency(d)))
        continue;
      expect_ok(shape(1, 8, 2, 1, 8193, d), decode, false, any, c);  // 4 rows
      expect_ok(shape(3, 4, 2, 2, 4104, d), decode, true, any, c);   // 4 rows, causal, 8 keys into a chunk
      expect_ok(shape(2, 8, 2, 4, 1000, d), decode, true, any, c);   // 16 rows
      expect_ok(shape(1, 9, 1, 1, 3001, d), decode, false, any, c);  // 9 rows: two row tiles
    }
  for (const char* text : {"bps=3", "bps=1", "waves=2", "bps=3,waves=2", "pdl=on", "waves=2,pdl=on"}) {
    const AttentionDecodeConfig c = parse_attention_decode_config(text);
    expect_ok(shape(1, 32, 8, 1, 32768, 128), decode, false, any, c);  // Llama-3.1-8B, batch 1
    expect_ok(shape(8, 32, 8, 1, 8192, 128), decode, false, any, c);   // batch 8
    for (int repeat = 0; repeat < 2; ++repeat)  // the counters back at zero after each launch
      expect_ok(shape(1, 32, 8, 1, 8192, 128), decode, false, any, c);
  }
}

TEST(SM90_AttentionBackward, GradientsAgainstFp64) {
  if (!have_hopper()) GTEST_SKIP() << "no Hopper GPU: " << mp::gpu_absent_reason();
  for (int d : attention_dims)
    for (bool causal : {false, true}) {
      expect_ok(shape(1, 4, 2, 130, 130, d), attention_pass::backward, causal);
      expect_ok(shape(1, 2, 1, 33, 70, d), attention_pass::backward, causal);
    }
  expect_ok(shape(1, 4, 1, 1, 1, 64), attention_pass::backward, true);
  expect_ok(shape(1, 8, 2, 1024, 1024, 128), attention_pass::backward, true);  // sampled rows and keys
}

// The Tensor-Core backward (dims 64 and 128) against the same fp64 gradients: partial key tiles (one
// consumer's keys all past the end at 33), partial query tiles, GQA and MQA sums of dK, dV inside the
// block, seq_q != seq_kv both ways (rows that see no key: LSE = -inf), several query tiles per key tile.
TEST(SM90_AttentionBackward, WgmmaGradientsAgainstFp64) {
  if (!have_hopper()) GTEST_SKIP() << "no Hopper GPU: " << mp::gpu_absent_reason();
  constexpr auto wgmma = attention_backward_impl::wgmma;
  for (int d : {64, 128})
    for (bool causal : {false, true}) {
      expect_ok(shape(1, 4, 2, 130, 130, d), attention_pass::backward, causal, wgmma);
      expect_ok(shape(1, 2, 1, 33, 70, d), attention_pass::backward, causal, wgmma);
      expect_ok(shape(2, 4, 1, 17, 17, d), attention_pass::backward, causal, wgmma);
      expect_ok(shape(1, 4, 2, 300, 1000, d), attention_pass::backward, causal, wgmma);
      expect_ok(shape(1, 4, 4, 257, 128, d), attention_pass::backward, causal, wgmma);
    }
  expect_ok(shape(1, 4, 1, 1, 1, 64), attention_pass::backward, true, wgmma);
  expect_ok(shape(1, 8, 2, 1024, 1024, 128), attention_pass::backward, true, wgmma);  // sampled rows and keys
  expect_ok(shape(1, 32, 8, 2048, 2048, 128), attention_pass::backward, false, wgmma);  // Llama-3.1-8B layout
  // The default (automatic): wgmma at dim 128, the CUDA-core fallback at dim 256.
  expect_ok(shape(1, 4, 2, 130, 130, 128), attention_pass::backward, true,
            attention_backward_impl::automatic);
  expect_ok(shape(1, 4, 2, 130, 130, 256), attention_pass::backward, true,
            attention_backward_impl::automatic);
}

// The wgmma backward's other dQ layout (MP_ATTENTION_BWD_DQ=atomic: a partial per consumer warpgroup,
// kept for A/B timing) against the same fp64 gradients; the default (turns) is what the test above runs.
TEST(SM90_AttentionBackward, WgmmaAtomicDqLayoutAgainstFp64) {
  if (!have_hopper()) GTEST_SKIP() << "no Hopper GPU: " << mp::gpu_absent_reason();
  constexpr auto wgmma = attention_backward_impl::wgmma;
  setenv("MP_ATTENTION_BWD_DQ", "atomic", 1);
  for (int d : {64, 128})
    for (bool causal : {false, true}) {
      expect_ok(shape(1, 4, 2, 130, 130, d), attention_pass::backward, causal, wgmma);
      expect_ok(shape(1, 4, 2, 300, 1000, d), attention_pass::backward, causal, wgmma);
    }
  unsetenv("MP_ATTENTION_BWD_DQ");
}

// Every pass and implementation on small shapes (partial tiles, GQA, seq_q != seq_kv, a few decode
// slices): the suite compute-sanitizer runs (scripts/device-check --sanitize), where the large shapes of
// the other suites would take too long under the tools.
TEST(SM90_AttentionSmall, EveryPassOnSmallShapes) {
  if (!have_hopper()) GTEST_SKIP() << "no Hopper GPU: " << mp::gpu_absent_reason();
  for (int d : attention_dims) {
    expect_ok(shape(1, 4, 2, 70, 130, d), attention_pass::forward, true);
    expect_ok(shape(1, 4, 2, 70, 130, d), attention_pass::forward, false);
    expect_ok(shape(1, 8, 2, 4, 3000, d), attention_pass::decode, true);
    expect_ok(shape(1, 8, 2, 1, 3000, d), attention_pass::decode, false, attention_backward_impl::automatic,
              parse_attention_decode_config(d == 128 ? "bps=3" : "splits=7"));
    expect_ok(shape(1, 4, 2, 70, 130, d), attention_pass::backward, true, attention_backward_impl::automatic);
  }
  expect_ok(shape(1, 4, 2, 70, 130, 64), attention_pass::backward, true, attention_backward_impl::cuda_core);
}
