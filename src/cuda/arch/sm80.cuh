// sm_80 instructions of the warp-level kernels: cp.async (global -> shared, bypassing registers),
// ldmatrix and mma.sync m16n8k16 (bf16 / fp16 in, fp32 accumulate). CCCL has no wrapper for these.
// Shared-memory operands are 32-bit shared-window addresses (smem_addr).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "cuda/arch/memory.cuh"

namespace msa::detail::cuda::arch {

// ---- cp.async ---------------------------------------------------------------------------------------
// Each with a "memory" clobber: the compiler keeps C++ loads and stores of shared memory on their side
// of the copies and waits (ordering against the other inline PTX comes from volatile).

// 16 bytes global -> shared, bypassing L1 (.cg: each byte is read once per CTA). src_bytes = 0 reads
// nothing and writes zeros (invisible keys, padding rows).
__device__ __forceinline__ void cp_async_16(uint32_t smem, const void* gmem, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem), "l"(gmem), "r"(src_bytes) : "memory");
}
// The same with a predicate: fill = false writes zeros and reads nothing (gmem must still be a mapped
// address: callers pass the tensor's base). One SASS instruction with reg + immediate addressing on
// both sides, which the unrolled tile loads rely on.
__device__ __forceinline__ void cp_async_16_pred(uint32_t smem, const void* gmem, bool fill) {
  asm volatile(
      "{\n .reg .pred p;\n setp.eq.u32 p, %2, 0;\n cp.async.cg.shared.global [%0], [%1], 16, p;\n}\n" ::"r"(smem),
      "l"(gmem), "r"(static_cast<uint32_t>(fill))
      : "memory");
}
// 8 bytes through L1 (.ca; copies under 16 bytes cannot bypass it); src_bytes = 0 writes zeros.
__device__ __forceinline__ void cp_async_8(uint32_t smem, const void* gmem, int src_bytes) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 8, %2;\n" ::"r"(smem), "l"(gmem), "r"(src_bytes) : "memory");
}
// 4 bytes through L1 (.ca; 4-byte copies cannot bypass it); src_bytes = 0 writes zeros.
__device__ __forceinline__ void cp_async_4(uint32_t smem, const void* gmem, int src_bytes) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(smem), "l"(gmem), "r"(src_bytes) : "memory");
}

__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }

// Waits until at most N of this thread's committed groups are pending.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_all;\n" ::: "memory"); }
// wait_group takes an immediate; for a pipeline depth chosen at plan time (pending 0..3).
__device__ __forceinline__ void cp_async_wait_dyn(int pending) {
  switch (pending) {
    case 0: cp_async_wait<0>(); break;
    case 1: cp_async_wait<1>(); break;
    case 2: cp_async_wait<2>(); break;
    default: cp_async_wait<3>(); break;
  }
}

// ---- ldmatrix -----------------------------------------------------------------------------------------
// Four 8x8 b16 matrices; lane 8i + r gives the address of row r of matrix i.
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// ---- mma.sync -----------------------------------------------------------------------------------------
// c += a (16x16, row) * b (16x8, col), T = __nv_bfloat16 or __half; a holds 4 registers of packed pairs,
// b two.
#define MSA_MMA_M16N8K16(TYPE)                                                                                \
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32." TYPE "." TYPE                                         \
               ".f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"                       \
               : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])                                              \
               : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1))

template <typename T>
__device__ __forceinline__ void mma_m16n8k16(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                             uint32_t b0, uint32_t b1) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    MSA_MMA_M16N8K16("bf16");
  } else {
    static_assert(std::is_same_v<T, __half>);
    MSA_MMA_M16N8K16("f16");
  }
}
template <typename T>
__device__ __forceinline__ void mma_m16n8k16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  mma_m16n8k16<T>(c, a[0], a[1], a[2], a[3], b0, b1);
}
#undef MSA_MMA_M16N8K16

// Two floats -> one bf16x2 / f16x2 word, low half first (an mma A operand or an output pair).
template <typename T>
__device__ __forceinline__ uint32_t pack2(float lo, float hi) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&v);
  } else {
    static_assert(std::is_same_v<T, __half>);
    const __half2 v = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&v);
  }
}

}  // namespace msa::detail::cuda::arch
