// TMA tensor maps of the paged index-K cache (see key_map.h).
#include "cuda/indexer/key_map.h"

#include <cstdint>

#include "cuda/indexer/config.h"
#include "cuda/runtime/tensor_map.h"
#include "msa/error.h"

namespace msa::detail::cuda::indexer {

namespace {

int elem_bytes(ScalarType t) { return t == ScalarType::kF8E4M3 ? 1 : 2; }

bool aligned16(const void* ptr) { return (reinterpret_cast<uintptr_t>(ptr) & 15u) == 0; }

}  // namespace

bool keys_tma_ok(const BlockScoresParams& p) {
  const int P = p.k.page_size;
  const bool page_ok = P > 0 && (P % kBlock == 0 || (kBlock % P == 0 && P >= 16));
  if (!page_ok || p.head_dim != kHeadDim || p.pages.num_pages <= 0 || !aligned16(p.k.data)) return false;
  const int64_t eb = elem_bytes(p.k_dtype);
  for (const int64_t stride : {p.k.stride_token, p.k.stride_head, p.k.stride_page})
    if ((stride * eb) % 16 != 0) return false;
  if (p.k_dtype == ScalarType::kF8E4M3) {
    // One bulk copy per box of rows: the rows' scales contiguous, each copy's start 16-byte aligned.
    if (p.ks_stride_token != 1 || !aligned16(p.k_scale) || p.ks_stride_page % 4 != 0) return false;
    if (p.k.num_heads > 1 && p.ks_stride_head % 4 != 0) return false;
  }
  return true;
}

bool encode_keys_map(CUtensorMap* map, const BlockScoresParams& p) {
  const uint64_t eb = static_cast<uint64_t>(elem_bytes(p.k_dtype));
  const uint64_t dims[4] = {kHeadDim * eb / 2, static_cast<uint64_t>(p.k.page_size),
                            static_cast<uint64_t>(p.k.num_heads), static_cast<uint64_t>(p.pages.num_pages)};
  const uint64_t strides[3] = {static_cast<uint64_t>(p.k.stride_token) * eb,
                               static_cast<uint64_t>(p.k.stride_head) * eb,
                               static_cast<uint64_t>(p.k.stride_page) * eb};
  const uint32_t box[4] = {64, static_cast<uint32_t>(p.k.page_size < kBlock ? p.k.page_size : kBlock), 1, 1};
  // fp8 rows travel as 16-bit pseudo-elements: TMA only moves bytes (zero fill is zero either way).
  const ScalarType t = p.k_dtype == ScalarType::kBF16 ? ScalarType::kBF16 : ScalarType::kF16;
  try {
    encode_tensor_map(map, t, 4, p.k.data, dims, strides, box, "index-K");
  } catch (const Error&) {
    return false;
  }
  return true;
}

}  // namespace msa::detail::cuda::indexer
