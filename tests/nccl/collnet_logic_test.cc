// The CollNet plugin's pure logic: the supported (datatype, op) table and window splitting.
#include "integrations/nccl/collnet_logic.h"

#include <gtest/gtest.h>

#include <vector>

namespace ina::nccl {
namespace {

TEST(CollNetLogic, SupportedPairsAreTheEighteenInaReduces) {
  int n = 0;
  for (int t = 0; t < ncclNumTypes; ++t) {
    for (int op = 0; op < ncclNumOps; ++op) {
      n += supported(static_cast<ncclDataType_t>(t), static_cast<ncclRedOp_t>(op));
    }
  }
  EXPECT_EQ(n, 18);  // 6 types (float8 included) x SUM, MIN, MAX
  DType d;
  ReduceOp o;
  EXPECT_TRUE(map_dtype(ncclBfloat16, &d));
  EXPECT_EQ(d, DType::kBFloat16);
  EXPECT_TRUE(map_op(ncclMin, &o));
  EXPECT_EQ(o, ReduceOp::kMin);
  EXPECT_FALSE(supported(ncclUint32, ncclSum));
  EXPECT_FALSE(supported(ncclFloat64, ncclMax));
  EXPECT_FALSE(supported(ncclFloat32, ncclAvg));
  EXPECT_FALSE(supported(ncclInt32, static_cast<ncclRedOp_t>(ncclNumOps)));  // a user op
}

TEST(CollNetLogic, Fp8IsMappedAndOffered) {
  DType d;
  ASSERT_TRUE(map_dtype(ncclFloat8e4m3, &d));
  EXPECT_EQ(d, DType::kFloat8E4M3);
  ASSERT_TRUE(map_dtype(ncclFloat8e5m2, &d));
  EXPECT_EQ(d, DType::kFloat8E5M2);
  EXPECT_EQ(dtype_size(d), 1u);
  EXPECT_TRUE(supported(ncclFloat8e4m3, ncclSum));
  EXPECT_TRUE(supported(ncclFloat8e5m2, ncclMax));
}

TEST(CollNetLogic, WindowInsideOneSlice) {
  std::vector<Segment> s;
  ASSERT_TRUE(split_window(100, 130, 20, 4, &s));
  ASSERT_EQ(s.size(), 1u);
  EXPECT_EQ(s[0].owner, 1);
  EXPECT_EQ(s[0].window_pos, 0u);
  EXPECT_EQ(s[0].bytes, 20u);
}

TEST(CollNetLogic, WindowAcrossSlices) {
  std::vector<Segment> s;
  ASSERT_FALSE(split_window(100, 150, 260, 4, &s));  // [150, 410) of 400: past the end
  ASSERT_TRUE(split_window(100, 150, 250, 4, &s));   // [150, 400)
  ASSERT_EQ(s.size(), 3u);
  EXPECT_EQ(s[0].owner, 1);
  EXPECT_EQ(s[0].bytes, 50u);
  EXPECT_EQ(s[1].owner, 2);
  EXPECT_EQ(s[1].window_pos, 50u);
  EXPECT_EQ(s[1].bytes, 100u);
  EXPECT_EQ(s[2].owner, 3);
  EXPECT_EQ(s[2].window_pos, 150u);
  EXPECT_EQ(s[2].bytes, 100u);
}

TEST(CollNetLogic, EmptyAndDegenerateWindows) {
  std::vector<Segment> s{{0, 0, 1}};
  EXPECT_TRUE(split_window(100, 400, 0, 4, &s));
  EXPECT_TRUE(s.empty());
  EXPECT_FALSE(split_window(0, 0, 1, 4, &s));
  EXPECT_FALSE(split_window(100, 401, 1, 4, &s));
  EXPECT_FALSE(split_window(100, 0, 1, 0, &s));
  EXPECT_FALSE(split_window(SIZE_MAX / 2, SIZE_MAX - 1, 10, 2, &s));  // no overflow past the end
}

}  // namespace
}  // namespace ina::nccl
