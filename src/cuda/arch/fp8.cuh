// fp8 e4m3 (OCP "e4m3fn": no infinities, 0x7F / 0xFF = NaN) -> fp16 / bf16. Every e4m3 value is an fp16
// value, so the conversion is exact; kernels that read fp8 keys or K/V tiles convert them and keep their
// 16-bit MMAs, as accurate as a 16-bit cache against float64 over the dequantized values.
//
// sm_89+ has the instruction (cvt.rn.f16x2.e4m3x2, one per pair: F2FP.F16.E4M3.UNPACK_B; on the H200 the bit
// move below measured slower in the fp8 decode and prefill kernels, docs/decode.md). Elsewhere the
// bits are moved under fp16's (a PRMT, a shift and a LOP3 per pair), which reads value * 2^-8 (the exponent
// biases differ by 8, subnormals included), and the NaN encoding, which would read as 480 * 2^-8, is made an
// fp16 NaN (two more per word: an fp16 compare and a LOP3; an integer compare of the halves took six; a caller
// of many words may test their maximum instead, below): e4m3x4_to_f16x4_raw returns that, and
// e4m3_f16_unscale() is the factor a caller folds into a later scale.
// bf16 has no such instruction: a bf16 pair goes through fp32 (two HADD2.F32 and one F2FP.BF16.F32.PACK_AB
// on sm_90).
//
// The other direction (fp32 -> e4m3, round to nearest even, saturating to +-448) quantizes operands of
// the fp8 MMAs: f32x4_to_e4m3x4 is two cvt.rn.satfinite.e4m3x2.f32 (sm_89+; F2FP.SATFINITE.E4M3.F32.PACK_AB).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "cuda/arch/sm80.cuh"

#include <cstdint>
#include <type_traits>

namespace msa::detail::cuda::arch {

// The factor e4m3x4_to_f16x4_raw's values are short of the e4m3 values: 1 on sm_89+, 2^8 before.
__device__ __forceinline__ float e4m3_f16_unscale() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  return 1.f;
#else
  return 256.f;
#endif
}

// PRMT with the selector as PTX defines it: a nibble's bit 3 fills the target byte with the selected byte's sign
// bit (the contract of __byte_perm covers only bits 0-2).
template <uint32_t kSelector>
__device__ __forceinline__ uint32_t prmt(uint32_t x, uint32_t y) {
  uint32_t d;
  asm("prmt.b32 %0, %1, %2, %3;" : "=r"(d) : "r"(x), "r"(y), "n"(kSelector));
  return d;
}

// Below sm_89 code: bytes kI and kJ of the pair {y, x} (0-3: x's, 4-7: y's) -> an f16x2 word (kI's value in the
// low half) of value * 2^-8, without the NaN step: the NaN encoding (low 7 bits 0x7F) reads 0x3F80 (480 * 2^-8),
// above every finite value (448 -> 0x3F00). One PRMT puts each byte in the low byte of its half and its sign bit
// in every bit of the high byte; a shift by 7 then brings the byte's low 7 bits under fp16's exponent and
// mantissa and the sign copy to bit 15, and one AND clears the rest (three instructions a pair: moving the byte
// and its sign separately took four).
template <uint32_t kI, uint32_t kJ>
__device__ __forceinline__ uint32_t e4m3x2_to_f16x2_unchecked(uint32_t x, uint32_t y) {
  static_assert(kI < 8 && kJ < 8, "byte indices of the pair {y, x}");
  constexpr uint32_t kSelector = ((kJ | 8u) << 12) | (kJ << 8) | ((kI | 8u) << 4) | kI;
  return (prmt<kSelector>(x, y) << 7) & 0xBF80BF80u;
}

// The NaN step of an f16x2 word of the unchecked conversion (below sm_89 code): one fp16 compare of |x| above
// 1.8125 finds the NaN encoding (HSET2), one LOP3 sets its exponent to all ones, an fp16 NaN.
__device__ __forceinline__ uint32_t e4m3_raw_nan_fix(uint32_t h) {
  const __half2 nan_above = __half2(__ushort_as_half(0x3F40), __ushort_as_half(0x3F40));  // 1.8125
  return h | (__hgt2_mask(__habs2(*reinterpret_cast<const __half2*>(&h)), nan_above) & 0x7C007C00u);
}

// A caller that widens many words below sm_89 code may skip the per-word NaN step: it keeps the largest magnitude
// of its words (e4m3_raw_abs_max: one HMNMX2 per word, against two instructions) and applies e4m3_raw_nan_fix to
// them only when e4m3_raw_has_nan(that maximum), i.e. when one of them holds the NaN encoding. On sm_89+ the
// conversion instruction makes NaN itself: no maximum is kept and the test is false.
__device__ __forceinline__ uint32_t e4m3_raw_abs_max(uint32_t acc, uint32_t h) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  (void)h;
  return acc;
#else
  const __half2 m = __hmax2(*reinterpret_cast<const __half2*>(&acc), __habs2(*reinterpret_cast<const __half2*>(&h)));
  return *reinterpret_cast<const uint32_t*>(&m);
#endif
}
__device__ __forceinline__ bool e4m3_raw_has_nan(uint32_t acc) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  (void)acc;
  return false;
#else
  return (acc & 0x7FFFu) > 0x3F40u || (acc >> 16) > 0x3F40u;  // non-negative halves order as their bits
#endif
}

// Four e4m3 bytes (lowest first) -> two f16x2 words, {bytes 0,1} and {bytes 2,3}, each value the e4m3
// value divided by e4m3_f16_unscale(); below sm_89 code without the NaN step (see e4m3_raw_abs_max).
__device__ __forceinline__ uint2 e4m3x4_to_f16x4_unchecked(uint32_t w) {
  uint2 r;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  asm("{\n .reg .b16 lo, hi;\n mov.b32 {lo, hi}, %2;\n cvt.rn.f16x2.e4m3x2 %0, lo;\n cvt.rn.f16x2.e4m3x2 %1, hi;\n}"
      : "=r"(r.x), "=r"(r.y)
      : "r"(w));
#else
  r.x = e4m3x2_to_f16x2_unchecked<0, 1>(w, 0u);
  r.y = e4m3x2_to_f16x2_unchecked<2, 3>(w, 0u);
#endif
  return r;
}

// The same with the NaN encoding made an fp16 NaN in every word.
__device__ __forceinline__ uint2 e4m3x4_to_f16x4_raw(uint32_t w) {
  uint2 r = e4m3x4_to_f16x4_unchecked(w);
#if !(defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890)
  r.x = e4m3_raw_nan_fix(r.x);
  r.y = e4m3_raw_nan_fix(r.y);
#endif
  return r;
}

// An f16x2 word of e4m3x4_to_f16x4_raw -> the exact values as a packed pair of T.
template <typename T>
__device__ __forceinline__ uint32_t f16x2_raw_to(uint32_t h) {
  if constexpr (std::is_same_v<T, __half>) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
    return h;
#else
    const __half2 v = __hmul2(*reinterpret_cast<const __half2*>(&h), __half2(__ushort_as_half(0x5C00), __ushort_as_half(0x5C00)));
    return *reinterpret_cast<const uint32_t*>(&v);  // * 2^8: exact
#endif
  } else {
    static_assert(std::is_same_v<T, __nv_bfloat16>, "fp16 or bf16");
    float2 f = __half22float2(*reinterpret_cast<const __half2*>(&h));
    const float u = e4m3_f16_unscale();
    f.x *= u, f.y *= u;  // folded away on sm_89+ (u = 1)
    const __nv_bfloat162 b = __float22bfloat162_rn(f);
    return *reinterpret_cast<const uint32_t*>(&b);
  }
}

// An f16x2 word of e4m3x4_to_f16x4_raw -> its values as they are (the e4m3 values / e4m3_f16_unscale(), exact in
// either type) as a packed pair of T, for a caller that folds e4m3_f16_unscale() into its scales: below sm_89 code
// that saves f16x2_raw_to's multiply (one HMUL2, or two FMUL for bf16) per pair.
template <typename T>
__device__ __forceinline__ uint32_t f16x2_raw_as(uint32_t h) {
  if constexpr (std::is_same_v<T, __half>) {
    return h;
  } else {
    static_assert(std::is_same_v<T, __nv_bfloat16>, "fp16 or bf16");
    const __nv_bfloat162 b = __float22bfloat162_rn(__half22float2(*reinterpret_cast<const __half2*>(&h)));
    return *reinterpret_cast<const uint32_t*>(&b);
  }
}
template <typename T>
__device__ __forceinline__ uint4 f16x8_raw_as(const uint4& h) {
  return make_uint4(f16x2_raw_as<T>(h.x), f16x2_raw_as<T>(h.y), f16x2_raw_as<T>(h.z), f16x2_raw_as<T>(h.w));
}

// Sixteen e4m3 bytes -> the eight f16x2 words of e4m3x4_to_f16x4_unchecked (elements 0-7 in out0, 8-15 in out1),
// and the caller's side of the tile-wide NaN check (e4m3_raw_abs_max) over such words.
__device__ __forceinline__ void e4m3x16_to_f16_unchecked(const uint4& in, uint4& out0, uint4& out1) {
  const uint2 a = e4m3x4_to_f16x4_unchecked(in.x), b = e4m3x4_to_f16x4_unchecked(in.y);
  const uint2 c = e4m3x4_to_f16x4_unchecked(in.z), d = e4m3x4_to_f16x4_unchecked(in.w);
  out0 = make_uint4(a.x, a.y, b.x, b.y);
  out1 = make_uint4(c.x, c.y, d.x, d.y);
}
__device__ __forceinline__ uint32_t e4m3_raw_abs_max(uint32_t acc, const uint4& h) {
  return e4m3_raw_abs_max(e4m3_raw_abs_max(e4m3_raw_abs_max(e4m3_raw_abs_max(acc, h.x), h.y), h.z), h.w);
}
__device__ __forceinline__ uint4 e4m3_raw_nan_fix(const uint4& h) {
  return make_uint4(e4m3_raw_nan_fix(h.x), e4m3_raw_nan_fix(h.y), e4m3_raw_nan_fix(h.z), e4m3_raw_nan_fix(h.w));
}

// Sixteen e4m3 bytes -> sixteen values of T, exactly: out0 holds elements 0-7, out1 elements 8-15.
template <typename T>
__device__ __forceinline__ void e4m3x16_to(const uint4& in, uint4& out0, uint4& out1) {
  const uint2 a = e4m3x4_to_f16x4_raw(in.x), b = e4m3x4_to_f16x4_raw(in.y);
  const uint2 c = e4m3x4_to_f16x4_raw(in.z), d = e4m3x4_to_f16x4_raw(in.w);
  out0 = make_uint4(f16x2_raw_to<T>(a.x), f16x2_raw_to<T>(a.y), f16x2_raw_to<T>(b.x), f16x2_raw_to<T>(b.y));
  out1 = make_uint4(f16x2_raw_to<T>(c.x), f16x2_raw_to<T>(c.y), f16x2_raw_to<T>(d.x), f16x2_raw_to<T>(d.y));
}

// Four floats -> four e4m3 bytes, a lowest: rounded to nearest even, magnitudes above 448 saturated to
// 448, NaN kept NaN. sm_89+ only (there is no e4m3 MMA before).
__device__ __forceinline__ uint32_t f32x4_to_e4m3x4(float a, float b, float c, float d) {
  uint32_t r = 0;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  // cvt puts its first source in the high byte of the pair.
  asm("{\n .reg .b16 lo, hi;\n cvt.rn.satfinite.e4m3x2.f32 lo, %2, %1;\n cvt.rn.satfinite.e4m3x2.f32 hi, %4, %3;\n"
      " mov.b32 %0, {lo, hi};\n}"
      : "=r"(r)
      : "f"(a), "f"(b), "f"(c), "f"(d));
#else
  (void)a, (void)b, (void)c, (void)d;
  __trap();
#endif
  return r;
}

// ---- 16-bit rows as fp16 operands of the MMAs that meet fp8 values -----------------------------------
// e4m3 -> fp16 is one instruction, e4m3 -> bf16 four (above), so a kernel that meets fp8 K with bf16 q may
// instead bring each q row into fp16 with a power-of-two scale: amax * 2^e lands in [2^14, 2^15), so a bf16
// row converts without overflow or loss of its 8 significant bits (elements below amax * 2^-28 become fp16
// subnormals, a relative effect under 2^-20 on the row's dot products); the products are then unscaled by
// 2^-e in fp32. fp16_row_exponent returns e in [-126, 126], so that 2^e and 2^-e are normal floats.
__device__ __forceinline__ int fp16_row_exponent(float amax) {
  const int biased = static_cast<int>((__float_as_uint(amax) >> 23) & 0xFF);
  return min(max(141 - biased, -126), 126);
}
__device__ __forceinline__ float exp2_int(int e) { return __uint_as_float(static_cast<uint32_t>(127 + e) << 23); }

// A running maximum of |values| over bf16x2 words, kept as two bf16 bit patterns: a non-negative bf16's bits order
// as its value (NaN above inf), so the maximum is an unsigned 16-bit one (chained, one VIMNMX3.U16x2 takes two
// words). bf16x2_max_value: the larger half as a float.
__device__ __forceinline__ uint32_t bf16x2_abs_max(uint32_t acc, uint32_t w) { return __vmaxu2(acc, w & 0x7FFF7FFFu); }
__device__ __forceinline__ float bf16x2_max_value(uint32_t acc) {
  return __uint_as_float(max(acc & 0xFFFFu, acc >> 16) << 16);
}

template <typename T>
__device__ __forceinline__ float2 to_float2(uint32_t w) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    return __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&w));
  } else {
    return __half22float2(*reinterpret_cast<const __half2*>(&w));
  }
}

__device__ __forceinline__ float amax_of(uint32_t w, bool bf16) {
  const float2 f = bf16 ? to_float2<__nv_bfloat16>(w) : to_float2<__half>(w);
  return fmaxf(fabsf(f.x), fabsf(f.y));
}

// Rescales 8 elements (one 16-byte chunk of T) by `scale` into fp16.
template <typename T>
__device__ __forceinline__ uint4 chunk_to_scaled_f16(uint4 v, float scale) {
  uint4 r;
  float2 f;
  f = to_float2<T>(v.x), r.x = pack2<__half>(f.x * scale, f.y * scale);
  f = to_float2<T>(v.y), r.y = pack2<__half>(f.x * scale, f.y * scale);
  f = to_float2<T>(v.z), r.z = pack2<__half>(f.x * scale, f.y * scale);
  f = to_float2<T>(v.w), r.w = pack2<__half>(f.x * scale, f.y * scale);
  return r;
}

// A bf16x2 word times `scale` into fp16x2: the bf16 halves widen to fp32 by a shift and a mask (__bfloat1622float2
// takes a PRMT more for the high half), then two FMULs and one F2FP.F16.F32.PACK_AB (round to nearest).
__device__ __forceinline__ uint32_t bf16x2_to_scaled_f16x2(uint32_t w, float scale) {
  return pack2<__half>(__uint_as_float(w << 16) * scale, __uint_as_float(w & 0xFFFF0000u) * scale);
}

template <typename T>
__device__ __forceinline__ float chunk_amax(uint4 v) {
  const bool bf16 = std::is_same_v<T, __nv_bfloat16>;
  return fmaxf(fmaxf(amax_of(v.x, bf16), amax_of(v.y, bf16)), fmaxf(amax_of(v.z, bf16), amax_of(v.w, bf16)));
}

}  // namespace msa::detail::cuda::arch
