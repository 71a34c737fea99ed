// bfloat16 <-> float on the host, for the demo's synthetic data and for reading outputs back.
// bf16 is the upper half of an IEEE float32, so conversion is a shift plus rounding.
#pragma once

#include <bit>
#include <cstdint>

namespace msa::cli {

// Round to nearest, ties to even (what torch and the GPU's cvt.rn.bf16.f32 do). NaN stays a
// (quiet) NaN: adding the rounding bias could otherwise carry a NaN payload into +-inf.
inline uint16_t bf16_from_float(float f) {
  const uint32_t u = std::bit_cast<uint32_t>(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x0040u);
  const uint32_t lsb = (u >> 16) & 1u;
  return static_cast<uint16_t>((u + 0x7fffu + lsb) >> 16);
}

inline float bf16_to_float(uint16_t b) { return std::bit_cast<float>(static_cast<uint32_t>(b) << 16); }

// All ones: a NaN. Outputs are pre-filled with it so that a row the backend never writes fails the check.
inline constexpr uint16_t kBf16NaN = 0xffffu;

}  // namespace msa::cli
