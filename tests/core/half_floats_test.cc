// core/half_floats.h against PyTorch: float32 -> float16 and bfloat16 rounding on the cases where
// rounding is easy to get wrong, every 16-bit pattern widened and narrowed back, and a stored
// float16 tensor widened as it loads.
#include "core/half_floats.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <bit>
#include <cmath>
#include <cstdio>
#include <cstring>

#include "core/error.h"

namespace pt {
namespace {

// {float32 bits, torch's .half() bits, torch's .to(torch.bfloat16) bits}, printed by
// `samples/half/make_half.py --rounding` (PyTorch 2.15): signed zeros, float16's largest finite
// value, the halfway point past it (65520, to infinity) and just below, infinities, float16's
// least normal and the float32 just below it, its least subnormal, the halfway point below that
// (to zero) and just past it, ties to even in the subnormals and at 1 + 2^-11 (float16) and
// 1 + 2^-8 (bfloat16), bfloat16's overflow, a float32 subnormal, and everyday values.
struct Case {
  uint32_t f32;
  uint16_t f16, bf16;
};
constexpr Case kTorchCases[] = {
    {0x00000000, 0x0000, 0x0000},  // 0
    {0x80000000, 0x8000, 0x8000},  // -0
    {0x3f800000, 0x3c00, 0x3f80},  // 1
    {0xbf800000, 0xbc00, 0xbf80},  // -1
    {0x477fe000, 0x7bff, 0x4780},  // 65504
    {0x477fefff, 0x7bff, 0x4780},  // 65519.9961
    {0x477ff000, 0x7c00, 0x4780},  // 65520
    {0x47c35000, 0x7c00, 0x47c3},  // 100000
    {0x7f800000, 0x7c00, 0x7f80},  // inf
    {0xff800000, 0xfc00, 0xff80},  // -inf
    {0x38800000, 0x0400, 0x3880},  // 6.10351562e-05
    {0x387fffff, 0x0400, 0x3880},  // 6.10351526e-05
    {0x33800000, 0x0001, 0x3380},  // 5.96046448e-08
    {0x33000000, 0x0000, 0x3300},  // 2.98023224e-08
    {0x33000001, 0x0001, 0x3300},  // 2.98023259e-08
    {0x33c00000, 0x0002, 0x33c0},  // 8.94069672e-08
    {0x34400000, 0x0003, 0x3440},  // 1.78813934e-07
    {0x3f801000, 0x3c00, 0x3f80},  // 1.00048828
    {0x3f803000, 0x3c02, 0x3f80},  // 1.00146484
    {0x3f801001, 0x3c01, 0x3f80},  // 1.0004884
    {0x3f808000, 0x3c04, 0x3f80},  // 1.00390625
    {0x3f818000, 0x3c0c, 0x3f82},  // 1.01171875
    {0x3f808001, 0x3c04, 0x3f81},  // 1.00390637
    {0x7f7fffff, 0x7c00, 0x7f80},  // 3.40282347e+38
    {0x00000001, 0x0000, 0x0000},  // 1.40129846e-45
    {0xbeaaaaab, 0xb555, 0xbeab},  // -0.333333343
    {0x3dcccccd, 0x2e66, 0x3dcd},  // 0.100000001
    {0x42f6e979, 0x57b7, 0x42f7},  // 123.456001
};

TEST(HalfFloats, RoundToNearestEvenAsTorch) {
  for (const Case& c : kTorchCases) {
    const float f = std::bit_cast<float>(c.f32);
    EXPECT_EQ(float_to_float16(f), c.f16) << std::hex << c.f32;
    EXPECT_EQ(float_to_bfloat16(f), c.bf16) << std::hex << c.f32;
  }
  EXPECT_TRUE(std::isnan(float16_to_float(float_to_float16(std::nanf("")))));
  EXPECT_TRUE(std::isnan(bfloat16_to_float(float_to_bfloat16(-std::nanf("")))));
}

// Widening is exact: every finite pattern comes back from float32 as it was; NaNs stay NaN.
TEST(HalfFloats, WideningIsExact) {
  for (uint32_t h = 0; h <= 0xFFFF; ++h) {
    const auto x = static_cast<uint16_t>(h);
    const float a = float16_to_float(x), b = bfloat16_to_float(x);
    if (std::isnan(a)) EXPECT_EQ(x & 0x7C00, 0x7C00);
    else EXPECT_EQ(float_to_float16(a), x) << std::hex << h;
    if (std::isnan(b)) EXPECT_EQ(x & 0x7F80, 0x7F80);
    else EXPECT_EQ(float_to_bfloat16(b), x) << std::hex << h;
  }
  EXPECT_EQ(std::bit_cast<uint32_t>(float16_to_float(0x0001)), 0x33800000u);  // 2^-24, the least subnormal
  EXPECT_EQ(float16_to_float(0x7BFF), 65504.0f);
  EXPECT_EQ(bfloat16_to_float(0x3F81), 1.0078125f);
}

TEST(HalfFloats, TensorsWidenAndNarrow) {
  Tensor t;
  t.type = {DType::kFloat32, {3}};
  const float v[3] = {1.0f, -0.333333343f, 70000.0f};
  t.data.resize(sizeof v);
  std::memcpy(t.data.data(), v, sizeof v);
  const Tensor h = narrowed(t, DType::kFloat16);
  EXPECT_EQ(h.type.str(), "float16[3]");
  const Tensor w = widened(h);
  EXPECT_EQ(w.type.str(), "float32[3]");
  EXPECT_EQ(w.as<float>()[0], 1.0f);
  EXPECT_EQ(w.as<float>()[1], float16_to_float(0xb555));
  EXPECT_TRUE(std::isinf(w.as<float>()[2]));
  EXPECT_EQ(widened(t).data, t.data);  // float32 stays as it is
}

// A float16 tensor left in its file loads as float32: the file's 2 bytes per element read (and
// counted), widened, NaN refused as for a float32 one.
TEST(HalfFloats, StoredHalvesWidenAsTheyLoad) {
  const std::string file = ::testing::TempDir() + "pt_halves_" + std::to_string(::getpid()) + ".data";
  const uint16_t halves[4] = {0x3c00, 0xb555, 0x0001, 0x7e00};  // 1, -1/3 in float16, 2^-24, NaN
  std::FILE* f = std::fopen(file.c_str(), "wb");
  std::fwrite(halves, sizeof halves[0], 4, f);
  std::fclose(f);
  Tensor t;
  t.type = TensorType{DType::kFloat32, {3}};
  t.stored = std::make_shared<const StoredBytes>(StoredBytes{"m.onnx: initializer 'w'", file, 0, 6, DType::kFloat16});
  const int64_t before = stored_bytes_loaded();
  EXPECT_EQ(t.as<float>()[0], 1.0f);
  EXPECT_EQ(t.as<float>()[1], float16_to_float(0xb555));
  EXPECT_EQ(std::bit_cast<uint32_t>(t.as<float>()[2]), 0x33800000u);
  EXPECT_EQ(t.data.size(), 12u);
  EXPECT_EQ(stored_bytes_loaded() - before, 6);

  Tensor nan;
  nan.type = TensorType{DType::kFloat32, {4}};
  nan.stored = std::make_shared<const StoredBytes>(StoredBytes{"m.onnx: initializer 'w'", file, 0, 8, DType::kFloat16});
  try {
    nan.load();
    ADD_FAILURE() << "a NaN loaded";
  } catch (const UserError& e) {
    EXPECT_EQ(std::string(e.what()), "m.onnx: initializer 'w': holds NaN (element 3 of float32[4]); export the model "
                                     "again from finite weights");
  }
  std::remove(file.c_str());
}

}  // namespace
}  // namespace pt
