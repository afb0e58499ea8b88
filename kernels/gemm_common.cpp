// Host parts of the GEMM that need no GPU: shape checks, the schedule a shape gets (tile shape, split-K,
// stream-K), bf16 rounding and the CPU fp64 reference.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <initializer_list>

#include "core/error.h"
#include "kernels/gemm.h"

namespace mp::kernels {

void check_gemm_shape(long long m, long long n, long long k) {
  auto one = [](const char* name, long long v) {
    MP_USER_CHECK(v > 0, "gemm: ", name, "=", v, " must be positive");
    MP_USER_CHECK(v % 16 == 0, "gemm: ", name, "=", v,
                  " is not a multiple of 16 (the tile GEMM needs M, N and K to be multiples of 16; pad ",
                  name, " to ", (v + 15) / 16 * 16, ")");
    MP_USER_CHECK(v <= (1ll << 30), "gemm: ", name, "=", v, " is too large (at most 2^30)");
  };
  one("M", m);
  one("N", n);
  one("K", k);
}

// Stream-K for the tail: with T tiles on P blocks and T % P != 0, the last wave would leave SMs idle. Its
// T % P tiles are cut into equal K ranges instead, one per block (automatic: only where that wave is a
// quarter to two thirds full; see stream_k_mode); the others stay whole (data-parallel). Returns how many
// tiles are shared.
int stream_k_tiles(int tiles, int grid, int k_iters, stream_k_mode mode) {
  if (mode == stream_k_mode::off || grid <= 0 || tiles <= grid || tiles % grid == 0) return 0;
  const int last = tiles % grid;              // the last wave's tiles
  if (1ll * last * k_iters < grid) return 0;  // ranges under one K step
  if (mode == stream_k_mode::automatic && (3 * last > 2 * grid || 4 * last < grid)) return 0;
  return last;
}
GemmPlan plan_gemm(int m, int n, int k, const GemmSchedule& s, int sms, out_type out, long long l2_bytes) {
  check_gemm_shape(m, n, k);
  MP_USER_CHECK(sms > 0, "gemm: the GPU's SM count must be positive, got ", sms, " (is a GPU present?)");
  MP_USER_CHECK(s.block_m == 0 || s.block_m == 64 || s.block_m == 128,
                "gemm: block_m must be 64 or 128, got ", s.block_m);
  MP_USER_CHECK(s.block_n == 0 || s.block_n == 128 || s.block_n == 256,
                "gemm: block_n must be 128 or 256, got ", s.block_n);
  MP_USER_CHECK(s.split_k >= 0, "gemm: split_k must be 0 (chosen from the shape) or more, got ", s.split_k);
  MP_USER_CHECK(s.group_m >= 1, "gemm: group_m must be at least 1, got ", s.group_m);
  int bn = s.block_n;
  int bm = s.block_m;
  if (bm == 0) {
    // 64-row tiles (one consumer warpgroup) when 128 x 128 tiles would leave half the GPU idle without
    // split-K, and no other option asks for 128-row tiles: twice the tiles, so half the K splits
    // (bench/RESULTS.md, GEMM).
    const int t128 = (m + 127) / 128 * ((n + 127) / 128);
    const bool wide = bn == 256 || s.stream_k == stream_k_mode::on;
    bm = !wide && t128 * 2 <= sms ? 64 : 128;
  }
  if (bm == 64) {
    // 64 x 128 only: 64 x 64 tiles measured slower even where they fill the GPU without split-K (0.66x
    // against 0.89x cuBLAS at 128 x 4096 x 4096): a lone consumer's 64 x 64 x 64 K step costs about as
    // much time as a 64 x 128 one (bench/RESULTS.md, GEMM).
    if (bn == 0) bn = 128;
    MP_USER_CHECK(bn == 128, "gemm: 64-row tiles are 128 wide (block_n 0 or 128), got ", bn);
    MP_USER_CHECK(s.stream_k != stream_k_mode::on,
                  "gemm: stream-K runs on 128-row tiles (block_m 0 or 128; or stream_k auto or off)");
  }
  const int tm = (m + bm - 1) / bm;
  if (bn == 0) {
    // 128 x 256 tiles do the most math per byte of shared memory; take 128 x 128 only when it fills the
    // GPU's last wave clearly better (wave efficiency: tiles / (waves * SMs)).
    auto eff = [&](int b) {
      const int t = tm * ((n + b - 1) / b);
      return double(t) / (double((t + sms - 1) / sms) * sms);
    };
    bn = eff(256) >= 0.85 * eff(128) ? 256 : 128;
    // With more 128 x 256 tiles than SMs, stream-K (below) fills the last wave, so the wave efficiency
    // no longer argues for the narrower tiles, which move 1.33x the bytes per flop.
    const bool sk_possible = s.stream_k == stream_k_mode::on && s.split_k <= 1 && s.persistent;
    if (sk_possible && tm * ((n + 255) / 256) > sms) bn = 256;
  }
  const int tiles = tm * ((n + bn - 1) / bn);
  const int k_iters = (k + 63) / 64;
  int splits = s.split_k;
  if (splits == 0) {
    splits = 1;
    if (tiles * 2 <= sms && k_iters >= 16) splits = std::min(std::min(sms / tiles, k_iters / 8), 8);
  }
  splits = std::max(1, std::min(splits, k_iters));
  MP_USER_CHECK(s.split_lead >= -1, "gemm: split_lead must be -1 (chosen from the plan) or >= 0, got ",
                s.split_lead);
  int lead = 0;
  if (splits > 1) {
    const int even = (k_iters + splits - 1) / splits;
    // Chosen: the shorter splits end about 6 K steps before the last (3 each way for 2 splits, 2 for 4),
    // at most a quarter of an even share. Measured at 64 x 128 tiles split 2 and 4 ways (bench/RESULTS.md,
    // GEMM): 128 x 4096 x 4096 0.90x -> 0.92x cuBLAS with a lead of 3 or 4 (6 and 8 were slower again),
    // 64 x 4096 x 4096 (4 ways) best at 2.
    lead = s.split_lead >= 0 ? s.split_lead : std::min((6 + splits - 1) / splits, even / 4);
    MP_USER_CHECK(lead < even, "gemm: split_lead ", lead, " leaves no K steps to the shorter splits (",
                  splits, " splits of ", k_iters, " K steps: an even share is ", even, "; use at most ",
                  even - 1, ")");
  } else {
    MP_USER_CHECK(s.split_lead <= 0, "gemm: split_lead ", s.split_lead,
                  " applies to split tiles, and this plan does not split K (split_k 1); set split_k > 1 or "
                  "leave split_lead at -1");
  }
  MP_USER_CHECK(!(s.data_only && s.compute_only), "gemm: data_only and compute_only exclude each other");
  // Stream-K needs the persistent grid of 128-row tiles.
  const bool sk = s.stream_k != stream_k_mode::off && bm == 128 && splits == 1 && s.persistent;
  // The whole-tile epilogue needs a shared buffer for each of a consumer's four 64 x 64 bf16 chunks (a
  // ring stage's worth of space; an f32 tile would need two) and is compiled for the one kernel shape the
  // large GEMMs get. Automatic: only on the persistent grid with more tiles than SMs; with one tile per
  // block there is no next tile for the ring to be filling during the epilogue, and the fourth stage
  // measured worth more (2048^3: 0.954-0.977x against 0.963-0.990x cuBLAS; bench/RESULTS.md, GEMM).
  const bool whole_fits = bm == 128 && bn == 256 && splits == 1 && out == out_type::bf16;
  MP_USER_CHECK(s.epilogue != epilogue_mode::whole || whole_fits,
                "gemm: the whole-tile epilogue runs bf16 output on 128 x 256 tiles without K splits; this "
                "shape got ",
                bm, " x ", bn, " tiles, split-K ", splits, ", ", out == out_type::f32 ? "f32" : "bf16",
                " output (use epilogue=immediate or auto, or set block_m=128, block_n=256, split_k=1)");
  const bool whole = s.epilogue == epilogue_mode::whole ||
                     (s.epilogue == epilogue_mode::automatic && whole_fits && s.persistent && tiles > sms);
  const int sk_tiles = sk ? stream_k_tiles(tiles, sms, k_iters, s.stream_k) : 0;
  GemmPlan plan{bm, bn, splits, tiles, sk_tiles, lead, whole};
  // L2 priorities (GemmSchedule::l2_a): keep A's rows and let B and C go first where the operands do not
  // fit in L2 together and the A rows a group of tiles shares fit in a third of it; else no hints.
  MP_USER_CHECK(l2_bytes > 0, "gemm: the GPU's L2 size must be positive, got ", l2_bytes, " bytes");
  const long long group_rows = std::min<long long>(std::max(1, s.group_m), (m + bm - 1) / bm) * bm;
  const long long operands = 2ll * (1ll * m * k + 1ll * k * n) + (out == out_type::f32 ? 4ll : 2ll) * m * n;
  const bool keep_a = 2 * operands > l2_bytes && 3 * (group_rows * k * 2) <= l2_bytes;
  auto pick = [](l2_priority asked, l2_priority chosen) {
    return asked == l2_priority::automatic ? chosen : asked;
  };
  plan.l2_a = pick(s.l2_a, keep_a ? l2_priority::evict_last : l2_priority::normal);
  plan.l2_b = pick(s.l2_b, keep_a ? l2_priority::evict_first : l2_priority::normal);
  plan.l2_c = pick(s.l2_c, keep_a ? l2_priority::evict_first : l2_priority::normal);
  return plan;
}

std::string describe_plan(const GemmPlan& p, const GemmSchedule& s) {
  char buf[256];
  char sk[48] = "";
  if (p.sk_tiles > 0) std::snprintf(sk, sizeof sk, ", stream-K over the last %d", p.sk_tiles);
  char lead[40] = "";
  if (p.split_lead > 0) std::snprintf(lead, sizeof lead, " (lead %d K steps)", p.split_lead);
  std::snprintf(buf, sizeof buf, "%dx%dx64 tiles, %d tiles%s, split-K %d%s, %s grid%s", p.bm, p.bn, p.tiles, sk,
                p.splits, lead, s.persistent ? "persistent" : "one-block-per-tile",
                p.whole_tile ? ", whole-tile epilogue" : "");
  std::string d = buf;
  if (p.l2_a != l2_priority::normal || p.l2_b != l2_priority::normal || p.l2_c != l2_priority::normal)
    d += std::string(", L2 A ") + l2_priority_name(p.l2_a) + " B " + l2_priority_name(p.l2_b) + " C " +
         l2_priority_name(p.l2_c);
  return d;
}

const char* const gemm_trace_point_names[gemm_trace_times] = {"block start",
                                                              "ready (set up; previous kernel done)",
                                                              "first stage full",
                                                              "mainloop done",
                                                              "fixup done (split tiles)",
                                                              "epilogue: may write (whole tile)",
                                                              "epilogue: written (whole tile)",
                                                              "finish issued",
                                                              "block done"};

namespace {
// The value among `all` whose name_of(value) is `name`, into `out` (left as it is for an unknown name).
template <class E>
bool parse_by_name(const std::string& name, E& out, std::initializer_list<E> all, const char* (*name_of)(E)) {
  for (E v : all)
    if (name == name_of(v)) {
      out = v;
      return true;
    }
  return false;
}
}  // namespace

const char* stream_k_mode_name(stream_k_mode m) {
  return m == stream_k_mode::off ? "0" : m == stream_k_mode::on ? "1" : "auto";
}
bool parse_stream_k_mode(const std::string& name, stream_k_mode& out) {
  return parse_by_name(name, out, {stream_k_mode::automatic, stream_k_mode::off, stream_k_mode::on},
                       stream_k_mode_name);
}

const char* l2_priority_name(l2_priority p) {
  return p == l2_priority::evict_first  ? "first"
         : p == l2_priority::evict_last ? "last"
         : p == l2_priority::automatic  ? "auto"
                                        : "normal";
}
bool parse_l2_priority(const std::string& name, l2_priority& out) {
  return parse_by_name(name, out,
                       {l2_priority::normal, l2_priority::evict_first, l2_priority::evict_last,
                        l2_priority::automatic},
                       l2_priority_name);
}

const char* epilogue_mode_name(epilogue_mode e) {
  return e == epilogue_mode::immediate ? "immediate" : e == epilogue_mode::whole ? "whole" : "auto";
}
bool parse_epilogue_mode(const std::string& name, epilogue_mode& out) {
  return parse_by_name(name, out, {epilogue_mode::automatic, epilogue_mode::immediate, epilogue_mode::whole},
                       epilogue_mode_name);
}

namespace {
// A whole decimal integer in [lo, hi], or a user_error naming the key.
int schedule_int(const std::string& key, const std::string& v, int lo, int hi) {
  long long x = 0;
  bool ok = !v.empty() && v.size() <= 9;
  for (char c : v) ok = ok && c >= '0' && c <= '9';
  if (ok) x = std::stoll(v);
  MP_USER_CHECK(ok && x >= lo && x <= hi, "gemm schedule: ", key, "=", v, " is not a whole number from ", lo,
                " to ", hi);
  return int(x);
}
bool schedule_bool(const std::string& key, const std::string& v) {
  MP_USER_CHECK(v == "0" || v == "1", "gemm schedule: ", key, "=", v, " must be 0 or 1");
  return v == "1";
}
}  // namespace

void apply_schedule(const std::string& text, GemmSchedule& s) {
  MP_USER_CHECK(!text.empty(), "gemm schedule: empty; write key=value pairs separated by commas, e.g. "
                               "block_m=64,split_k=2");
  size_t from = 0;
  while (from <= text.size()) {
    size_t comma = text.find(',', from);
    if (comma == std::string::npos) comma = text.size();
    const std::string pair = text.substr(from, comma - from);
    from = comma + 1;
    const size_t eq = pair.find('=');
    MP_USER_CHECK(eq != std::string::npos && eq > 0, "gemm schedule: '", pair,
                  "' is not key=value (pairs are separated by commas, e.g. block_m=64,split_k=2)");
    const std::string key = pair.substr(0, eq), v = pair.substr(eq + 1);
    if (key == "block_m") {
      s.block_m = schedule_int(key, v, 0, 128);
      MP_USER_CHECK(s.block_m == 0 || s.block_m == 64 || s.block_m == 128, "gemm schedule: block_m=", v,
                    " must be 0, 64 or 128");
    } else if (key == "block_n") {
      s.block_n = schedule_int(key, v, 0, 256);
      MP_USER_CHECK(s.block_n == 0 || s.block_n == 128 || s.block_n == 256, "gemm schedule: block_n=", v,
                    " must be 0, 128 or 256");
    } else if (key == "split_k") {
      s.split_k = schedule_int(key, v, 0, 1024);
    } else if (key == "split_lead") {
      s.split_lead = v == "auto" ? -1 : schedule_int(key, v, 0, 1024);
    } else if (key == "group_m") {
      s.group_m = schedule_int(key, v, 1, 65536);
    } else if (key == "stream_k") {
      MP_USER_CHECK(parse_stream_k_mode(v, s.stream_k), "gemm schedule: stream_k=", v, " must be auto, 0 or 1");
    } else if (key == "epilogue") {
      MP_USER_CHECK(parse_epilogue_mode(v, s.epilogue), "gemm schedule: epilogue=", v,
                    " must be auto, immediate or whole");
    } else if (key == "l2") {
      MP_USER_CHECK(v == "auto" || v == "none", "gemm schedule: l2=", v,
                    " must be auto or none (l2_a, l2_b, l2_c set one operand)");
      s.l2_a = s.l2_b = s.l2_c = v == "none" ? l2_priority::normal : l2_priority::automatic;
    } else if (key == "l2_a" || key == "l2_b" || key == "l2_c") {
      l2_priority& to = key == "l2_a" ? s.l2_a : key == "l2_b" ? s.l2_b : s.l2_c;
      MP_USER_CHECK(parse_l2_priority(v, to), "gemm schedule: ", key, "=", v,
                    " must be auto, normal, first or last");
    } else if (key == "persistent") {
      s.persistent = schedule_bool(key, v);
    } else if (key == "fixed_reducer") {
      s.fixed_reducer = schedule_bool(key, v);
    } else {
      fail_user("gemm schedule: unknown key '", key,
                "' (keys: block_m, block_n, split_k, split_lead, group_m, stream_k, epilogue, l2, l2_a, l2_b, "
                "l2_c, persistent, fixed_reducer)");
    }
  }
}

uint16_t float_to_bf16_bits(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fc0;  // NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}
float bf16_bits_to_float(uint16_t b) {
  uint32_t u = uint32_t(b) << 16;
  float x;
  std::memcpy(&x, &u, 4);
  return x;
}

std::vector<double> gemm_reference_cpu(const std::vector<float>& a, const std::vector<float>& b, int m, int n,
                                       int k, b_layout bl) {
  std::vector<double> c(size_t(m) * n, 0.0);
  for (int i = 0; i < m; ++i) {
    double* ci = &c[size_t(i) * n];
    const float* ai = &a[size_t(i) * k];
    if (bl == b_layout::kn) {
      for (int kk = 0; kk < k; ++kk) {
        const double av = ai[kk];
        const float* bk = &b[size_t(kk) * n];
        for (int j = 0; j < n; ++j) ci[j] += av * bk[j];
      }
    } else {
      for (int j = 0; j < n; ++j) {
        const float* bj = &b[size_t(j) * k];
        double s = 0;
        for (int kk = 0; kk < k; ++kk) s += double(ai[kk]) * bj[kk];
        ci[j] = s;
      }
    }
  }
  return c;
}

}  // namespace mp::kernels
