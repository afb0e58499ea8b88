// Tolerant comparison of a result against a reference, with the numbers a report needs.
#pragma once
#include <cstddef>
#include <span>
#include <string>

namespace mp {

struct CompareResult {
  double max_abs_err = 0;   // max |got - want|
  double max_rel_err = 0;   // max |got - want| / (|want| + atol/rtol scale), see compare()
  double rel_l2_err = 0;    // ||got - want||_2 / ||want||_2
  size_t worst_index = 0;
  size_t mismatches = 0;    // elements outside tolerance (NaN counts as a mismatch)
  bool ok = false;
  std::string summary() const;  // e.g. "ok (max rel 3.1e-06)" or "FAIL: 12 mismatches, worst at 7 ..."
};

// Element i passes when |got-want| <= atol + rtol*|want|. max_rel_err is reported relative to
// max(|want|, atol/rtol) so tiny reference values do not produce meaningless ratios.
CompareResult compare(std::span<const float> got, std::span<const double> want, double rtol, double atol);
CompareResult compare(std::span<const float> got, std::span<const float> want, double rtol, double atol);

}  // namespace mp
