// Attention host code that needs no CUDA: the shape checks, the CPU fp64 references (forward, backward),
// the decode's split count, the FLOP count and the check result's summary.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>

#include "core/checked.h"
#include "core/error.h"
#include "kernels/attention.h"

namespace mp::kernels {

std::string AttentionShape::str() const {
  char buf[160];
  std::snprintf(buf, sizeof buf, "B=%d H=%d:%d N=%d:%d D=%d", batch, heads, kv_heads, seq_q, seq_kv, dim);
  return buf;
}

void check_attention_shape(const AttentionShape& s) {
  auto positive = [](const char* name, long long v) {
    MP_USER_CHECK(v > 0, "attention: ", name, "=", v, " must be positive");
  };
  positive("batch", s.batch);
  positive("heads", s.heads);
  positive("kv_heads", s.kv_heads);
  positive("seq_q", s.seq_q);
  positive("seq_kv", s.seq_kv);
  positive("dim", s.dim);
  MP_USER_CHECK(s.dim == 64 || s.dim == 128 || s.dim == 256, "attention: dim=", s.dim,
                " is not supported (the kernels are compiled for head dims 64, 128 and 256)");
  MP_USER_CHECK(s.heads % s.kv_heads == 0, "attention: heads=", s.heads,
                " is not a multiple of kv_heads=", s.kv_heads,
                " (each KV head serves heads / kv_heads query heads)");
  // Element counts (and TMA's 32-bit coordinates) must fit: batch * heads * seq * dim below 2^31 elements per
  // tensor keeps every index of the kernels in int range after the row offset.
  auto elems = [](long long b, long long h, long long n, long long d) {
    return mul_sat(mul_sat(mul_sat(b, h), n), d);
  };
  const long long limit = 1ll << 31;
  MP_USER_CHECK(elems(s.batch, s.heads, s.seq_q, s.dim) < limit, "attention: Q (", s.str(),
                ") has 2^31 elements or more; split the batch");
  MP_USER_CHECK(elems(s.batch, s.kv_heads, s.seq_kv, s.dim) < limit, "attention: K and V (", s.str(),
                ") have 2^31 elements or more; split the batch");
}

void check_attention_decode_shape(const AttentionShape& s) {
  check_attention_shape(s);
  MP_USER_CHECK(s.seq_q <= attention_decode_max_rows, "attention decode: seq_q=", s.seq_q,
                " query rows; the decode kernel takes 1 to ", attention_decode_max_rows,
                " (use the forward kernel for more)");
}

attention_backward_impl attention_backward_resolve(attention_backward_impl impl, int dim) {
  if (impl != attention_backward_impl::automatic) return impl;
  return dim == 256 ? attention_backward_impl::cuda_core : attention_backward_impl::wgmma;
}

const char* attention_backward_impl_name(attention_backward_impl impl) {
  if (impl == attention_backward_impl::automatic) return "auto";
  return impl == attention_backward_impl::wgmma ? "wgmma" : "cuda-core";
}

double default_attention_scale(int dim) { return 1.0 / std::sqrt(double(dim)); }

// Decode blocks per KV slice of one KV head: the group's query heads times the query rows, in blocks of
// attention_decode_block_rows.
static int decode_row_groups(const AttentionShape& s) {
  const int rows = s.group() * s.seq_q;
  return (rows + attention_decode_block_rows - 1) / attention_decode_block_rows;
}

int attention_decode_slice(const AttentionShape& s, int splits) {
  check_attention_decode_shape(s);
  MP_USER_CHECK(splits > 0, "attention decode: the split count must be positive, got ", splits);
  const int chunk = attention_decode_ring(s.dim).chunk_keys;
  const int per = (s.seq_kv + splits - 1) / splits;
  return (per + chunk - 1) / chunk * chunk;
}

int attention_decode_splits(const AttentionShape& s, int sms) {
  check_attention_decode_shape(s);
  MP_USER_CHECK(sms > 0, "attention decode: the SM count must be positive, got ", sms);
  // The slice count is the most that still fits one wave of resident blocks (rounded down): a grid of
  // 1.2 waves runs its last 0.2 wave on a fifth of the GPU and costs as much as a second full one. Within
  // the wave every slice streams one contiguous range of the cache through its block's ring. Each slice
  // keeps at least 256 keys so that writing and combining the partials stays small next to the cache
  // reads, and there are at most 64 slices (the combine's scratch). Slices are whole 64-key chunks, so
  // the count is then the number of non-empty ones (33 wanted of 8192 keys: 256-key slices, 32 of them).
  const long long blocks = 1ll * s.batch * s.kv_heads * decode_row_groups(s);
  const long long slots = 1ll * sms * attention_decode_ring(s.dim).blocks_per_sm;
  const long long most = std::max(1, (s.seq_kv + 255) / 256);
  const int want = int(std::clamp(slots / blocks, 1ll, std::min(most, 64ll)));
  const int slice = attention_decode_slice(s, want);
  return (s.seq_kv + slice - 1) / slice;
}

double attention_flops(const AttentionShape& s, attention_pass pass, bool causal) {
  double f = 4.0 * s.batch * s.heads * double(s.seq_q) * s.seq_kv * s.dim;
  if (causal) f /= 2;
  if (pass == attention_pass::backward) f *= 2.5;
  return f;
}

namespace {
// Row (b, h, i)'s visible keys: [0, last) where last = seq_kv, or with the causal mask i + seq_kv - seq_q + 1
// (clamped to [0, seq_kv]).
int visible_keys(const AttentionShape& s, int i, bool causal) {
  if (!causal) return s.seq_kv;
  const long long last = 1ll * i + s.seq_kv - s.seq_q + 1;
  return int(std::clamp<long long>(last, 0, s.seq_kv));
}
// The scaled scores of row (b, h, i) and their softmax; returns the number of visible keys, p holds the
// probabilities, lse the log-sum-exp.
int row_softmax(const AttentionShape& s, const float* q, const float* k, double scale, bool causal, int b,
                int h, int i, std::vector<double>& p, double& lse) {
  const int d = s.dim, hk = h / s.group();
  const float* qi = q + ((std::size_t(b) * s.heads + h) * s.seq_q + i) * d;
  const float* kb = k + (std::size_t(b) * s.kv_heads + hk) * s.seq_kv * std::size_t(d);
  const int n = visible_keys(s, i, causal);
  p.assign(std::size_t(n), 0.0);
  double m = -std::numeric_limits<double>::infinity();
  for (int j = 0; j < n; ++j) {
    double acc = 0;
    for (int c = 0; c < d; ++c) acc += double(qi[c]) * double(kb[std::size_t(j) * d + c]);
    p[std::size_t(j)] = acc * scale;
    m = std::max(m, p[std::size_t(j)]);
  }
  double l = 0;
  for (int j = 0; j < n; ++j) l += (p[std::size_t(j)] = std::exp(p[std::size_t(j)] - m));
  for (int j = 0; j < n; ++j) p[std::size_t(j)] /= l;
  lse = n > 0 ? m + std::log(l) : -std::numeric_limits<double>::infinity();
  return n;
}
}  // namespace

void attention_reference_forward(const AttentionShape& s, const float* q, const float* k, const float* v,
                                 double scale, bool causal, double* o, double* lse,
                                 const std::vector<std::size_t>& rows) {
  check_attention_shape(s);
  std::vector<std::size_t> all;
  const std::vector<std::size_t>* which = &rows;
  if (rows.empty()) {
    all.resize(s.lse_elems());
    for (std::size_t r = 0; r < all.size(); ++r) all[r] = r;
    which = &all;
  }
  const int d = s.dim;
  std::vector<double> p;
  for (std::size_t r : *which) {
    MP_USER_CHECK(r < s.lse_elems(), "attention reference: row ", r, " is outside the ", s.lse_elems(),
                  " query rows");
    const int i = int(r % std::size_t(s.seq_q));
    const int h = int(r / std::size_t(s.seq_q) % std::size_t(s.heads));
    const int b = int(r / (std::size_t(s.seq_q) * s.heads));
    double l = 0;
    const int n = row_softmax(s, q, k, scale, causal, b, h, i, p, l);
    const float* vb = v + (std::size_t(b) * s.kv_heads + h / s.group()) * s.seq_kv * std::size_t(d);
    double* oi = o + r * d;
    for (int c = 0; c < d; ++c) oi[c] = 0;
    for (int j = 0; j < n; ++j)
      for (int c = 0; c < d; ++c) oi[c] += p[std::size_t(j)] * double(vb[std::size_t(j) * d + c]);
    if (lse) lse[r] = l;
  }
}

void attention_reference_backward(const AttentionShape& s, const float* q, const float* k, const float* v,
                                  const float* d_o, double scale, bool causal, double* dq, double* dk,
                                  double* dv) {
  check_attention_shape(s);
  const int d = s.dim;
  std::fill(dq, dq + s.q_elems(), 0.0);
  std::fill(dk, dk + s.kv_elems(), 0.0);
  std::fill(dv, dv + s.kv_elems(), 0.0);
  std::vector<double> p, dp;
  for (int b = 0; b < s.batch; ++b)
    for (int h = 0; h < s.heads; ++h)
      for (int i = 0; i < s.seq_q; ++i) {
        double lse = 0;
        const int n = row_softmax(s, q, k, scale, causal, b, h, i, p, lse);
        const std::size_t row = (std::size_t(b) * s.heads + h) * s.seq_q + i;
        const std::size_t kvb = (std::size_t(b) * s.kv_heads + h / s.group()) * s.seq_kv;
        const float* doi = d_o + row * d;
        const float* qi = q + row * d;
        dp.assign(std::size_t(n), 0.0);
        double delta = 0;  // rowsum(dO * O) = sum_j P_ij dP_ij
        for (int j = 0; j < n; ++j) {
          const float* vj = v + (kvb + j) * d;
          double acc = 0;
          for (int c = 0; c < d; ++c) acc += double(doi[c]) * double(vj[c]);
          dp[std::size_t(j)] = acc;
          delta += p[std::size_t(j)] * acc;
        }
        for (int j = 0; j < n; ++j) {
          const double pj = p[std::size_t(j)], ds = pj * (dp[std::size_t(j)] - delta);
          const float* kj = k + (kvb + j) * d;
          double* dkj = dk + (kvb + j) * d;
          double* dvj = dv + (kvb + j) * d;
          for (int c = 0; c < d; ++c) {
            dq[row * d + c] += scale * ds * double(kj[c]);
            dkj[c] += scale * ds * double(qi[c]);
            dvj[c] += pj * double(doi[c]);
          }
        }
      }
}

std::string AttentionCheckResult::summary() const {
  char buf[320];
  if (ok)
    std::snprintf(buf, sizeof buf, "ok (O err %.1e, LSE err %.1e, dQ/dK/dV err %.1e/%.1e/%.1e, %zu rows)",
                  max_err_o, max_err_lse, max_err_dq, max_err_dk, max_err_dv, checked_rows);
  else
    std::snprintf(
        buf, sizeof buf,
        "FAIL: O err %.1e, LSE err %.1e, dQ/dK/dV err %.1e/%.1e/%.1e (tolerance %.1e), %zu unwritten, "
        "%zu rows",
        max_err_o, max_err_lse, max_err_dq, max_err_dk, max_err_dv, tolerance, unwritten, checked_rows);
  return buf;
}

}  // namespace mp::kernels
