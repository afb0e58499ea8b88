// The main() of every metapipe test executable. ctest runs one test per process (gtest_discover_tests);
// when that test was skipped (GTEST_SKIP, e.g. an SM90_* suite without a GPU) the process exits 77, which
// the SKIP_RETURN_CODE property turns into "skipped" in ctest. A plain exit code is used rather than a
// SKIP_REGULAR_EXPRESSION on gtest's "[  SKIPPED ]" line because the regex's brackets are escaped
// differently by different CMake versions' test discovery (CMake 3.25 accepted it, a newer one on the
// device machine rejected the generated file).
#include <gtest/gtest.h>

int main(int argc, char** argv) {
  testing::InitGoogleTest(&argc, argv);
  int rc = RUN_ALL_TESTS();
  const testing::UnitTest* u = testing::UnitTest::GetInstance();
  if (rc == 0 && u->test_to_run_count() > 0 && u->skipped_test_count() == u->test_to_run_count()) return 77;
  return rc;
}
