// core/device: the GPU query must not throw or invent a device; its absence must carry a reason.
#include <gtest/gtest.h>

#include "core/device.h"

TEST(Device, QueryIsConsistent) {
  auto g = mp::query_gpu();
  if (g) {
    EXPECT_GT(g->sm_count, 0);
    EXPECT_GT(g->l2_bytes, 0u);
    EXPECT_FALSE(g->name.empty());
  } else {
    EXPECT_FALSE(mp::gpu_absent_reason().empty());
  }
  if (!mp::built_with_cuda()) {
    EXPECT_FALSE(g.has_value());
  }
}
