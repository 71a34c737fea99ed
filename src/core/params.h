// Plain parameter structs handed from the validating front door (src/core/dispatch.cpp) to the
// backends. Everything here is already checked: pointers are offset, strides are in elements,
// optional tensors are nullptr. The structs hold no std:: types so kernels take them by value.
#pragma once

#include <cstdint>

namespace msa::detail {

enum class ScalarType : int { kF32 = 0, kF16 = 1, kBF16 = 2, kF8E4M3 = 3 };

// The blocks (128 keys each) of the longest request an int32 kv_len describes, ceil(2^31 / 128): the bound of a
// row of block scores and of a plan's top-k.
inline constexpr int kMaxRequestBlocks = 1 << 24;

// Which physical page holds logical page p of request b.
struct PageTableParams {
  const int32_t* table = nullptr;
  const int32_t* indptr = nullptr;  // flat form when non-null: row b is table[indptr[b] : indptr[b+1]]
  int64_t row_stride = 0;           // dense form: row b starts at table + b * row_stride
  int64_t row_capacity = 0;         // dense form: entries per row; flat form: total entries
  int32_t num_pages = 0;            // physical pages in the pool; entries outside [0, num_pages) are skipped
};

struct SeqParams {
  int32_t batch_size = 0;
  int64_t total_q = 0;
  const int32_t* qo_indptr = nullptr;  // [B+1]
  const int32_t* kv_lens = nullptr;    // [B]
  const int32_t* qo_offset = nullptr;  // [B] or nullptr: kv_len - qo_len
};

// A paged cache tensor [num_pages, heads, page_size, dim], innermost contiguous.
struct CacheParams {
  const void* data = nullptr;
  int64_t stride_page = 0, stride_head = 0, stride_token = 0;  // elements
  int32_t num_heads = 0, page_size = 0, dim = 0;
};

struct AttentionParams {
  ScalarType dtype = ScalarType::kBF16;     // of q and o
  ScalarType kv_dtype = ScalarType::kBF16;  // of k and v: dtype, or kF8E4M3
  const void* q = nullptr;
  int64_t q_stride_token = 0, q_stride_head = 0;
  int32_t num_qo_heads = 0, num_kv_heads = 0, group_size = 0;
  int32_t head_dim = 0, head_dim_v = 0;
  CacheParams k, v;
  PageTableParams pages;
  SeqParams seqs;
  // Sparse mode when non-null: entry (t, g, i) at block_idx[t*bi_stride_token + g*bi_stride_head + i*bi_stride_k].
  const int32_t* block_idx = nullptr;
  int64_t bi_stride_token = 0, bi_stride_head = 0, bi_stride_k = 0;
  int32_t topk = 0;
  int32_t block_size = 128;
  bool causal = true;
  float sm_scale = 0.f;  // the logits' scale: sm_scale * q_scale * k_scale of the call, folded on the host
  float v_scale = 1.f;   // multiplies the output (V's dequantization scale)
  void* o = nullptr;
  int64_t o_stride_token = 0, o_stride_head = 0;
  float* lse = nullptr;  // optional
  int64_t lse_stride_token = 0, lse_stride_head = 0;
  int32_t max_qo_len = 0;    // from the plan (decode: bound; prefill: exact max)
  int64_t max_kv_len = 0;    // from the plan (decode: bound)
};

struct BlockScoresParams {
  ScalarType q_dtype = ScalarType::kBF16;
  ScalarType k_dtype = ScalarType::kBF16;  // kF8E4M3: k_scale holds one fp32 per token
  const void* q = nullptr;
  int64_t q_stride_token = 0, q_stride_head = 0;
  int32_t num_heads = 0, head_dim = 0;
  CacheParams k;
  const float* k_scale = nullptr;  // [num_pages, Hk, page_size] strides below
  int64_t ks_stride_page = 0, ks_stride_head = 0, ks_stride_token = 0;
  PageTableParams pages;
  SeqParams seqs;
  int32_t block_size = 128;
  bool causal = true;
  float* out = nullptr;
  int64_t out_stride_token = 0, out_stride_head = 0, out_stride_block = 0;  // layout folded into strides
  int32_t max_blocks = 0;  // out's block extent
};

struct SelectTopkParams {
  const float* scores = nullptr;
  int64_t s_stride_token = 0, s_stride_head = 0, s_stride_block = 0;
  int32_t num_heads = 0, max_blocks = 0;
  SeqParams seqs;
  int32_t block_size = 128;
  int32_t topk = 0, force_begin = 0, force_end = 0;
  bool causal = true;
  bool finite_only = false;  // non-finite scores are never chosen by score (forced blocks still are)
  int32_t* out = nullptr;
  int64_t out_stride_token = 0, out_stride_head = 0, out_stride_k = 0;
  // Optional: out holds block_map[b * bm_stride_req + blk * bm_stride_block] instead of blk (b: the token's request).
  const int32_t* block_map = nullptr;
  int64_t bm_stride_req = 0, bm_stride_block = 0;
  // Optional: the score of each written entry, NaN at the -1 slots.
  float* out_scores = nullptr;
  int64_t os_stride_token = 0, os_stride_head = 0, os_stride_k = 0;
};

// merge_candidates: the selection of select_topk over rows that hold each candidate's score at its block id
// and NaN at every other block. select.scores is unused.
struct MergeCandidatesParams {
  SelectTopkParams select;
  const float* scores = nullptr;  // [N, T, H, k]
  int64_t s_stride_rank = 0, s_stride_token = 0, s_stride_head = 0, s_stride_k = 0;
  const int32_t* ids = nullptr;   // [N, T, H, k]: global block ids; < 0 or >= max_blocks: no candidate
  int64_t i_stride_rank = 0, i_stride_token = 0, i_stride_head = 0, i_stride_k = 0;
  int32_t num_ranks = 0, per_rank = 0;
};

struct MergeParams {
  ScalarType v_dtype = ScalarType::kF32;  // of the parts
  ScalarType o_dtype = ScalarType::kBF16;
  const void* v = nullptr;
  int64_t v_stride_split = 0, v_stride_token = 0, v_stride_head = 0;
  const float* lse = nullptr;
  int64_t lse_stride_split = 0, lse_stride_token = 0, lse_stride_head = 0;
  int32_t num_splits = 0, num_heads = 0, head_dim = 0;
  int64_t num_tokens = 0;
  void* o = nullptr;
  int64_t o_stride_token = 0, o_stride_head = 0;
  float* lse_out = nullptr;
  int64_t lse_out_stride_token = 0, lse_out_stride_head = 0;
};

struct PageTableBuildParams {
  const int32_t* req_to_token = nullptr;
  int64_t r2t_stride_req = 0, r2t_stride_token = 0;
  int32_t num_reqs_pool = 0;
  int64_t max_context = 0;
  const void* req_pool_indices = nullptr;
  bool req_pool_indices_i64 = false;
  const void* seq_lens = nullptr;
  bool seq_lens_i64 = false;
  int32_t batch_size = 0;
  int32_t page_size = 0;
  int32_t* out = nullptr;
  int64_t out_stride_b = 0;
  int32_t max_pages = 0;
};

// The KV-cache writer: row (i, h) of src goes to slot slots[i] of head h of the cache.
struct WriteCacheParams {
  ScalarType src_dtype = ScalarType::kBF16;
  ScalarType cache_dtype = ScalarType::kBF16;  // src_dtype (a copy) or kF8E4M3
  const void* src = nullptr;
  int64_t src_stride_token = 0, src_stride_head = 0;
  int64_t num_tokens = 0;
  int32_t num_heads = 0, dim = 0;
  void* cache = nullptr;
  int64_t stride_page = 0, stride_head = 0, stride_token = 0;  // elements of the cache dtype
  int64_t num_pages = 0;
  int32_t page_size = 0;
  const void* slots = nullptr;  // [num_tokens]; < 0 skips the row, >= num_pages * page_size is skipped too
  bool slots_i64 = false;
  int64_t slot_stride = 0;
  float scale = 1.f;  // fp8 with per-tensor scale: stored = e4m3(satfinite(src / scale))
  float* slot_scale = nullptr;  // fp8 with per-slot scales when non-null: [num_pages, heads, page_size]
  int64_t ss_stride_page = 0, ss_stride_head = 0, ss_stride_token = 0;
};

}  // namespace msa::detail
