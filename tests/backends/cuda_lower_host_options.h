// Lowering options of the host test: two warps per block (the warp reductions see more than one warp)
// and a small shared-memory budget, so that values spill to global scratch in several programs too.
#pragma once
#include "backends/cuda/lower/lower.h"

namespace mp::cuda_test {

inline cuda::LowerOptions host_options() {
  cuda::LowerOptions o;
  o.threads = 64;
  o.smem_bytes = 8 * 1024;
  return o;
}

// host_options() with a variant's speed options (cuda_lower_cases.h) applied.
template <class V>
cuda::LowerOptions host_options(const V& v) {
  cuda::LowerOptions o = host_options();
  if (!v.ring.empty()) cuda::set_ring_option(o, v.ring);
  if (v.threads > 0) o.threads = v.threads;
  o.fuse_elementwise = v.fuse;
  if (v.barriers == 2) o.one_barrier_ring = false;
  if (!v.copy.empty()) cuda::set_copy_option(o, v.copy);
  if (v.rows == "tile") o.warp_rows = false;
  if (v.store == "scalar") o.vector_stores = false;
  if (v.prefetch == "off") o.prefetch = false;
  if (v.producer == "thread") o.producer_warp = false;
  if (v.producer == "warp") o.producer_warp = true;
  return o;
}

}  // namespace mp::cuda_test
