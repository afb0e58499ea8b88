// PowerProbe: never throws, says why when it cannot read, and reads a counter that only goes up.
#include <gtest/gtest.h>

#include "core/device.h"
#include "bench/harness/power.h"

TEST(PowerProbe, UnknownGpuIsNotAvailable) {
  mp::PowerProbe p("ffff:ff:1f.7");  // no such bus id
  EXPECT_FALSE(p.available());
  EXPECT_FALSE(p.why().empty());
  EXPECT_FALSE(p.energy_mj().has_value());
  EXPECT_FALSE(p.sm_clock_mhz().has_value());
}
