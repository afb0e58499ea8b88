// CPU tests of the attention layer: the shape checks and their messages, the fp64 references against a
// naive matrix formulation (forward) and against finite differences (backward), the causal alignment
// when seq_q != seq_kv, the decode's launch plan and its config, and `metapipe attention` as a user runs it
// (errors, and the exit without a GPU).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "core/device.h"
#include "core/error.h"
#include "kernels/attention.h"
#include "tests/support/run_cli.h"

using namespace mp::kernels;

namespace {
std::vector<float> random_values(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  std::vector<float> v(n);
  for (auto& x : v) x = u(rng);
  return v;
}
AttentionShape shape(int b, int h, int hkv, int nq, int nkv, int d) {
  AttentionShape s;
  s.batch = b, s.heads = h, s.kv_heads = hkv, s.seq_q = nq, s.seq_kv = nkv, s.dim = d;
  return s;
}
std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const mp::user_error& e) {
    return e.what();
  }
  return "";
}
bool one_line(const std::string& s) { return !s.empty() && s.find('\n') == s.size() - 1; }

// The textbook formula, written as whole matrices per (batch, head): S = scale Q K^T, masked entries
// removed, P = softmax(S) by rows, O = P V, LSE = log sum exp S.
void naive_forward(const AttentionShape& s, const std::vector<float>& q, const std::vector<float>& k,
                   const std::vector<float>& v, double scale, bool causal, std::vector<double>& o,
                   std::vector<double>& lse) {
  const int d = s.dim;
  o.assign(s.q_elems(), 0.0);
  lse.assign(s.lse_elems(), 0.0);
  for (int b = 0; b < s.batch; ++b)
    for (int h = 0; h < s.heads; ++h) {
      const int hk = h * s.kv_heads / s.heads;  // the same mapping as h / (heads / kv_heads)
      std::vector<std::vector<double>> S(size_t(s.seq_q), std::vector<double>(size_t(s.seq_kv)));
      for (int i = 0; i < s.seq_q; ++i)
        for (int j = 0; j < s.seq_kv; ++j) {
          double acc = 0;
          for (int c = 0; c < d; ++c)
            acc += double(q[((size_t(b) * s.heads + h) * s.seq_q + i) * d + c]) *
                   double(k[((size_t(b) * s.kv_heads + hk) * s.seq_kv + j) * d + c]);
          const bool masked = causal && (s.seq_kv - s.seq_q) + i < j;
          S[size_t(i)][size_t(j)] = masked ? -INFINITY : acc * scale;
        }
      for (int i = 0; i < s.seq_q; ++i) {
        const size_t row = (size_t(b) * s.heads + h) * s.seq_q + i;
        double z = 0;
        for (double x : S[size_t(i)]) z += std::exp(x);
        lse[row] = std::log(z);  // log(0) = -inf for a row that sees nothing
        for (int j = 0; j < s.seq_kv; ++j) {
          const double p = z > 0 ? std::exp(S[size_t(i)][size_t(j)]) / z : 0.0;
          for (int c = 0; c < d; ++c)
            o[row * d + c] += p * double(v[((size_t(b) * s.kv_heads + hk) * s.seq_kv + j) * d + c]);
        }
      }
    }
}
}  // namespace

TEST(Attention, ShapeErrorsNameTheArgument) {
  EXPECT_NE(
      error_of([] { check_attention_shape(shape(1, 8, 8, 16, 16, 96)); }).find("dim=96 is not supported"),
      std::string::npos);
  EXPECT_NE(error_of([] {
              check_attention_shape(shape(1, 6, 4, 16, 16, 64));
            }).find("heads=6 is not a multiple of kv_heads=4"),
            std::string::npos);
  EXPECT_NE(
      error_of([] { check_attention_shape(shape(0, 8, 8, 16, 16, 64)); }).find("batch=0 must be positive"),
      std::string::npos);
  EXPECT_NE(
      error_of([] { check_attention_shape(shape(1, 8, 8, 16, 0, 64)); }).find("seq_kv=0 must be positive"),
      std::string::npos);
  EXPECT_NE(
      error_of([] { check_attention_shape(shape(1, 8, 0, 16, 16, 64)); }).find("kv_heads=0 must be positive"),
      std::string::npos);
  EXPECT_NE(
      error_of([] { check_attention_shape(shape(1 << 20, 64, 64, 1 << 12, 16, 128)); }).find("2^31 elements"),
      std::string::npos);
  EXPECT_NE(error_of([] {
              check_attention_decode_shape(shape(1, 8, 2, 17, 4096, 128));
            }).find("seq_q=17 query rows; the decode kernel takes 1 to 16"),
            std::string::npos);
  EXPECT_EQ(error_of([] { check_attention_shape(shape(2, 32, 8, 1000, 4097, 256)); }), "");
  EXPECT_EQ(error_of([] { check_attention_decode_shape(shape(8, 32, 8, 16, 32768, 128)); }), "");
}

// The entry points check their arguments before anything touches the GPU: bad shapes in every build, and
// in a CUDA build bad pointers and scales, each a one-line user error naming the argument.
TEST(Attention, EntryPointsRejectBadArguments) {
  float dummy = 0;
  EXPECT_NE(error_of([&] {
              attention_forward(shape(1, 4, 4, 8, 8, 80), &dummy, &dummy, &dummy, &dummy, nullptr, 1.f, false,
                                nullptr);
            }).find("dim=80"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              attention_decode(shape(1, 4, 4, 20, 8, 64), &dummy, &dummy, &dummy, &dummy, nullptr, 1.f, false,
                               nullptr);
            }).find("seq_q=20"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              attention_backward(shape(1, 3, 2, 8, 8, 64), &dummy, &dummy, &dummy, &dummy, &dummy, &dummy,
                                 &dummy, &dummy, &dummy, 1.f, false, nullptr);
            }).find("heads=3"),
            std::string::npos);
#if MP_HAVE_CUDA
  alignas(16) static char buf[64];
  EXPECT_NE(error_of([&] {
              attention_forward(shape(1, 4, 4, 8, 8, 64), nullptr, buf, buf, buf, nullptr, 1.f, false,
                                nullptr);
            }).find("Q must be a 16-byte aligned device pointer"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              attention_forward(shape(1, 4, 4, 8, 8, 64), buf, buf + 2, buf, buf, nullptr, 1.f, false,
                                nullptr);
            }).find("K must be a 16-byte aligned"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              attention_forward(shape(1, 4, 4, 8, 8, 64), buf, buf, buf, buf, nullptr, -1.f, false, nullptr);
            }).find("scale must be a positive finite number"),
            std::string::npos);
  // Dim 256 has no wgmma backward: said before anything runs, naming the fallback.
  const std::string no256 = error_of([&] {
    attention_backward(shape(1, 4, 4, 8, 8, 256), buf, buf, buf, buf, reinterpret_cast<float*>(buf), buf, buf,
                       buf, buf, 1.f, false, nullptr, attention_backward_impl::wgmma);
  });
  EXPECT_NE(no256.find("not supported yet: the wgmma attention backward for dim 256"), std::string::npos)
      << no256;
  EXPECT_NE(no256.find("cuda_core"), std::string::npos) << no256;
#else
  EXPECT_NE(error_of([&] {
              attention_forward(shape(1, 4, 4, 8, 8, 64), &dummy, &dummy, &dummy, &dummy, nullptr, 1.f, false,
                                nullptr);
            }).find("not supported yet"),
            std::string::npos);
#endif
}

TEST(Attention, BackwardImplementationNames) {
  EXPECT_STREQ(attention_backward_impl_name(attention_backward_impl::cuda_core), "cuda-core");
  EXPECT_STREQ(attention_backward_impl_name(attention_backward_impl::wgmma), "wgmma");
  EXPECT_STREQ(attention_backward_impl_name(attention_backward_impl::automatic), "auto");
  EXPECT_EQ(AttentionCheckOptions{}.backward_impl, attention_backward_impl::automatic);
  // automatic: Tensor Cores where the wgmma backward exists, CUDA cores for dim 256; explicit stays.
  EXPECT_EQ(attention_backward_resolve(attention_backward_impl::automatic, 64),
            attention_backward_impl::wgmma);
  EXPECT_EQ(attention_backward_resolve(attention_backward_impl::automatic, 128),
            attention_backward_impl::wgmma);
  EXPECT_EQ(attention_backward_resolve(attention_backward_impl::automatic, 256),
            attention_backward_impl::cuda_core);
  EXPECT_EQ(attention_backward_resolve(attention_backward_impl::cuda_core, 64),
            attention_backward_impl::cuda_core);
  EXPECT_EQ(attention_backward_resolve(attention_backward_impl::wgmma, 256), attention_backward_impl::wgmma);
}

// The forward's grid: the measured rule (kernels/attention.h), the explicit choices, and
// MP_ATTENTION_GRID's values and its error.
TEST(Attention, ForwardGridFollowsTheMeasuredRule) {
  const auto automatic = AttentionGrid::automatic;
  EXPECT_TRUE(attention_forward_persistent(shape(32, 32, 32, 512, 512, 64), false, automatic));
  EXPECT_TRUE(attention_forward_persistent(shape(1, 32, 32, 16384, 16384, 64), false, automatic));
  EXPECT_TRUE(attention_forward_persistent(shape(2, 32, 32, 8192, 8192, 64), true, automatic));
  EXPECT_FALSE(attention_forward_persistent(shape(1, 32, 32, 16384, 16384, 64), true, automatic));
  EXPECT_TRUE(attention_forward_persistent(shape(32, 16, 16, 512, 512, 128), false, automatic));
  EXPECT_TRUE(attention_forward_persistent(shape(32, 16, 16, 512, 512, 128), true, automatic));
  EXPECT_TRUE(attention_forward_persistent(shape(8, 16, 16, 2048, 2048, 128), true, automatic));
  EXPECT_FALSE(attention_forward_persistent(shape(2, 16, 16, 8192, 8192, 128), true, automatic));
  EXPECT_FALSE(attention_forward_persistent(shape(8, 16, 16, 2048, 2048, 128), false, automatic));
  EXPECT_TRUE(attention_forward_persistent(shape(1, 8, 8, 16384, 16384, 256), false, automatic));
  EXPECT_TRUE(attention_forward_persistent(shape(8, 8, 8, 2048, 2048, 256), true, automatic));
  EXPECT_FALSE(attention_forward_persistent(shape(2, 8, 8, 8192, 8192, 256), true, automatic));
  EXPECT_TRUE(attention_forward_persistent(shape(1, 8, 8, 8192, 8192, 128), true, AttentionGrid::persistent));
  EXPECT_FALSE(attention_forward_persistent(shape(1, 8, 8, 512, 512, 64), false, AttentionGrid::per_tile));
  unsetenv("MP_ATTENTION_GRID");
  EXPECT_EQ(attention_grid_from_env(), AttentionGrid::automatic);
  setenv("MP_ATTENTION_GRID", "per-tile", 1);
  EXPECT_EQ(attention_grid_from_env(), AttentionGrid::per_tile);
  setenv("MP_ATTENTION_GRID", "persistent", 1);
  EXPECT_EQ(attention_grid_from_env(), AttentionGrid::persistent);
  setenv("MP_ATTENTION_GRID", "auto", 1);
  EXPECT_EQ(attention_grid_from_env(), AttentionGrid::automatic);
  setenv("MP_ATTENTION_GRID", "always", 1);
  try {
    attention_grid_from_env();
    ADD_FAILURE() << "MP_ATTENTION_GRID=always was accepted";
  } catch (const mp::user_error& e) {
    EXPECT_NE(std::string(e.what()).find("MP_ATTENTION_GRID='always' is not auto, per-tile or persistent"),
              std::string::npos)
        << e.what();
  }
  unsetenv("MP_ATTENTION_GRID");
}

// MP_ATTENTION_BWD_DQ (how the wgmma backward adds dQ's partials): its values and its error.
TEST(Attention, BackwardDqModeFromTheEnvironment) {
  unsetenv("MP_ATTENTION_BWD_DQ");
  EXPECT_EQ(attention_backward_dq_from_env(), AttentionBackwardDq::automatic);
  setenv("MP_ATTENTION_BWD_DQ", "turns", 1);
  EXPECT_EQ(attention_backward_dq_from_env(), AttentionBackwardDq::turns);
  setenv("MP_ATTENTION_BWD_DQ", "atomic", 1);
  EXPECT_EQ(attention_backward_dq_from_env(), AttentionBackwardDq::atomic);
  setenv("MP_ATTENTION_BWD_DQ", "auto", 1);
  EXPECT_EQ(attention_backward_dq_from_env(), AttentionBackwardDq::automatic);
  setenv("MP_ATTENTION_BWD_DQ", "tma", 1);
  try {
    attention_backward_dq_from_env();
    ADD_FAILURE() << "MP_ATTENTION_BWD_DQ=tma was accepted";
  } catch (const mp::user_error& e) {
    EXPECT_NE(std::string(e.what()).find("MP_ATTENTION_BWD_DQ='tma' is not auto, turns or atomic"),
              std::string::npos)
        << e.what();
  }
  unsetenv("MP_ATTENTION_BWD_DQ");
}

TEST(Attention, ReferenceForwardMatchesTheNaiveFormula) {
  struct Case {
    AttentionShape s;
    bool causal;
  };
  const std::vector<Case> cases = {{shape(1, 2, 2, 5, 5, 64), false},   {shape(2, 4, 2, 7, 7, 64), true},
                                   {shape(1, 4, 1, 3, 9, 64), true},    {shape(1, 2, 1, 9, 4, 128), true},
                                   {shape(1, 8, 2, 17, 33, 64), false}, {shape(1, 1, 1, 1, 1, 256), true}};
  uint64_t seed = 1;
  for (const auto& [s, causal] : cases) {
    const auto q = random_values(s.q_elems(), seed++), k = random_values(s.kv_elems(), seed++),
               v = random_values(s.kv_elems(), seed++);
    const double scale = default_attention_scale(s.dim);
    std::vector<double> o(s.q_elems()), lse(s.lse_elems()), no, nlse;
    attention_reference_forward(s, q.data(), k.data(), v.data(), scale, causal, o.data(), lse.data());
    naive_forward(s, q, k, v, scale, causal, no, nlse);
    for (size_t i = 0; i < o.size(); ++i) ASSERT_NEAR(o[i], no[i], 1e-12) << s.str() << " element " << i;
    for (size_t r = 0; r < lse.size(); ++r) {
      if (std::isinf(nlse[r]))
        EXPECT_TRUE(std::isinf(lse[r]) && lse[r] < 0) << s.str() << " row " << r;
      else
        EXPECT_NEAR(lse[r], nlse[r], 1e-12) << s.str() << " row " << r;
    }
  }
}

// seq_q < seq_kv: query row i sees keys up to i + seq_kv - seq_q (the end-aligned diagonal); seq_q > seq_kv:
// the first rows see no key at all, and get O = 0 and LSE = -inf.
TEST(Attention, CausalMaskIsAlignedToTheEnd) {
  const auto s = shape(1, 1, 1, 2, 4, 64);
  // V = one-hot of the key index in the first 4 columns: O's column j is then P(key j).
  std::vector<float> q = random_values(s.q_elems(), 5), k = random_values(s.kv_elems(), 6),
                     v(s.kv_elems(), 0.f);
  for (int j = 0; j < 4; ++j) v[size_t(j) * 64 + j] = 1.f;
  std::vector<double> o(s.q_elems()), lse(s.lse_elems());
  attention_reference_forward(s, q.data(), k.data(), v.data(), 0.125, true, o.data(), lse.data());
  EXPECT_GT(o[2], 0.0);       // row 0 sees key 2 = 0 + 4 - 2
  EXPECT_EQ(o[3], 0.0);       // but not key 3
  EXPECT_GT(o[64 + 3], 0.0);  // row 1 sees every key
  EXPECT_NEAR(o[0] + o[1] + o[2], 1.0, 1e-12);

  const auto t = shape(1, 1, 1, 5, 2, 64);
  const auto q2 = random_values(t.q_elems(), 7), k2 = random_values(t.kv_elems(), 8),
             v2 = random_values(t.kv_elems(), 9);
  std::vector<double> o2(t.q_elems(), 42.0), lse2(t.lse_elems());
  attention_reference_forward(t, q2.data(), k2.data(), v2.data(), 0.125, true, o2.data(), lse2.data());
  for (int i = 0; i < 3; ++i) {  // rows 0..2 see keys j <= i - 3: none
    EXPECT_TRUE(std::isinf(lse2[size_t(i)]) && lse2[size_t(i)] < 0) << "row " << i;
    for (int c = 0; c < 64; ++c) ASSERT_EQ(o2[size_t(i) * 64 + c], 0.0) << "row " << i;
  }
  EXPECT_FALSE(std::isinf(lse2[3]));
}

// Only the asked-for rows are computed; the others keep what they held.
TEST(Attention, ReferenceComputesTheRowsAskedFor) {
  const auto s = shape(2, 2, 1, 6, 6, 64);
  const auto q = random_values(s.q_elems(), 1), k = random_values(s.kv_elems(), 2),
             v = random_values(s.kv_elems(), 3);
  std::vector<double> all(s.q_elems()), some(s.q_elems(), 7.0), la(s.lse_elems()), ls(s.lse_elems(), 7.0);
  attention_reference_forward(s, q.data(), k.data(), v.data(), 0.1, false, all.data(), la.data());
  attention_reference_forward(s, q.data(), k.data(), v.data(), 0.1, false, some.data(), ls.data(), {3, 20});
  for (size_t r = 0; r < s.lse_elems(); ++r) {
    const bool asked = r == 3 || r == 20;
    EXPECT_EQ(ls[r], asked ? la[r] : 7.0) << r;
    EXPECT_EQ(some[r * 64 + 5], asked ? all[r * 64 + 5] : 7.0) << r;
  }
  EXPECT_THROW(
      attention_reference_forward(s, q.data(), k.data(), v.data(), 0.1, false, some.data(), ls.data(), {24}),
      mp::user_error);
}

// The backward reference is the gradient of L = sum(dO * O): central differences of L in Q, K and V agree
// with it on every element of a small GQA causal problem with seq_q != seq_kv.
TEST(Attention, ReferenceBackwardIsTheGradient) {
  for (bool causal : {false, true}) {
    const auto s = shape(1, 4, 2, 3, 5, 64);
    auto q = random_values(s.q_elems(), 11), k = random_values(s.kv_elems(), 12),
         v = random_values(s.kv_elems(), 13);
    const auto d_o = random_values(s.q_elems(), 14);
    const double scale = 0.3;
    std::vector<double> dq(s.q_elems()), dk(s.kv_elems()), dv(s.kv_elems());
    attention_reference_backward(s, q.data(), k.data(), v.data(), d_o.data(), scale, causal, dq.data(),
                                 dk.data(), dv.data());
    auto loss = [&] {
      std::vector<double> o(s.q_elems()), lse(s.lse_elems());
      attention_reference_forward(s, q.data(), k.data(), v.data(), scale, causal, o.data(), lse.data());
      double l = 0;
      for (size_t i = 0; i < o.size(); ++i) l += o[i] * d_o[i];
      return l;
    };
    auto check = [&](std::vector<float>& x, const std::vector<double>& grad, const char* name) {
      for (size_t i = 0; i < x.size(); ++i) {
        const float keep = x[i];
        const float h = 1e-3f;
        x[i] = keep + h;
        const double up = loss();
        x[i] = keep - h;
        const double down = loss();
        x[i] = keep;
        const double numeric = (up - down) / (double(keep + h) - double(keep - h));
        ASSERT_NEAR(grad[i], numeric, 1e-4 + 1e-3 * std::abs(numeric))
            << name << "[" << i << "] causal " << causal;
      }
    };
    check(q, dq, "dQ");
    check(k, dk, "dK");
    check(v, dv, "dV");
  }
}

TEST(Attention, DecodeSplitsFollowLengthAndSMs) {
  const auto one = shape(1, 32, 8, 1, 32768, 128);
  const int s132 = attention_decode_splits(one, 132);
  EXPECT_GT(s132, 1);
  EXPECT_LE(s132, attention_decode_max_splits);
  EXPECT_GE(attention_decode_splits(one, 264), s132);  // more SMs: at least as many slices
  EXPECT_LE(attention_decode_splits(shape(8, 32, 8, 1, 32768, 128), 132), s132);  // more batch: fewer
  EXPECT_EQ(attention_decode_splits(shape(1, 32, 8, 1, 200, 128), 132), 1);       // 4 chunks: one slice
  EXPECT_EQ(attention_decode_splits(shape(1, 32, 8, 1, 1000, 128), 132), 5);      // 16 chunks: >= 3 each
  // One wave of two blocks per SM, filled exactly where the slices allow: batch 1 of the Llama-3.1-8B
  // layout is 8 KV heads x 33 slices = 264 blocks on 132 SMs x 2, at 8k keys as at 32k (uneven slices of
  // whole chunks: 128 chunks as 3 or 4 per slice, 512 as 15 or 16).
  EXPECT_EQ(attention_decode_splits(shape(1, 32, 8, 1, 8192, 128), 132), 33);
  EXPECT_EQ(attention_decode_splits(shape(1, 32, 8, 1, 32768, 128), 132), 33);
  EXPECT_EQ(attention_decode_splits(shape(8, 32, 8, 1, 8192, 128), 132), 4);    // 64 x 4 = 256
  EXPECT_EQ(attention_decode_splits(shape(1, 32, 8, 1, 32768, 256), 132), 16);  // one block per SM at d256
  EXPECT_EQ(attention_decode_splits(shape(64, 32, 8, 1, 8192, 128), 132), 1);   // more blocks than slots
  // 16 rows per block: a group of 4 heads x 16 rows is 4 row groups, so batch 1 gets 264 / 32 = 8 slices.
  EXPECT_EQ(attention_decode_splits(shape(1, 32, 8, 16, 8192, 128), 132), 8);
  EXPECT_THROW(attention_decode_splits(one, 0), mp::user_error);
}

// The plan's slices: whole 64-key chunks dealt as evenly as whole chunks allow, in order, none empty,
// together the cache exactly once; the grid within the waves asked for.
TEST(Attention, DecodePlanSlicesCoverTheCacheOnce) {
  for (int n : {1, 17, 63, 64, 65, 255, 256, 1000, 4097, 8192, 8193, 32768, 100000})
    for (int sms : {1, 8, 132, 264})
      for (int d : attention_dims)
        for (int bps : {0, 1, 3})
          for (int waves : {0, 1, 2, 4}) {
            if (bps != 0 && d != 128) continue;
            AttentionDecodeConfig c;
            c.blocks_per_sm = bps, c.waves = waves;
            for (int b : {1, 8}) {
              const auto s = shape(b, 32, 8, 1, n, d);
              const AttentionDecodePlan p = attention_decode_plan(s, sms, c);
              const std::string where = s.str() + " sms " + std::to_string(sms) + " " + c.str();
              ASSERT_GE(p.splits, 1) << where;
              ASSERT_LE(p.splits, attention_decode_max_splits) << where;
              EXPECT_EQ(p.chunks, (n + 63) / 64) << where;
              EXPECT_EQ(p.blocks, 1ll * b * 8 * p.row_groups * p.splits) << where;
              EXPECT_EQ(p.slots, 1ll * sms * p.ring.blocks_per_sm) << where;
              if (p.splits > 1) {
                EXPECT_LE(p.blocks, 1ll * std::max(1, waves) * p.slots) << where;
              }
              EXPECT_EQ(p.first_key(0), 0) << where;
              EXPECT_GE(p.first_key(p.splits), n) << where;  // all covered
              EXPECT_LT(p.first_key(p.splits), n + 64) << where;
              int shortest = 1 << 30, longest = 0;
              for (int i = 0; i < p.splits; ++i) {
                const int len = std::min(n, p.first_key(i + 1)) - p.first_key(i);
                EXPECT_GT(len, 0) << where << " slice " << i;  // none empty
                EXPECT_EQ(p.first_key(i) % 64, 0) << where << " slice " << i;
                if (i + 1 < p.splits) shortest = std::min(shortest, len), longest = std::max(longest, len);
              }
              if (p.splits > 2) {
                EXPECT_LE(longest - shortest, 64) << where;  // within one chunk of each other
              }
            }
          }
  // 8192 keys in 33 slices: 128 chunks as 29 slices of 4 and 4 of 3 (in the order the formula deals them).
  const AttentionDecodePlan p = attention_decode_plan(shape(1, 32, 8, 1, 8192, 128), 132);
  ASSERT_EQ(p.splits, 33);
  int threes = 0;
  for (int i = 0; i < p.splits; ++i) threes += p.first_key(i + 1) - p.first_key(i) == 192;
  EXPECT_EQ(threes, 4);
}

// The benchmark's knobs: each moves the plan as it says, and bad values are one-line errors.
TEST(Attention, DecodeConfigSteersThePlan) {
  const auto b1 = shape(1, 32, 8, 1, 32768, 128), b1_8k = shape(1, 32, 8, 1, 8192, 128);
  AttentionDecodeConfig c;
  c.blocks_per_sm = 3;  // a 2-stage ring, 396 slots: 8 x 49 = 392 blocks at 32k; 42 (>= 3 chunks) at 8k
  EXPECT_EQ(attention_decode_plan(b1, 132, c).ring.stages, 2);
  EXPECT_EQ(attention_decode_plan(b1, 132, c).splits, 49);
  EXPECT_EQ(attention_decode_plan(b1_8k, 132, c).splits, 42);
  c.blocks_per_sm = 1;  // a 6-stage ring, 132 slots: 8 x 16 = 128 blocks
  EXPECT_EQ(attention_decode_plan(b1, 132, c).ring.stages, 6);
  EXPECT_EQ(attention_decode_plan(b1, 132, c).splits, 16);
  c = {};
  c.waves = 2;  // 528 slots: 66 wanted, capped at 64
  EXPECT_EQ(attention_decode_plan(b1, 132, c).splits, 64);
  EXPECT_EQ(attention_decode_plan(shape(8, 32, 8, 1, 32768, 128), 132, c).splits, 8);
  c = {};
  c.splits = 48;
  EXPECT_EQ(attention_decode_plan(b1_8k, 132, c).splits, 48);
  EXPECT_EQ(attention_decode_plan(shape(1, 32, 8, 1, 100, 128), 132, c).splits, 2);  // no more than chunks
  EXPECT_EQ(attention_decode_plan(b1, 132, {}).ring.stages, attention_decode_ring(128).stages);

  const auto parsed = parse_attention_decode_config("bps=3,waves=2,splits=48");
  EXPECT_EQ(parsed.blocks_per_sm, 3);
  EXPECT_EQ(parsed.waves, 2);
  EXPECT_EQ(parsed.splits, 48);
  EXPECT_FALSE(parsed.pdl);
  EXPECT_EQ(parsed.str(), "bps=3,waves=2,splits=48,pdl=off");
  EXPECT_EQ(parse_attention_decode_config("waves=auto").str(), "bps=auto,waves=auto,splits=auto,pdl=off");
  EXPECT_EQ(parse_attention_decode_config("default").str(), "bps=auto,waves=auto,splits=auto,pdl=off");
  EXPECT_TRUE(parse_attention_decode_config("pdl=on,bps=3").pdl);
  EXPECT_EQ(parse_attention_decode_config("pdl=on,bps=3").blocks_per_sm, 3);
  EXPECT_FALSE(parse_attention_decode_config("pdl=off").pdl);
  EXPECT_NE(error_of([] { parse_attention_decode_config("pdl=1"); }).find("pdl='1' is not on or off"),
            std::string::npos);
  EXPECT_EQ(parse_attention_decode_config("").splits, 0);
  EXPECT_NE(error_of([] { parse_attention_decode_config("stages=3"); }).find("unknown key 'stages'"),
            std::string::npos);
  EXPECT_NE(
      error_of([] { parse_attention_decode_config("bps=x"); }).find("bps='x' is not a positive integer"),
      std::string::npos);
  EXPECT_NE(error_of([] { parse_attention_decode_config("bps=0"); }).find("bps='0'"), std::string::npos);
  EXPECT_NE(error_of([] { parse_attention_decode_config("bps=3,"); }).find("is not key=value"),
            std::string::npos);
  EXPECT_NE(error_of([] { parse_attention_decode_config("bps"); }).find("'bps' is not key=value"),
            std::string::npos);
  auto plan_error = [](int d, const char* text) {
    return error_of(
        [&] { attention_decode_plan(shape(1, 8, 2, 1, 4096, d), 132, parse_attention_decode_config(text)); });
  };
  EXPECT_NE(plan_error(128, "bps=4").find("4 blocks per SM at dim 128 is not built (built: 1, 2, 3)"),
            std::string::npos);
  EXPECT_NE(plan_error(64, "bps=1").find("1 blocks per SM at dim 64 is not built (built: 2)"),
            std::string::npos);
  EXPECT_NE(plan_error(256, "bps=3").find("3 blocks per SM at dim 256 is not built (built: 1)"),
            std::string::npos);
  EXPECT_NE(plan_error(64, "waves=5").find("waves=5 must be 1 to 4"), std::string::npos);
  EXPECT_NE(plan_error(64, "splits=65").find("splits=65 must be 1 to 64"), std::string::npos);
}

// The decode's shared-memory ring: at least one chunk in flight while one is computed (two at the
// default residencies), the blocks of one SM within sm_90's 228 KB and each within its 227 KB, and the
// merge's scratch (four warps x 16 rows x dim fp32) and the combine's weights (16 rows x 64 slices) inside
// the ring they reuse.
TEST(Attention, DecodeRingFitsSharedMemory) {
  for (int d : attention_dims)
    for (int bps = 1; bps <= 4; ++bps) {
      const AttentionDecodeRing r = attention_decode_ring(d, bps);
      if (!attention_decode_residency_built(d, bps)) continue;
      const std::string where = "d" + std::to_string(d) + " bps " + std::to_string(bps);
      EXPECT_EQ(r.chunk_keys, 64);
      EXPECT_EQ(r.blocks_per_sm, bps);
      EXPECT_GE(r.stages, bps == attention_decode_default_residency(d) ? 3 : 2) << where;
      EXPECT_LE(r.stages, 8) << where;
      EXPECT_EQ(r.stage_bytes, 2 * 64 * (d + 8) * 2) << where;
      EXPECT_LE(r.smem_bytes, 227 * 1024) << where;
      EXPECT_LE(r.blocks_per_sm * (r.smem_bytes + 1024), 228 * 1024) << where;
      EXPECT_GE(r.stages * r.stage_bytes, 4 * attention_decode_block_rows * d * 4) << where;
      EXPECT_GE(r.stages * r.stage_bytes, attention_decode_block_rows * attention_decode_max_splits * 4)
          << where;
      // One more stage would not fit: the ring takes what the blocks of an SM leave.
      if (r.stages < 8) {
        EXPECT_GT(r.blocks_per_sm * (r.smem_bytes + r.stage_bytes + 1024), 228 * 1024) << where;
      }
      // Bytes in flight per SM while a chunk is computed: at least 64 KB (Little's law at about 4 TB/s and
      // about 1 us of DRAM latency wants about 32 KB per SM of 132).
      EXPECT_GE(r.blocks_per_sm * (r.stages - 1) * r.stage_bytes, 64 * 1024) << where;
    }
  EXPECT_EQ(attention_decode_ring(64).stages, 6);
  EXPECT_EQ(attention_decode_ring(128).stages, 3);
  EXPECT_EQ(attention_decode_ring(256).stages, 3);
  EXPECT_EQ(attention_decode_ring(128).blocks_per_sm, 2);
  EXPECT_EQ(attention_decode_ring(256).blocks_per_sm, 1);
  EXPECT_EQ(attention_decode_ring(128, 3).stages, 2);
  EXPECT_EQ(attention_decode_ring(128, 1).stages, 6);
  // Residencies that leave no room for two stages are not a ring.
  EXPECT_EQ(attention_decode_ring(128, 4).stages, 0);
  EXPECT_EQ(attention_decode_ring(256, 2).stages, 0);
  EXPECT_EQ(attention_decode_ring(256, 2).smem_bytes, 0);
  EXPECT_FALSE(attention_decode_residency_built(128, 4));
  EXPECT_FALSE(attention_decode_residency_built(64, 3));
}

TEST(Attention, FlopsAsTheIssueCountsThem) {
  const auto s = shape(2, 16, 4, 1024, 2048, 128);
  const double f = 4.0 * 2 * 16 * 1024 * 2048 * 128;
  EXPECT_DOUBLE_EQ(attention_flops(s, attention_pass::forward, false), f);
  EXPECT_DOUBLE_EQ(attention_flops(s, attention_pass::forward, true), f / 2);
  EXPECT_DOUBLE_EQ(attention_flops(s, attention_pass::backward, false), 2.5 * f);
}

// ---- the CLI ----
namespace {
mp::test::CliResult cli(const std::string& args) { return mp::test::run_cli(args); }
}  // namespace

TEST(AttentionCli, HelpListsTheOptions) {
  auto r = cli("attention --help");
  EXPECT_EQ(r.status, 0);
  EXPECT_EQ(r.out.rfind("usage: metapipe attention", 0), 0u) << r.out;
  for (const char* o : {"--seq", "--batch", "--heads", "--dim", "--causal", "--backward", "--backward-impl",
                        "--decode", "--check-only"})
    EXPECT_NE(r.out.find("\n  " + std::string(o) + " "), std::string::npos) << o << " not explained:\n"
                                                                            << r.out;
}

TEST(AttentionCli, BadUsageIsOneLine) {
  for (auto [args, says] : {std::pair<const char*, const char*>{"attention", "--seq N[:Nkv] is needed"},
                            {"attention --seq 0", "--seq takes a positive number"},
                            {"attention --seq 12:x", "--seq takes a positive number"},
                            {"attention --seq 128 --heads 8:", "--heads takes a positive number"},
                            {"attention --seq 128 --backward --decode", "exclude each other"},
                            {"attention --seq 128 --samples 0", "--samples is 1 to 1000"},
                            {"attention --seq 128 --backward-impl wgmma", "--backward-impl needs --backward"},
                            {"attention --seq 128 --backward --backward-impl tensor",
                             "--backward-impl is auto, cuda-core or wgmma, got 'tensor'"},
                            {"attention --seq 128 --window 4", "--window"}}) {
    auto r = cli(args);
    EXPECT_EQ(r.status, 2) << args << ": " << r.out;
    EXPECT_NE(r.out.find(says), std::string::npos) << args << ": " << r.out;
    EXPECT_TRUE(one_line(r.out)) << args << ": " << r.out;
  }
}

TEST(AttentionCli, BadShapeIsAUserError) {
  for (auto [args, says] :
       {std::pair<const char*, const char*>{"attention --seq 128 --dim 96", "dim=96 is not supported"},
        {"attention --seq 128 --heads 6:4", "heads=6 is not a multiple of kv_heads=4"},
        {"attention --seq 17:4096 --decode", "seq_q=17 query rows"},
        {"attention --seq 128 --dim 256 --backward --backward-impl wgmma",
         "not supported yet: --backward-impl wgmma for --dim 256"}}) {
    auto r = cli(args);
    EXPECT_EQ(r.status, 1) << args << ": " << r.out;
    EXPECT_NE(r.out.find(says), std::string::npos) << args << ": " << r.out;
    EXPECT_TRUE(one_line(r.out)) << args << ": " << r.out;
  }
}

TEST(AttentionCli, WithoutAGpuItSaysSo) {
  auto g = mp::query_gpu();
  if (g && mp::gpu_is_hopper(*g)) GTEST_SKIP() << "a Hopper GPU is present: the SM90 suites run the command";
  auto r = cli("attention --batch 2 --heads 8:2 --seq 1000 --dim 128 --causal");
  EXPECT_EQ(r.status, 1) << r.out;
  EXPECT_NE(r.out.find("needs a Hopper GPU"), std::string::npos) << r.out;
  EXPECT_TRUE(one_line(r.out)) << r.out;
}
