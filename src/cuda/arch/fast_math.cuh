// Single-instruction approximations on the special function unit (every architecture), for the online
// softmax. Not volatile: the compiler may schedule, merge or drop them like arithmetic.
#pragma once

namespace msa::detail::cuda::arch {

// 2^x (ex2.approx.ftz: relative error ~2^-22); 2^-inf = +0, which the masked softmax relies on.
__device__ __forceinline__ float exp2_approx(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// 1 / x and log2(x), one instruction each, for a softmax sum (x in [1, keys] when a key is visible):
// `1.f / x` compiles to a full division with a slow-path call, `__log2f` adds a denormal fix-up.
// rcp.approx.ftz: relative error <= 2^-23; lg2.approx.ftz: absolute error ~2^-22.
__device__ __forceinline__ float rcp_approx(float x) {
  float y;
  asm("rcp.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}
__device__ __forceinline__ float log2_approx(float x) {
  float y;
  asm("lg2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

}  // namespace msa::detail::cuda::arch
