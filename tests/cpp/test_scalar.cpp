// The reference backend's element conversions (src/reference/scalar.h) against the compiler's
// _Float16 and the independent encoders of test_util: loads exact, stores round half to even.
#include <cmath>
#include <cstring>

#include "reference/scalar.h"
#include "test_util.h"

namespace msa_test {
namespace {

namespace ref = msa::detail::reference;
using msa::detail::ScalarType;

float from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Floats over every exponent, plus the values where rounding decisions happen for 16- and 8-bit types.
std::vector<float> probe_floats() {
  std::vector<float> v;
  Rng rng(11);
  for (int i = 0; i < 200000; ++i) v.push_back(from_bits(static_cast<uint32_t>(rng.randint(0, 0xffffffffLL))));
  for (int i = 0; i < 200000; ++i) v.push_back(static_cast<float>(rng.normal() * std::pow(2.0, rng.randint(-30, 20))));
  for (double x : {0.0, -0.0, 1.0, 65504.0, 65519.0, 65520.0, 65536.0, 6.1035156e-05, 5.9604645e-08, 2.9802322e-08,
                   2.9802326e-08, 448.0, 464.0, 464.01, 479.9, 480.0, 1e6, 0.001953125, 0.0009765625, 0.00146484375,
                   3.0e38, 1.17549435e-38, 1e-45})
    for (double s : {1.0, -1.0}) v.push_back(static_cast<float>(x * s));
  v.push_back(INFINITY);
  v.push_back(-INFINITY);
  // Exact midpoints between neighbouring bf16 and fp16 values: ties must go to even.
  for (uint32_t m = 0; m < 64; ++m) v.push_back(from_bits(0x3f800000u | (m << 16) | 0x8000u));
  for (uint32_t m = 0; m < 64; ++m) v.push_back(from_bits(0x3f800000u | (m << 13) | 0x1000u));
  return v;
}

bool same(double a, double b) { return (std::isnan(a) && std::isnan(b)) || a == b; }

TEST(Scalar, Fp16LoadsEveryPattern) {
  for (uint32_t u = 0; u < 65536; ++u) {
    const uint16_t h = static_cast<uint16_t>(u);
    ASSERT_TRUE(same(ref::load_scalar(&h, ScalarType::kF16, 0), decode(DType::kF16, &h, 0))) << "bits " << u;
  }
}

TEST(Scalar, Fp16StoreRoundsToNearestEven) {
  for (float f : probe_floats()) {
    uint16_t got;
    ref::store_scalar(&got, ScalarType::kF16, 0, f);
    const uint16_t want = fp16_bits(f);
    if (std::isnan(f)) ASSERT_TRUE(std::isnan(decode(DType::kF16, &got, 0)));
    else ASSERT_EQ(got, want) << "value " << f;
  }
}

TEST(Scalar, Bf16LoadsAndStores) {
  for (uint32_t u = 0; u < 65536; ++u) {
    const uint16_t h = static_cast<uint16_t>(u);
    ASSERT_TRUE(same(ref::load_scalar(&h, ScalarType::kBF16, 0), decode(DType::kBF16, &h, 0))) << "bits " << u;
  }
  for (float f : probe_floats()) {
    uint16_t got;
    ref::store_scalar(&got, ScalarType::kBF16, 0, f);
    if (std::isnan(f)) ASSERT_TRUE(std::isnan(decode(DType::kBF16, &got, 0)));
    else ASSERT_EQ(got, bf16_bits(f)) << "value " << f;
  }
}

TEST(Scalar, Fp8E4M3LoadsAndStores) {
  for (uint32_t u = 0; u < 256; ++u) {
    const uint8_t b = static_cast<uint8_t>(u);
    ASSERT_TRUE(same(ref::load_scalar(&b, ScalarType::kF8E4M3, 0), fp8e4m3_value(b))) << "bits " << u;
  }
  EXPECT_EQ(fp8e4m3_value(0x38), 1.0);
  EXPECT_EQ(fp8e4m3_value(0x7e), 448.0);
  EXPECT_EQ(fp8e4m3_value(0x01), std::ldexp(1.0, -9));
  for (float f : probe_floats()) {
    uint8_t got;
    ref::store_scalar(&got, ScalarType::kF8E4M3, 0, f);
    const uint8_t want = fp8e4m3_bits(f);
    if (std::isnan(fp8e4m3_value(want))) ASSERT_TRUE(std::isnan(fp8e4m3_value(got))) << "value " << f;
    else ASSERT_EQ(got, want) << "value " << f;
  }
}

TEST(Scalar, Fp32RoundTripsAndRowLoads) {
  const float values[] = {1.5f, -0.0f, 3.0e38f, 1e-40f};
  float stored[4];
  for (int i = 0; i < 4; ++i) ref::store_scalar(stored, ScalarType::kF32, i, values[i]);
  float row[4 * 3];
  ref::load_row(stored, ScalarType::kF32, 0, 4, row, 3);  // strided destination
  for (int i = 0; i < 4; ++i) EXPECT_EQ(row[i * 3], values[i]);
}

}  // namespace
}  // namespace msa_test
