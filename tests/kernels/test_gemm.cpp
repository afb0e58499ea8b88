// CPU tests of the GEMM's host side: shape checks (the messages), bf16 rounding and the fp64 reference.
#include <gtest/gtest.h>

#include "core/error.h"
#include "kernels/gemm.h"

using namespace mp::kernels;

static std::string error_of(long long m, long long n, long long k) {
  try {
    check_gemm_shape(m, n, k);
  } catch (const mp::user_error& e) {
    return e.what();
  }
  return "";
}

TEST(Gemm, RejectsShapesThatAreNotMultiplesOf16) {
  EXPECT_EQ(error_of(16, 32, 4096), "");
  EXPECT_NE(error_of(100, 64, 64).find("M=100 is not a multiple of 16"), std::string::npos)
      << error_of(100, 64, 64);
  EXPECT_NE(error_of(64, 24, 64).find("N=24 is not a multiple of 16"), std::string::npos);
  EXPECT_NE(error_of(64, 64, 8).find("K=8 is not a multiple of 16"), std::string::npos);
  EXPECT_NE(error_of(64, 64, 8).find("pad K to 16"), std::string::npos);
  EXPECT_NE(error_of(0, 64, 64).find("M=0 must be positive"), std::string::npos);
}

TEST(Gemm, EntryPointChecksTheShapeFirst) {
  // Whatever the build (with or without CUDA), a bad shape is a user error naming the dimension.
  try {
    gemm_bf16(nullptr, nullptr, nullptr, 64, 64, 40, b_layout::nk, out_type::bf16);
    FAIL() << "no error";
  } catch (const mp::user_error& e) {
    EXPECT_NE(std::string(e.what()).find("K=40"), std::string::npos) << e.what();
  }
}

TEST(Gemm, Bf16RoundingIsNearestEven) {
  EXPECT_EQ(float_to_bf16_bits(1.0f), 0x3f80);
  EXPECT_EQ(bf16_bits_to_float(float_to_bf16_bits(3.140625f)), 3.140625f);
  EXPECT_EQ(float_to_bf16_bits(1.0f + 1.0f / 256), 0x3f80);  // tie -> even
  EXPECT_EQ(float_to_bf16_bits(1.0f + 3.0f / 256), 0x3f82);  // tie -> even (up)
  EXPECT_EQ(float_to_bf16_bits(-2.0f), 0xc000);
}

TEST(Gemm, CpuReferenceBothLayouts) {
  // A = [[1,2],[3,4]], B (k x n) = [[5,6],[7,8]] -> [[19,22],[43,50]]; B^T stored n x k gives the same.
  std::vector<float> a{1, 2, 3, 4}, b{5, 6, 7, 8}, bt{5, 7, 6, 8};
  auto c = gemm_reference_cpu(a, b, 2, 2, 2, b_layout::kn);
  auto d = gemm_reference_cpu(a, bt, 2, 2, 2, b_layout::nk);
  EXPECT_EQ(c, (std::vector<double>{19, 22, 43, 50}));
  EXPECT_EQ(d, c);
}

TEST(Gemm, ConsumerScheduleNames) {
  EXPECT_EQ(GemmSchedule{}.consumers, consumer_schedule::cooperative);  // ping-pong is opt-in
  for (auto c : {consumer_schedule::cooperative, consumer_schedule::pingpong}) {
    consumer_schedule back =
        c == consumer_schedule::pingpong ? consumer_schedule::cooperative : consumer_schedule::pingpong;
    EXPECT_TRUE(parse_consumer_schedule(consumer_schedule_name(c), back));
    EXPECT_EQ(back, c);
  }
  consumer_schedule c = consumer_schedule::cooperative;
  EXPECT_FALSE(parse_consumer_schedule("ping-pong", c));
  EXPECT_EQ(c, consumer_schedule::cooperative);
}
