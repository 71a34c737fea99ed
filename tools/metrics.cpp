#include "metrics.h"

#include <algorithm>
#include <set>

namespace msa::cli {

PhaseWork effective_flops(const Workload& w) {
  const AttentionConfig& c = w.cfg;
  double pairs = 0.0;  // per KV head; every query head of its group attends the same keys
  for (int64_t t = 0; t < w.total_q; ++t) {
    const int64_t kv_len = w.kv_lens[w.request_of(t)], pos = w.position_of(t);
    for (int g = 0; g < c.num_kv_heads; ++g)
      for (int32_t blk : w.selected_blocks(t, g)) {
        const int64_t end = std::min<int64_t>({int64_t(blk + 1) * c.block_size, kv_len, pos + 1});
        pairs += static_cast<double>(std::max<int64_t>(0, end - int64_t(blk) * c.block_size));
      }
  }
  PhaseWork work;
  work.attention = 4.0 * c.head_dim * c.group_size() * pairs;
  if (w.indexer) {
    double visible = 0.0;  // (token, key) pairs the block scores read
    for (int64_t t = 0; t < w.total_q; ++t)
      visible += static_cast<double>(std::min<int64_t>(w.kv_lens[w.request_of(t)], w.position_of(t) + 1));
    work.indexer = 2.0 * kIndexHeadDim * c.num_kv_heads * visible;
  }
  return work;
}

PhaseWork effective_bytes(const Workload& w) {
  const AttentionConfig& c = w.cfg;
  constexpr double kElemBytes = 2.0;  // bf16 q, o and index tensors
  const double kv_elem_bytes = w.k.elem_bytes();
  double keys = 0.0;
  for (int64_t b = 0; b < w.batch(); ++b) {
    const int64_t kv_len = w.kv_lens[b];
    for (int g = 0; g < c.num_kv_heads; ++g) {
      std::set<int32_t> blocks;
      for (int64_t t = w.qo_indptr[b]; t < w.qo_indptr[b + 1]; ++t)
        for (int32_t blk : w.selected_blocks(t, g)) blocks.insert(blk);
      for (int32_t blk : blocks)
        keys += static_cast<double>(std::min<int64_t>(c.block_size, kv_len - int64_t(blk) * c.block_size));
    }
  }
  const double kv_bytes = keys * (c.head_dim + c.dv()) * kv_elem_bytes;
  const double qo_bytes = static_cast<double>(w.total_q) * c.num_qo_heads * (c.head_dim + c.dv()) * kElemBytes;
  PhaseWork work;
  work.attention = kv_bytes + qo_bytes;
  if (w.indexer) {
    double rows = 0.0;  // index-K rows each request reads, then the index q rows
    for (int64_t b = 0; b < w.batch(); ++b) rows += static_cast<double>(w.kv_lens[b]) * kIndexKHeads;
    work.indexer = (rows + static_cast<double>(w.total_q) * c.num_kv_heads) * kIndexHeadDim * kElemBytes;
  }
  return work;
}

}  // namespace msa::cli
