// What running a program on the CPU allocates, estimated from its tensors' shapes before anything is
// allocated, so that `metapipe run` (and `metapipe sim --functional`) refuse an input that would not fit
// with a message naming the largest tensor, instead of ending in std::bad_alloc.
#pragma once
#include <cstdint>
#include <string>

#include "core/checked.h"
#include "ir/ir.h"

namespace mp::cpu {

struct MemoryEstimate {
  int64_t bytes = 0;          // saturating at INT64_MAX
  std::string largest;        // name of the largest tensor
  int64_t largest_elems = 0;  // its elements
};

// Per element of every off-chip tensor: the fp32 random input or host buffer (4 bytes), the backend's
// copy (4) and the double reference or magnitude (8).
inline MemoryEstimate estimate_memory(const ir::Program& p) {
  constexpr int64_t kBytesPerElement = 16;
  MemoryEstimate e;
  for (const auto& t : p.tensors) {
    int64_t n = 1;
    for (int64_t d : t->shape) n = mul_sat(n, d < 0 ? 0 : d);
    e.bytes = add_sat(e.bytes, mul_sat(n, kBytesPerElement));
    if (n > e.largest_elems) e.largest_elems = n, e.largest = t->name;
  }
  return e;
}

// Default of --max-memory for the commands that run programs on the host.
inline constexpr int64_t kDefaultMaxMemory = int64_t{8} << 30;

}  // namespace mp::cpu
