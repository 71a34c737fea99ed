// TMA access to the paged index-K cache: whether a cache can be read by TMA boxes, and its tensor map.
#pragma once

#include <cuda.h>

#include "core/params.h"

namespace msa::detail::cuda::indexer {

// True when TMA can load p's index keys (and, for fp8, bulk-copy their per-token scales): the page size
// is a multiple of 128 or divides it with at least 16 keys per page (a 128-key block is then 1..8 boxes
// of min(page, 128) rows, each starting on a 1024-byte swizzle atom), every byte stride is a multiple of
// 16 and, for fp8, the scales of a page are contiguous and 16-byte aligned.
bool keys_tma_ok(const BlockScoresParams& p);

// Map over the cache [num_pages, Hk, page, row] with 128-byte rows as 64 16-bit elements (an fp8 row of
// 128 dims is 64 pseudo-elements; a bf16 / fp16 row is two boxes at element 0 and 64) and boxes of
// 64 x min(page, 128) x 1 x 1 with the 128-byte swizzle. False when the driver rejects it (the caller
// then takes a kernel without TMA).
bool encode_keys_map(CUtensorMap* map, const BlockScoresParams& p);

}  // namespace msa::detail::cuda::indexer
