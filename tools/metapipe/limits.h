// The --max-work / --max-memory options of the commands that run an engine (systolic, sim, run): each
// engine estimates its cost before it starts and refuses an input beyond the limit (core/checked.h).
#pragma once
#include <cstdint>
#include <string>

#include "backends/cpu/estimate.h"
#include "core/checked.h"
#include "examples/registry.h"
#include "tools/metapipe/cli.h"

namespace mp::cli {

// The option's value (parse_limit syntax: 20G, 512Mi, 8GiB), `def` when absent; bad usage otherwise.
inline std::int64_t limit_option(Args& a, const char* name, std::int64_t def) {
  auto v = a.value({name});
  if (!v) return def;
  auto x = parse_limit(*v);
  if (!x)
    throw usage_error(std::string(name) +
                      " expects a positive integer with an optional suffix (k, M, G, T, " +
                      "Ki, Mi, Gi, Ti; e.g. 20G or 8GiB), got '" + *v + "'");
  return *x;
}

// Refuses, before any tensor is allocated, a program whose tensors would take more than `limit` bytes.
inline void check_memory(const examples::ProgramSpec& spec, const examples::Params& params, int64_t limit) {
  const cpu::MemoryEstimate e = cpu::estimate_memory(examples::build(spec, params));
  if (e.bytes > limit)
    throw user_error("program '" + spec.name + "' with these parameters needs about " +
                     format_bytes(e.bytes) + " of host memory (largest tensor '" + e.largest +
                     "': " + short_count(e.largest_elems) + " elements), above the limit " +
                     format_bytes(limit) + "; make its sizes smaller (--set), or raise --max-memory");
}

}  // namespace mp::cli
