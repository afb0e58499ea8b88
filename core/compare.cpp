// Tolerant comparison used by every check against a reference.
#include "core/compare.h"

#include <cmath>
#include <cstdio>
#include <vector>

#include "core/error.h"

namespace mp {

std::string CompareResult::summary() const {
  char buf[200];
  if (ok)
    std::snprintf(buf, sizeof buf, "ok (max rel %.1e)", max_rel_err);
  else
    std::snprintf(buf, sizeof buf, "FAIL: %zu mismatches, worst at %zu (max rel %.1e, max abs %.1e)",
                  mismatches, worst_index, max_rel_err, max_abs_err);
  return buf;
}

CompareResult compare(std::span<const float> got, std::span<const double> want, double rtol, double atol) {
  MP_INTERNAL_CHECK(got.size() == want.size(), "compare: sizes differ (", got.size(), " vs ", want.size(), ")");
  CompareResult r;
  double num = 0, den = 0, floor = rtol > 0 ? atol / rtol : 1.0;
  for (size_t i = 0; i < got.size(); ++i) {
    double g = got[i], w = want[i], d = std::fabs(g - w);
    bool bad = !(d <= atol + rtol * std::fabs(w));  // NaN compares false -> bad
    if (bad) ++r.mismatches;
    double rel = std::isnan(d) ? INFINITY : d / std::max(std::fabs(w), floor);
    if (rel > r.max_rel_err || (bad && r.mismatches == 1)) {
      r.max_rel_err = std::max(r.max_rel_err, rel);
      r.worst_index = i;
    }
    r.max_abs_err = std::max(r.max_abs_err, std::isnan(d) ? INFINITY : d);
    num += d * d;
    den += w * w;
  }
  r.rel_l2_err = den > 0 ? std::sqrt(num / den) : std::sqrt(num);
  r.ok = r.mismatches == 0;
  return r;
}

CompareResult compare(std::span<const float> got, std::span<const float> want, double rtol, double atol) {
  std::vector<double> w(want.begin(), want.end());
  return compare(got, std::span<const double>(w), rtol, atol);
}

}  // namespace mp
