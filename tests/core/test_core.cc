#include <gtest/gtest.h>

#include <cmath>

#include "parallax/core.h"

namespace px {

TEST(DType, SizesAndNames) {
  EXPECT_EQ(dtype_size(DType::f32), 4);
  EXPECT_EQ(dtype_size(DType::bf16), 2);
  EXPECT_EQ(dtype_size(DType::boolean), 1);
  EXPECT_EQ(dtype_from_name("bf16"), DType::bf16);
  EXPECT_THROW(dtype_from_name("f64"), Error);
}

TEST(DType, Bf16RoundsToNearestEven) {
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(1.0f)), 1.0f);
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(-3.5f)), -3.5f);
  // 1 + 2^-8 lies exactly between two bf16 values: ties go to the even mantissa (1.0).
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(1.0f + 1.0f / 256)), 1.0f);
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(NAN))));
  EXPECT_TRUE(std::isinf(bf16_to_f32(f32_to_bf16(INFINITY))));
}

TEST(DType, F16RoundTrip) {
  for (float v : {0.0f, 1.0f, -2.5f, 65504.0f, 6.1035156e-05f, 5.9604645e-08f, 0.333251953125f})
    EXPECT_EQ(f16_to_f32(f32_to_f16(v)), v) << v;
  EXPECT_TRUE(std::isinf(f16_to_f32(f32_to_f16(1e6f))));
  EXPECT_NEAR(f16_to_f32(f32_to_f16(0.1f)), 0.1f, 1e-4);
}

TEST(Array, ConvertsBetweenDtypes) {
  Array a = Array::from_f32({1.5f, -2.0f, 0.0f, 3.0f}, {2, 2});
  EXPECT_EQ(a.shape(), (Shape{2, 2}));
  EXPECT_EQ(a.astype(DType::bf16).to_f32(), (std::vector<float>{1.5f, -2.0f, 0.0f, 3.0f}));
  EXPECT_EQ(a.astype(DType::i32).to_i32(), (std::vector<int32_t>{1, -2, 0, 3}));
  EXPECT_EQ(a.astype(DType::boolean).to_i32(), (std::vector<int32_t>{1, 1, 0, 1}));
  EXPECT_THROW(Array::from_f32({1, 2, 3}, {2, 2}), Error);
  EXPECT_THROW(a.reshape({3}), Error);
  EXPECT_EQ(a.reshape({4}).shape(), (Shape{4}));
}

TEST(Shape, NormalizeAxisNamesTheOp) {
  EXPECT_EQ(normalize_axis(-1, 3, "sum"), 2);
  try {
    normalize_axis(3, 3, "sum");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("[sum] axis 3 is out of range for rank 3"), std::string::npos);
  }
}

}  // namespace px
