// Attention host code that needs no CUDA: the shape checks, the CPU fp64 references (forward, backward),
// the decode's launch plan, the FLOP count and the check result's summary.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <stdexcept>
#include <string>

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

AttentionBackwardDq attention_backward_dq_from_env() {
  const char* e = std::getenv("MP_ATTENTION_BWD_DQ");
  if (!e || !*e) return AttentionBackwardDq::automatic;
  const std::string v = e;
  if (v == "auto") return AttentionBackwardDq::automatic;
  if (v == "turns") return AttentionBackwardDq::turns;
  if (v == "atomic") return AttentionBackwardDq::atomic;
  fail_user("MP_ATTENTION_BWD_DQ='", v, "' is not auto, turns or atomic (how the wgmma attention backward adds ",
            "dQ's partials)");
}

AttentionGrid attention_grid_from_env() {
  const char* e = std::getenv("MP_ATTENTION_GRID");
  if (!e || !*e) return AttentionGrid::automatic;
  const std::string v = e;
  if (v == "auto") return AttentionGrid::automatic;
  if (v == "per-tile") return AttentionGrid::per_tile;
  if (v == "persistent") return AttentionGrid::persistent;
  fail_user("MP_ATTENTION_GRID='", v, "' is not auto, per-tile or persistent (how the attention forward's blocks "
            "take the query tiles)");
}

bool attention_forward_persistent(const AttentionShape& s, bool causal, AttentionGrid grid) {
  if (grid != AttentionGrid::automatic) return grid == AttentionGrid::persistent;
  // The H200's measurements (docs/attention.md, "Persistent grid"), FlashAttention-3's protocol shapes.
  if (s.dim == 64) return !causal || s.seq_kv <= 8192;
  if (s.dim == 128) return s.seq_kv <= 1024 || (causal && s.seq_kv <= 2048);
  return !causal || s.seq_kv <= 2048;
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

std::string AttentionDecodeConfig::str() const {
  auto field = [](int v) { return v > 0 ? std::to_string(v) : std::string("auto"); };
  return "bps=" + field(blocks_per_sm) + ",waves=" + field(waves) + ",splits=" + field(splits) +
         ",pdl=" + (pdl ? "on" : "off");
}

AttentionDecodeConfig parse_attention_decode_config(const std::string& text) {
  AttentionDecodeConfig c;
  if (text.empty() || text == "default") return c;
  size_t at = 0;
  while (at <= text.size()) {
    const size_t comma = std::min(text.find(',', at), text.size());
    const std::string item = text.substr(at, comma - at);
    const size_t eq = item.find('=');
    MP_USER_CHECK(eq != std::string::npos && eq > 0 && eq + 1 < item.size(), "attention decode config: '",
                  item, "' is not key=value (keys: bps, waves, splits, pdl; e.g. bps=3,waves=1)");
    const std::string key = item.substr(0, eq), value = item.substr(eq + 1);
    if (key == "pdl") {
      MP_USER_CHECK(value == "on" || value == "off", "attention decode config: pdl='", value,
                    "' is not on or off");
      c.pdl = value == "on";
      at = comma + 1;
      continue;
    }
    int v = 0;
    if (value != "auto") {
      size_t used = 0;
      long long parsed = 0;
      try {
        parsed = std::stoll(value, &used);
      } catch (const std::exception&) {
        used = 0;
      }
      MP_USER_CHECK(used == value.size() && parsed > 0 && parsed <= 1024, "attention decode config: ", key,
                    "='", value, "' is not a positive integer or 'auto'");
      v = int(parsed);
    }
    if (key == "bps")
      c.blocks_per_sm = v;
    else if (key == "waves")
      c.waves = v;
    else if (key == "splits")
      c.splits = v;
    else
      fail_user("attention decode config: unknown key '", key, "' (keys: bps, waves, splits, pdl)");
    at = comma + 1;
  }
  return c;
}

int AttentionDecodePlan::first_key(int split) const {
  const int chunk = ring.chunk_keys;
  return int(1ll * split * chunks / splits) * chunk;
}

AttentionDecodePlan attention_decode_plan(const AttentionShape& s, int sms, const AttentionDecodeConfig& c) {
  check_attention_decode_shape(s);
  MP_USER_CHECK(sms > 0, "attention decode: the SM count must be positive, got ", sms);
  const int bps = c.blocks_per_sm > 0 ? c.blocks_per_sm : attention_decode_default_residency(s.dim);
  if (!attention_decode_residency_built(s.dim, bps)) {
    std::string built;
    for (int b = 1; b <= 4; ++b)
      if (attention_decode_residency_built(s.dim, b))
        built += (built.empty() ? "" : ", ") + std::to_string(b);
    fail_user("attention decode: ", bps, " blocks per SM at dim ", s.dim, " is not built (built: ", built,
              ")");
  }
  MP_USER_CHECK(c.waves >= 0 && c.waves <= 4, "attention decode: waves=", c.waves, " must be 1 to 4");
  MP_USER_CHECK(c.splits >= 0 && c.splits <= attention_decode_max_splits,
                "attention decode: splits=", c.splits, " must be 1 to ", attention_decode_max_splits);
  AttentionDecodePlan p;
  p.ring = attention_decode_ring(s.dim, bps);
  MP_INTERNAL_CHECK(p.ring.stages >= 2, "attention decode: a built residency without a ring");
  p.chunks = (s.seq_kv + p.ring.chunk_keys - 1) / p.ring.chunk_keys;
  p.row_groups = (s.group() * s.seq_q + attention_decode_block_rows - 1) / attention_decode_block_rows;
  const long long base = 1ll * s.batch * s.kv_heads * p.row_groups;  // blocks per slice index
  p.slots = 1ll * sms * p.ring.blocks_per_sm;
  int want = c.splits;
  if (want == 0) {
    // The most slices whose grid fits `waves` waves of resident blocks (rounded down): a grid of 1.2
    // waves runs its last 0.2 wave on a fifth of the GPU and costs as much as a second full one, while a
    // grid just under a wave (264 blocks on 132 SMs x 2 for batch 1 of the Llama-3.1-8B layout) keeps
    // every SM's slots busy to the end. Slices average at least 3 chunks (192 keys): the block's fixed
    // costs (Q, the ring's first copies, the merge of its warps, its partial written and read back) stay
    // small next to its share of the cache.
    const long long waves = c.waves > 0 ? c.waves : 1;
    const long long most = std::max(1, p.chunks / 3);
    want =
        int(std::clamp(waves * p.slots / base, 1ll, std::min<long long>(most, attention_decode_max_splits)));
  }
  p.splits = std::min(want, p.chunks);  // whole chunks dealt evenly: none empty
  p.blocks = base * p.splits;
  return p;
}

int attention_decode_splits(const AttentionShape& s, int sms) { return attention_decode_plan(s, sms).splits; }

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
