// Aligned text tables for CLI reports.
#include "core/table.h"

#include <algorithm>

#include "core/error.h"

namespace mp {

void Table::add(std::vector<std::string> row) {
  MP_INTERNAL_CHECK(row.size() == header_.size(), "table row has ", row.size(), " cells, header ",
                    header_.size());
  rows_.push_back(std::move(row));
}

void Table::print(std::ostream& os) const {
  std::vector<size_t> w(header_.size());
  for (size_t c = 0; c < header_.size(); ++c) {
    w[c] = header_[c].size();
    for (const auto& r : rows_) w[c] = std::max(w[c], r[c].size());
  }
  auto line = [&](const std::vector<std::string>& r) {
    for (size_t c = 0; c < r.size(); ++c) {
      os << r[c];
      if (c + 1 < r.size()) os << std::string(w[c] - r[c].size() + 2, ' ');
    }
    os << '\n';
  };
  line(header_);
  std::vector<std::string> rule;
  for (size_t c = 0; c < w.size(); ++c) rule.push_back(std::string(w[c], '-'));
  line(rule);
  for (const auto& r : rows_) line(r);
}

}  // namespace mp
