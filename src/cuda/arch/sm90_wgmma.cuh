// Warpgroup MMA (wgmma, sm_90a): shared-memory matrix descriptors, the fence / commit / wait of the
// asynchronous window, and the forms used (fp32 accumulators). CCCL has no wrapper for wgmma, so this
// is inline PTX.
//
//   wgmma_m64n128k16_ss: A and B in shared memory, both K-major        (S = Q K^T: prefill, indexer)
//   wgmma_m64n128k16_rs: A in registers, B in shared memory, MN-major  (O += P V: prefill)
//   wgmma_m64n128k32_ss_e4m3: fp8 e4m3 A and B in shared memory, K-major (fp8 indexer scores; 32 bytes
//                        of K per instruction as for k16 in 16 bits, at twice the 16-bit rate)
//
// Operands in shared memory use the 128-byte swizzle that TMA writes (CU_TENSOR_MAP_SWIZZLE_128B): rows
// of 128 B (64 elements), 16-byte chunk c of row r stored at chunk c ^ (r % 8), atoms of 8 rows =
// 1024 B, every tile 1024-byte aligned (descriptor base offset 0).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

namespace msa::detail::cuda::arch {

// Matrix descriptor (PTX ISA "Matrix Descriptor Format"): start address >> 4 in bits 0-13, leading
// byte offset >> 4 in bits 16-29, stride byte offset >> 4 in bits 32-45, swizzle mode in bits 62-63
// (1 = 128B).
//  K-major, 128B swizzle: SBO = 1024 (next 8 rows); LBO unused (1). Moving 16 elements along K inside
//    the 64-element atom adds 32 B to the start address (the swizzle is applied to the address bits,
//    which is why tiles are 1024-aligned).
//  MN-major, 128B swizzle: LBO = distance between 64-element atoms along MN, SBO = 1024 (next 8 rows
//    along K).
// Kept as two 32-bit words for a loop of k-steps over one tile: the low word (start address, LBO) is
// formed once per tile and a k-step adds its byte offset >> 4 to it, as CUTLASS's descriptor iterator
// does; the high word (SBO, swizzle) is a constant. The start-address field cannot carry into the LBO
// field: shared addresses stay below 228 KiB, so (address + offset) >> 4 < 2^14. Rebuilt whole per
// k-step, each of the two 64-bit descriptors of an HGMMA cost ~6 instructions (AND, shift, OR, moves to
// uniform registers: ~13 per HGMMA in the KV-major prefill kernel's SASS, ~100 per consumer warp and job
// of its ~1250 under ncu).
__device__ __forceinline__ uint32_t smem_desc_lo(uint32_t smem_addr, uint32_t lbo_bytes) {
  return ((smem_addr & 0x3FFFF) >> 4) | (((lbo_bytes >> 4) & 0x3FFF) << 16);
}
__device__ __forceinline__ constexpr uint32_t smem_desc_hi(uint32_t sbo_bytes) {
  return ((sbo_bytes >> 4) & 0x3FFF) | (1u << 30);
}
__device__ __forceinline__ uint64_t smem_desc_at(uint32_t lo, uint32_t hi, uint32_t offset_bytes) {
  return (static_cast<uint64_t>(hi) << 32) | (lo + (offset_bytes >> 4));
}
// The whole descriptor of a K-major, 128B-swizzled tile at addr (LBO 16, SBO 1024), for code that adds
// its k-step offsets (>> 4) to the 64-bit value.
__device__ __forceinline__ uint64_t smem_desc_kmajor_sw128(uint32_t addr) {
  return smem_desc_at(smem_desc_lo(addr, 16), smem_desc_hi(1024), 0);
}

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
// Waits until at most N of the warpgroup's committed wgmma groups are pending.
template <int N>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}

// Keeps the compiler from moving reads or writes of accumulator / operand registers across a wgmma
// fence or wait (the hardware reads and writes them asynchronously).
template <int N>
__device__ __forceinline__ void fence_regs(float (&r)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(r[i])::"memory");
}
template <int N>
__device__ __forceinline__ void fence_regs(uint32_t (&r)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+r"(r[i])::"memory");
}

#define MSA_WGMMA_D64                                                                                        \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, "  \
  "%22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, "     \
  "%42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, "     \
  "%62, %63}"

#define MSA_WGMMA_D64_OPERANDS(d)                                                                             \
  "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), \
      "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]),  \
      "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), \
      "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), \
      "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), \
      "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), \
      "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), \
      "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])

// Accumulator layout of m64n128 (per warpgroup; warp w owns rows 16w..16w+15; lane = 4g + t):
//   d[4j + 0], d[4j + 1]: row 16w + g,     columns 8j + 2t, 8j + 2t + 1   (j = 0..15)
//   d[4j + 2], d[4j + 3]: row 16w + g + 8, the same columns
// The A fragment of k-step kk (columns 16kk..16kk+15) is then {d[8kk..8kk+1], d[8kk+2..+3],
// d[8kk+4..+5], d[8kk+6..+7]} packed in pairs: rows g / g+8 at k 2t, then at k 8+2t.

// D (+)= A B, T = __nv_bfloat16 or __half, A and B in shared memory, both K-major. accumulate = false
// overwrites D.
template <typename T>
__device__ __forceinline__ void wgmma_m64n128k16_ss(float (&d)[64], uint64_t desc_a, uint64_t desc_b, bool accumulate) {
  const uint32_t scale_d = accumulate ? 1u : 0u;
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 " MSA_WGMMA_D64 ", %64, %65, p, 1, 1, 0, 0;\n}\n"
        : MSA_WGMMA_D64_OPERANDS(d)
        : "l"(desc_a), "l"(desc_b), "r"(scale_d));
  } else {
    static_assert(std::is_same_v<T, __half>);
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 " MSA_WGMMA_D64 ", %64, %65, p, 1, 1, 0, 0;\n}\n"
        : MSA_WGMMA_D64_OPERANDS(d)
        : "l"(desc_a), "l"(desc_b), "r"(scale_d));
  }
}

// D += A B with A (4 registers of packed pairs, layout above) and B in shared memory, MN-major
// (imm-trans-b = 1).
template <typename T>
__device__ __forceinline__ void wgmma_m64n128k16_rs(float (&d)[64], uint32_t a0, uint32_t a1, uint32_t a2,
                                                    uint32_t a3, uint64_t desc_b) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    asm volatile(
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 " MSA_WGMMA_D64
        ", {%64, %65, %66, %67}, %68, 1, 1, 1, 1;\n"
        : MSA_WGMMA_D64_OPERANDS(d)
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(desc_b));
  } else {
    static_assert(std::is_same_v<T, __half>);
    asm volatile(
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 " MSA_WGMMA_D64
        ", {%64, %65, %66, %67}, %68, 1, 1, 1, 1;\n"
        : MSA_WGMMA_D64_OPERANDS(d)
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(desc_b));
  }
}

// D (+)= A B over 32 e4m3 elements of K, A and B in shared memory, both K-major (the only layout fp8
// wgmma has). Same descriptors and accumulator layout as wgmma_m64n128k16_ss: a K-step of 32 bytes.
__device__ __forceinline__ void wgmma_m64n128k32_ss_e4m3(float (&d)[64], uint64_t desc_a, uint64_t desc_b,
                                                         bool accumulate) {
  const uint32_t scale_d = accumulate ? 1u : 0u;
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3 " MSA_WGMMA_D64 ", %64, %65, p, 1, 1;\n}\n"
      : MSA_WGMMA_D64_OPERANDS(d)
      : "l"(desc_a), "l"(desc_b), "r"(scale_d));
}

#undef MSA_WGMMA_D64
#undef MSA_WGMMA_D64_OPERANDS

}  // namespace msa::detail::cuda::arch
