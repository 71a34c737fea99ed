// Scalar conversions of the element types the reference backend reads and writes.
// Loads are exact (every fp16/bf16/fp8 value is a float); stores round to nearest, ties to even,
// as the GPU's cvt.rn does and as torch / ml_dtypes do.
#pragma once

#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "core/params.h"

namespace msa::detail::reference {

inline uint32_t float_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

inline float bits_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline float bf16_to_float(uint16_t h) { return bits_float(uint32_t(h) << 16); }

inline uint16_t float_to_bf16(float f) {
  const uint32_t u = float_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x0040u);  // NaN stays a quiet NaN
  // Add just under half an ulp of bf16, plus one when the kept lsb is odd: the carry rounds half to even.
  return uint16_t((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

inline float fp16_to_float(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu;
  if (exp == 0x1f) return bits_float(sign | 0x7f800000u | (mant << 13));  // inf / NaN
  if (exp == 0) {  // zero or subnormal: mant * 2^-24, exact in float
    const float mag = std::ldexp(static_cast<float>(mant), -24);
    return sign ? -mag : mag;
  }
  return bits_float(sign | ((exp + 112u) << 23) | (mant << 13));  // rebias 15 -> 127
}

inline uint16_t float_to_fp16(float f) {
  const uint32_t u = float_bits(f);
  const uint16_t sign = uint16_t((u >> 16) & 0x8000u);
  uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return sign | 0x7e00u;  // NaN
  if (a >= 0x47800000u) return sign | 0x7c00u;  // >= 65536 (and inf): inf
  if (a < 0x38800000u) {
    // Below 2^-14, fp16 is fixed-point with step 2^-24, the float ulp of 0.5: adding 0.5 lets the
    // FPU round to that step (half to even), and the low mantissa bits are the fp16 subnormal
    // (0x400, the carry into the exponent, is the smallest normal and encodes correctly).
    return sign | uint16_t(float_bits(bits_float(a) + 0.5f) - float_bits(0.5f));
  }
  // Normal: rebias the exponent (127 -> 15, i.e. -112 << 23) and round away 13 mantissa bits, half to even.
  // 65520 and above carry into exponent 31 and become inf, as they should.
  a += 0xc8000fffu + ((a >> 13) & 1u);
  return sign | uint16_t(a >> 13);
}

// float8 e4m3fn: bias 7, no infinities, S.1111.111 is NaN, largest finite 448.
inline float fp8e4m3_to_float(uint8_t b) {
  static const std::array<float, 256> table = [] {
    std::array<float, 256> t{};
    for (int i = 0; i < 256; ++i) {
      const int exp = (i >> 3) & 0xf, mant = i & 7;
      float mag;
      if (exp == 0xf && mant == 7) mag = NAN;
      else if (exp == 0) mag = std::ldexp(static_cast<float>(mant), -9);  // subnormal: mant/8 * 2^-6
      else mag = std::ldexp(static_cast<float>(8 + mant), exp - 10);       // (1 + mant/8) * 2^(exp-7)
      t[i] = (i & 0x80) ? -mag : mag;
    }
    return t;
  }();
  return table[b];
}

inline uint8_t float_to_fp8e4m3(float f) {
  const uint32_t u = float_bits(f);
  const uint8_t sign = uint8_t((u >> 24) & 0x80u);
  const uint32_t a = u & 0x7fffffffu;
  if (a >= 0x7f800000u) return sign | 0x7fu;  // inf and NaN: NaN (the format has no inf)
  if (a < 0x3c800000u) {
    // Below 2^-6: fixed-point with step 2^-9; nearbyint rounds half to even in the default mode.
    return sign | uint8_t(std::nearbyint(bits_float(a) * 512.0f));
  }
  const uint32_t r = a + 0x7ffffu + ((a >> 20) & 1u);  // keep 3 mantissa bits, half to even
  const uint32_t code = (((r >> 23) - 120u) << 3) | ((r >> 20) & 7u);  // rebias 127 -> 7
  // Past 448 (rounded): NaN, as torch and ml_dtypes convert without saturation.
  return sign | uint8_t(code > 0x7eu ? 0x7fu : code);
}

// The KV-cache writer's conversion (cvt.rn.satfinite.e4m3x2's rule): round to nearest even, finite values
// past 448 in magnitude and infinities saturate to +-448, NaN becomes the positive NaN 0x7f.
inline uint8_t float_to_fp8e4m3_satfinite(float f) {
  if (std::isnan(f)) return 0x7fu;
  return float_to_fp8e4m3(std::fmin(std::fmax(f, -448.0f), 448.0f));
}

inline float load_scalar(const void* base, ScalarType t, int64_t i) {
  switch (t) {
    case ScalarType::kF32: return static_cast<const float*>(base)[i];
    case ScalarType::kF16: return fp16_to_float(static_cast<const uint16_t*>(base)[i]);
    case ScalarType::kBF16: return bf16_to_float(static_cast<const uint16_t*>(base)[i]);
    case ScalarType::kF8E4M3: return fp8e4m3_to_float(static_cast<const uint8_t*>(base)[i]);
  }
  return NAN;
}

inline void store_scalar(void* base, ScalarType t, int64_t i, float v) {
  switch (t) {
    case ScalarType::kF32: static_cast<float*>(base)[i] = v; return;
    case ScalarType::kF16: static_cast<uint16_t*>(base)[i] = float_to_fp16(v); return;
    case ScalarType::kBF16: static_cast<uint16_t*>(base)[i] = float_to_bf16(v); return;
    case ScalarType::kF8E4M3: static_cast<uint8_t*>(base)[i] = float_to_fp8e4m3(v); return;
  }
}

// n contiguous elements starting at element i of base, widened to float; out may be strided.
inline void load_row(const void* base, ScalarType t, int64_t i, int64_t n, float* out, int64_t out_stride = 1) {
  switch (t) {
    case ScalarType::kF32: {
      const float* p = static_cast<const float*>(base) + i;
      for (int64_t d = 0; d < n; ++d) out[d * out_stride] = p[d];
      return;
    }
    case ScalarType::kF16: {
      const uint16_t* p = static_cast<const uint16_t*>(base) + i;
      for (int64_t d = 0; d < n; ++d) out[d * out_stride] = fp16_to_float(p[d]);
      return;
    }
    case ScalarType::kBF16: {
      const uint16_t* p = static_cast<const uint16_t*>(base) + i;
      for (int64_t d = 0; d < n; ++d) out[d * out_stride] = bf16_to_float(p[d]);
      return;
    }
    case ScalarType::kF8E4M3: {
      const uint8_t* p = static_cast<const uint8_t*>(base) + i;
      for (int64_t d = 0; d < n; ++d) out[d * out_stride] = fp8e4m3_to_float(p[d]);
      return;
    }
  }
}

}  // namespace msa::detail::reference
