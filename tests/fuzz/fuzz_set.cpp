// libFuzzer target for `--set NAME=VALUE` program parameters: the input's lines are the assignments,
// resolved against every registered program; each must resolve or end in a user_error, and resolved
// parameters must give compile options. Built by the `fuzz` preset; replayed over
// tests/fuzz/corpus_set by test_fuzz_corpus.
#include <cstddef>
#include <cstdint>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "core/error.h"
#include "examples/registry.h"

namespace mp::fuzz {

void set_one(std::string_view text) {
  std::vector<std::string> sets;
  std::istringstream in{std::string(text)};
  std::string line;
  while (std::getline(in, line) && sets.size() < 16) sets.push_back(line);
  // A program with each kind of parameter (a size, a ranged number, a free number, a type), so the target
  // needs no registered programs; the registered ones, where linked in, are tried as well.
  static const mp::examples::ProgramSpec synthetic = [] {
    mp::examples::ProgramSpec s;
    s.name = "synthetic";
    s.params = {{"M", "256", "rows"},
                {"eps", "1e-5", "epsilon", 1e-30, 1},
                {"p", "0.1", "probability"},
                {"theta", "10000", "base", 2, 1e9},
                {"dtype", "f32", "type"}};
    return s;
  }();
  std::vector<const mp::examples::ProgramSpec*> specs = mp::examples::programs();
  specs.push_back(&synthetic);
  for (const auto* spec : specs) {
    try {
      const mp::examples::Params p = mp::examples::resolve(*spec, sets);
      (void)mp::examples::compile_options(p);
    } catch (const mp::user_error&) {
    }
  }
}

}  // namespace mp::fuzz

#ifndef MP_FUZZ_REPLAY
extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  mp::fuzz::set_one(std::string_view(reinterpret_cast<const char*>(data), size));
  return 0;
}
#endif
