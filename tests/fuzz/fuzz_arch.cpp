// libFuzzer target for the .arch reader and --set overrides of architecture keys: any text must parse or
// end in a user_error; a parsed architecture is summarized (the products of its sizes), and every line is
// also tried as an override of the plasticine preset. Built by the `fuzz` preset; replayed over
// tests/fuzz/corpus_arch by test_fuzz_corpus.
#include <cstddef>
#include <cstdint>
#include <sstream>
#include <string>
#include <string_view>

#include "backends/rdu/arch.h"
#include "core/error.h"

namespace mp::fuzz {

void arch_one(std::string_view text) {
  using namespace mp::rdu;
  try {
    const Arch a = parse_arch(std::string(text), "fuzz.arch");
    (void)a.summary();
    (void)a.peak_flops_per_cycle();
  } catch (const mp::user_error&) {
  }
  static const Arch plasticine = load_arch("plasticine");  // parsed once: the overrides are the target
  Arch p = plasticine;
  std::istringstream in{std::string(text)};
  std::string line;
  for (int n = 0; std::getline(in, line) && n < 32; ++n) {
    try {
      apply_override(p, line);
      (void)p.summary();
    } catch (const mp::user_error&) {
    }
  }
}

}  // namespace mp::fuzz

#ifndef MP_FUZZ_REPLAY
extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  mp::fuzz::arch_one(std::string_view(reinterpret_cast<const char*>(data), size));
  return 0;
}
#endif
