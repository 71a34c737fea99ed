// float8 e4m3fn <-> float on the host, for the demo's fp8 K/V cache and its float64 check. Written from
// the format's definition (bias 7, 3 mantissa bits, no infinities, S.1111.111 NaN, largest finite 448),
// apart from src/reference, as tools/bf16.h is: the demo checks the library, not itself.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

namespace msa::cli {

inline constexpr float kFp8E4M3Max = 448.0f;

// The value of an e4m3fn code (exact in float).
inline float fp8e4m3_to_float(uint8_t code) {
  const int exp = (code >> 3) & 0xf, mant = code & 7;
  float mag;
  if (exp == 0xf && mant == 7) mag = NAN;
  else if (exp == 0) mag = std::ldexp(static_cast<float>(mant), -9);   // subnormal: mant / 8 * 2^-6
  else mag = std::ldexp(static_cast<float>(8 + mant), exp - 10);       // (1 + mant / 8) * 2^(exp - 7)
  return (code & 0x80) ? -mag : mag;
}

// The nearest e4m3fn code, ties to even; magnitudes past 448 saturate to 448 (quantization, not a cast).
inline uint8_t fp8e4m3_from_float(float f) {
  const uint8_t sign = std::signbit(f) ? 0x80 : 0;
  const float a = std::min(std::fabs(f), kFp8E4M3Max);
  if (a < 0x1p-6f) return sign | static_cast<uint8_t>(std::nearbyint(a * 512.0f));  // step 2^-9; 8 is 2^-6
  int e;
  const float m = std::frexp(a, &e);  // a = m * 2^e, m in [0.5, 1): the unbiased exponent is e - 1
  int exp = e - 1 + 7, mant = static_cast<int>(std::nearbyint((2.0f * m - 1.0f) * 8.0f));  // half to even
  if (mant == 8) ++exp, mant = 0;  // rounded up into the next binade (at most 448 by the clamp)
  return sign | static_cast<uint8_t>((exp << 3) | mant);
}

}  // namespace msa::cli
