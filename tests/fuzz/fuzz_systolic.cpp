// libFuzzer target for the SCALE-Sim config and topology readers: any text must parse or end in a
// user_error; a parsed topology's layers are costed (estimate_cost) so that the undefined-behaviour
// sanitizer sees any overflow the range checks let through. Built by the `fuzz` preset; replayed
// over tests/fuzz/corpus_systolic by test_fuzz_corpus.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "core/error.h"
#include "systolic/scalesim.h"
#include "systolic/systolic.h"

namespace mp::fuzz {

void systolic_one(std::string_view text) {
  using namespace mp::systolic;
  SimConfig cfg;
  try {
    cfg = parse_config(text, "fuzz.cfg");
    (void)analyze_gemm(GemmShape{64, 64, 64}, cfg.array);
  } catch (const mp::user_error&) {
  }
  for (TopologyKind kind : {TopologyKind::Conv, TopologyKind::Gemm}) {
    try {
      const auto layers = parse_topology(text, "fuzz.csv", kind);
      for (size_t i = 0; i < layers.size() && i < 64; ++i) {
        (void)estimate_cost(layers[i], cfg, true);
        (void)plan_gemm(layers[i].gemm(), cfg.array);
      }
    } catch (const mp::user_error&) {
    }
  }
}

}  // namespace mp::fuzz

#ifndef MP_FUZZ_REPLAY
extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  mp::fuzz::systolic_one(std::string_view(reinterpret_cast<const char*>(data), size));
  return 0;
}
#endif
