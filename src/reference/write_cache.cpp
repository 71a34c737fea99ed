// Reference KV-cache writer (contract §7): each row of src goes to its slot, copied or quantized to e4m3.
// Rows are written in token order, so a duplicate slot keeps the last row here (the GPU does not promise it).
#include <cmath>
#include <cstring>
#include <vector>

#include "core/backend.h"
#include "reference/scalar.h"

namespace msa::detail::reference {

namespace {

int64_t read_slot(const WriteCacheParams& p, int64_t i) {
  const int64_t at = i * p.slot_stride;
  return p.slots_i64 ? static_cast<const int64_t*>(p.slots)[at] : static_cast<const int32_t*>(p.slots)[at];
}

int elem_bytes(ScalarType t) {
  switch (t) {
    case ScalarType::kF32: return 4;
    case ScalarType::kF16: case ScalarType::kBF16: return 2;
    case ScalarType::kF8E4M3: return 1;
  }
  return 0;
}

// A row's per-slot scale: amax of its finite elements / 448, 1 where that is 0 (an all-zero row, whose
// scale no reader can tell from any other, must not be 0: block_scores multiplies the keys by it).
float row_scale(const std::vector<float>& row) {
  float amax = 0.f;
  for (float x : row)
    if (std::isfinite(x)) amax = std::fmax(amax, std::fabs(x));
  const float s = amax / 448.0f;
  return s > 0.f ? s : 1.f;
}

}  // namespace

void write_cache(const WriteCacheParams& p) {
  const int64_t capacity = p.num_pages * p.page_size;
  const bool copy = p.cache_dtype == p.src_dtype;
  const int eb = elem_bytes(p.src_dtype), cb = elem_bytes(p.cache_dtype);
  std::vector<float> row(static_cast<size_t>(p.dim));
  for (int64_t i = 0; i < p.num_tokens; ++i) {
    const int64_t slot = read_slot(p, i);
    if (slot < 0 || slot >= capacity) continue;  // past the cache: refused by the front door, skipped as on the GPU
    const int64_t page = slot / p.page_size, off = slot % p.page_size;
    for (int32_t h = 0; h < p.num_heads; ++h) {
      const int64_t s0 = i * p.src_stride_token + h * p.src_stride_head;
      const int64_t c0 = page * p.stride_page + h * p.stride_head + off * p.stride_token;
      if (copy) {
        std::memcpy(static_cast<char*>(p.cache) + c0 * cb, static_cast<const char*>(p.src) + s0 * eb,
                    static_cast<size_t>(p.dim) * eb);
        continue;
      }
      load_row(p.src, p.src_dtype, s0, p.dim, row.data());
      float scale = p.scale;
      if (p.slot_scale) {
        scale = row_scale(row);
        p.slot_scale[page * p.ss_stride_page + h * p.ss_stride_head + off * p.ss_stride_token] = scale;
      }
      uint8_t* out = static_cast<uint8_t*>(p.cache) + c0;
      for (int32_t d = 0; d < p.dim; ++d) out[d] = float_to_fp8e4m3_satfinite(row[d] / scale);
    }
  }
}

}  // namespace msa::detail::reference
