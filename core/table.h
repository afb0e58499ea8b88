// A plain text table with aligned columns, for CLI reports.
#pragma once
#include <ostream>
#include <string>
#include <vector>

namespace mp {

class Table {
 public:
  explicit Table(std::vector<std::string> header) : header_(std::move(header)) {}
  void add(std::vector<std::string> row);
  void print(std::ostream& os) const;

 private:
  std::vector<std::string> header_;
  std::vector<std::vector<std::string>> rows_;
};

}  // namespace mp
