// Overflow-safe arithmetic on sizes that come from user input, and the work / memory limits every engine
// checks before it starts: a product of sizes is computed here, before anything is allocated, so an
// extreme input becomes a one-line user_error instead of a wrapped value, a bad_alloc or a hang.
#pragma once
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <optional>
#include <string>
#include <string_view>

#include "core/error.h"

namespace mp {

inline constexpr std::int64_t kInt64Max = std::numeric_limits<std::int64_t>::max();

// a * b and a + b, or nothing when the result does not fit in int64.
inline std::optional<std::int64_t> checked_mul(std::int64_t a, std::int64_t b) {
  std::int64_t r = 0;
  if (__builtin_mul_overflow(a, b, &r)) return std::nullopt;
  return r;
}
inline std::optional<std::int64_t> checked_add(std::int64_t a, std::int64_t b) {
  std::int64_t r = 0;
  if (__builtin_add_overflow(a, b, &r)) return std::nullopt;
  return r;
}

// Saturating versions for non-negative estimates: an overflowing estimate is INT64_MAX, which is above
// every limit, so the caller's limit check rejects it.
inline std::int64_t mul_sat(std::int64_t a, std::int64_t b) {
  auto r = checked_mul(a, b);
  return r ? *r : kInt64Max;
}
inline std::int64_t add_sat(std::int64_t a, std::int64_t b) {
  auto r = checked_add(a, b);
  return r ? *r : kInt64Max;
}

// a * b, or a user_error whose message is the streamed parts followed by the overflowing operands:
//   mul_or_fail(r, c, "rows x cols")  ->  "rows x cols overflows 64-bit integers (R x C)" with R and C in full.
template <class... Ts>
std::int64_t mul_or_fail(std::int64_t a, std::int64_t b, const Ts&... what) {
  auto r = checked_mul(a, b);
  if (!r) fail_user(what..., " overflows 64-bit integers (", a, " x ", b, ")");
  return *r;
}

// A limit given on the command line (--max-work, --max-memory): a positive integer, optionally with a
// decimal (k, M, G, T: powers of 1000) or binary (Ki, Mi, Gi, Ti: powers of 1024) suffix, optionally
// followed by "B" for memory ("16GiB", "500M", "2e9" is not accepted: write 2G). Nothing on bad input.
inline std::optional<std::int64_t> parse_limit(std::string_view s) {
  std::int64_t v = 0;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || p == s.data() || v <= 0) return std::nullopt;
  std::string_view suf(p, static_cast<size_t>(s.data() + s.size() - p));
  if (!suf.empty() && (suf.back() == 'B' || suf.back() == 'b')) suf.remove_suffix(1);
  std::int64_t scale = 1;
  if (!suf.empty()) {
    const bool bin = suf.size() == 2 && (suf[1] == 'i' || suf[1] == 'I');
    if (suf.size() != 1 && !bin) return std::nullopt;
    const std::int64_t base = bin ? 1024 : 1000;
    const std::string_view units = "kmgt";
    const size_t power = units.find(static_cast<char>(std::tolower(static_cast<unsigned char>(suf[0]))));
    if (power == std::string_view::npos) return std::nullopt;
    for (size_t i = 0; i <= power; ++i) scale *= base;
  }
  return checked_mul(v, scale);
}

// Human-readable count for limit messages: 1234567 -> "1.23e+06" (below 100000: all digits).
inline std::string short_count(std::int64_t v) {
  if (v < 100000) return std::to_string(v);
  char b[32];
  std::snprintf(b, sizeof b, "%.3g", static_cast<double>(v));
  return b;
}

// Bytes for limit messages: 8589934592 -> "8.0 GiB".
inline std::string format_bytes(std::int64_t v) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  double x = static_cast<double>(v);
  int u = 0;
  while (x >= 1024 && u < 6) x /= 1024, ++u;
  char b[32];
  std::snprintf(b, sizeof b, u == 0 ? "%.0f %s" : "%.1f %s", x, units[u]);
  return b;
}

}  // namespace mp
