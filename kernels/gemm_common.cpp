// Host parts of the GEMM that need no GPU: shape checks, bf16 rounding and the CPU fp64 reference.
#include <cstring>

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

const char* consumer_schedule_name(consumer_schedule c) {
  return c == consumer_schedule::pingpong ? "pingpong" : "cooperative";
}
bool parse_consumer_schedule(const std::string& name, consumer_schedule& out) {
  for (auto c : {consumer_schedule::cooperative, consumer_schedule::pingpong})
    if (name == consumer_schedule_name(c)) {
      out = c;
      return true;
    }
  return false;
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
