// fp8 e4m3 (OCP "e4m3fn": no infinities, 0x7F / 0xFF = NaN) -> fp16 / bf16, exactly. The kernels that
// read an fp8 K/V cache convert each tile in shared memory and keep their 16-bit MMAs, so an fp8 cache
// is as accurate as a 16-bit one against float64 over the dequantized values.
//
// e4m3 -> fp16 is one instruction per pair on sm_89+ (cvt.rn.f16x2.e4m3x2: F2FP.F16.E4M3.UNPACK_B) and
// exact: every e4m3 value, subnormals and NaN included, is an fp16 value. bf16 has no such instruction:
// the pair goes through fp16 and fp32 (two HADD2.F32 and one F2FP.BF16.F32.PACK_AB, exact as well), so
// V tiles, whose values only meet P, are converted to fp16 whatever q's type (P V runs on fp16 MMAs) and
// only K tiles take q's type. On sm_80 / sm_86 cuda_fp8.h's conversion is a short integer sequence.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>
#include <type_traits>

namespace msa::detail::cuda::arch {

// Two e4m3 bytes (the low 16 bits of x, byte 0 first) -> an f16x2 word (byte 0 in the low half).
__device__ __forceinline__ uint32_t e4m3x2_to_f16x2(uint32_t x) {
  const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(x & 0xFFFFu), __NV_E4M3);
  return static_cast<uint32_t>(h.x) | (static_cast<uint32_t>(h.y) << 16);
}

// Two e4m3 bytes -> a packed pair of T (fp16, or bf16 through fp32).
template <typename T>
__device__ __forceinline__ uint32_t e4m3x2_to(uint32_t x) {
  const uint32_t h = e4m3x2_to_f16x2(x);
  if constexpr (std::is_same_v<T, __half>) {
    return h;
  } else {
    static_assert(std::is_same_v<T, __nv_bfloat16>, "fp16 or bf16");
    const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&h));
    const __nv_bfloat162 b = __float22bfloat162_rn(f);
    return *reinterpret_cast<const uint32_t*>(&b);
  }
}

// Sixteen e4m3 bytes -> sixteen values of T: out0 holds elements 0-7, out1 elements 8-15.
template <typename T>
__device__ __forceinline__ void e4m3x16_to(const uint4& in, uint4& out0, uint4& out1) {
  out0 = make_uint4(e4m3x2_to<T>(in.x), e4m3x2_to<T>(in.x >> 16), e4m3x2_to<T>(in.y), e4m3x2_to<T>(in.y >> 16));
  out1 = make_uint4(e4m3x2_to<T>(in.z), e4m3x2_to<T>(in.z >> 16), e4m3x2_to<T>(in.w), e4m3x2_to<T>(in.w >> 16));
}

}  // namespace msa::detail::cuda::arch
