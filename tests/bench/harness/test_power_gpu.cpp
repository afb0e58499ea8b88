// PowerProbe on the GPU: NVML knows the CUDA device's bus id, and its energy counter only goes up.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include "core/device.h"
#include "bench/harness/power.h"

TEST(GPU_PowerProbe, ReadsTheGpusCounter) {
  if (!mp::query_gpu()) GTEST_SKIP() << "no GPU: " << mp::gpu_absent_reason();
  char bus[32] = "";
  ASSERT_EQ(cudaDeviceGetPCIBusId(bus, sizeof bus, 0), cudaSuccess);
  mp::PowerProbe p(bus);
  if (!p.available()) GTEST_SKIP() << "no NVML energy counter: " << p.why();
  const auto e0 = p.energy_mj(), e1 = p.energy_mj();
  ASSERT_TRUE(e0 && e1);
  EXPECT_GT(*e0, 0);
  EXPECT_GE(*e1, *e0);
  const auto mhz = p.sm_clock_mhz();
  ASSERT_TRUE(mhz);
  EXPECT_GT(*mhz, 0u);
}
