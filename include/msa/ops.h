// The entry points. Each validates its arguments and dispatches on the device of its tensors: CPU
// tensors run the reference backend, CUDA tensors the GPU kernels. The metadata (dtypes, shapes,
// strides, devices) is always checked; the values of the length and index tensors (lengths against
// the plan, page ids, block ids) wherever they are host-readable: always for CPU tensors, with
// RunOptions::validate for CUDA tensors. Shapes (the contract, docs/contract.md §1):
//
//   q            [total_q, Hq, D]                     bf16 / fp16 (fp32 on the CPU backend)
//   k, v         [num_pages, Hkv, page_size, D|Dv]    q's dtype, or both fp8 e4m3 (RunOptions::k_scale / v_scale);
//                                                     any non-negative strides, innermost dim contiguous
//                                                     (CUDA: pointers and outer strides of q, k, v, o
//                                                     16-byte aligned)
//   page table   dense [B, max_pages] or flat [n] + indptr [B+1]       int32
//   block_idx    [total_q, Hkv, topk]                 int32, any non-negative strides (sglang's [Hkv, T, topk]
//                                                     is the same tensor permuted); -1 = empty slot
//   o            [total_q, Hq, Dv]                    q's dtype
//   lse          [total_q, Hq]                        fp32, natural log; -inf for empty rows
#pragma once

#include <cstdint>

#include "msa/plan.h"
#include "msa/tensor.h"

namespace msa {

struct PageTable {
  TensorView table;   // int32: dense [B, max_pages], or flat [n] when indptr is given
  TensorView indptr;  // int32 [B+1]: request b's pages are table[indptr[b] : indptr[b+1]]
};

// Per-request lengths, on the device the call runs on (read at run time).
struct Sequences {
  TensorView qo_indptr;  // int32 [B+1], cu_seqlens_q; qo_indptr[0] == 0
  TensorView kv_lens;    // int32 [B], keys [0, kv_len) exist
  TensorView qo_offset;  // int32 [B], optional: absolute position of the first query; default kv_len - qo_len
};

struct RunOptions {
  float sm_scale = 0.0f;   // 0: head_dim ** -0.5
  void* stream = nullptr;  // cudaStream_t for CUDA tensors; ignored on the CPU
  bool validate = false;   // CUDA tensors: read lengths, page table and block indexes on the host, report the
                           // first bad entry (synchronizes); CPU tensors are always checked so
  // attention only: per-tensor dequantization scales (sglang's and FlashInfer's k_scale / v_scale), finite
  // and > 0, for K/V of any dtype. Logits s_j = (q . k_j) * sm_scale * q_scale * k_scale; o = softmax(s) V
  // * v_scale (q_scale * k_scale folded into sm_scale on the host; v_scale applied where the output is
  // normalized).
  // After the fields above, so that positional initialisers {sm_scale, stream, validate} stay valid.
  float q_scale = 1.0f;
  float k_scale = 1.0f;
  float v_scale = 1.0f;
};

enum class ScoreLayout { kHKT, kTHK };  // [H, max_blocks, T] or [T, H, max_blocks]

// Sparse attention when block_idx is given (plan.config().topk > 0), dense paged attention when not.
// k and v are both in q's dtype, or both fp8 e4m3 (a value is its e4m3 value times opts.k_scale / v_scale).
// fp8 K/V run on both backends (the CUDA kernels widen the e4m3 values exactly and keep 16-bit MMAs).
// One run of a plan at a time (plan.h): concurrent calls (streams, threads) need a plan each, e.g. clone().
void attention(const Plan& plan, const TensorView& q, const TensorView& k, const TensorView& v,
               const PageTable& pages, const Sequences& seqs, const TensorView& block_idx, const TensorView& o,
               const TensorView& lse = {}, const RunOptions& opts = {});

// Indexer step 1: out[.., h, blk, t] = max over the visible keys j of block blk of raw q[t, h] . k[j, h / (H/Hk)]
// (causal, j < kv_len), -inf where the block has no visible key.
//   q [T, H, D]; k_index [num_pages, Hk, page_size, D] (q's dtype, or fp8 e4m3 with k_scale
//   [num_pages, Hk, page_size] fp32 per token; CUDA: D = 128); out fp32 in `layout`,
//   max_blocks >= ceil(max kv_len / 128).
void block_scores(const TensorView& q, const TensorView& k_index, const TensorView& k_scale, const PageTable& pages,
                  const Sequences& seqs, const TensorView& out, ScoreLayout layout, bool causal = true,
                  const RunOptions& opts = {});

// The optional parts of select_topk; the defaults give the plain selection.
struct SelectTopkOptions {
  // Non-finite scores (NaN, -inf, +inf) are not candidates: never chosen by score (forced blocks are kept
  // whatever their score); a row with fewer finite candidates than topk - forced gets -1 slots after them.
  bool finite_only = false;
  // int32 [batch_size, >= max_blocks], any non-negative strides: a selected block blk of a token of request b is
  // written as block_map[b, blk] (e.g. a shard's local block -> global block); the order stays ascending in blk.
  TensorView block_map;
  // fp32 [T, H, topk], any non-negative strides: the score scores[t, h, blk] of each written entry (forced
  // blocks too), NaN at the -1 slots.
  TensorView out_scores;
};

// Indexer step 2 (contract §4): per (token, head) row of scores, the topk best causally valid blocks,
// first force_begin and last force_end valid blocks always kept, NaN lowest, ties to the lower index,
// written ascending with -1 at the tail into out [T, H, topk] (int32, any non-negative strides).
void select_topk(const TensorView& scores, ScoreLayout layout, const Sequences& seqs, int topk, int force_begin,
                 int force_end, const TensorView& out, bool causal = true, const RunOptions& opts = {},
                 const SelectTopkOptions& select = {});

// Indexer over sharded keys (docs/sharding.md): the global selection from N ranks' candidate lists, exactly
// select_topk (same arguments, same order, forced blocks and causal validity) over rows of max_blocks blocks that
// hold each candidate's score at its block id and NaN at every other block. A block proposed twice keeps the
// higher score (NaN lowest).
//   cand_scores fp32 [N, T, H, k], cand_ids int32 [N, T, H, k] (global block ids; < 0 or >= max_blocks: no
//   candidate), any non-negative strides; out int32 [T, H, topk], likewise. max_blocks <= 32768 on the GPU.
void merge_candidates(const TensorView& cand_scores, const TensorView& cand_ids, const Sequences& seqs,
                      int max_blocks, int topk, int force_begin, int force_end, const TensorView& out,
                      bool causal = true, const RunOptions& opts = {});

// Merge S partial attention states by their LSEs: v_parts [S, T, H, Dv] (fp32, bf16 or fp16), lse_parts [S, T, H]
// fp32 -> o [T, H, Dv] (fp32, bf16 or fp16, whatever v_parts'), lse_out [T, H] (optional). A part with
// lse = -inf contributes nothing.
void merge_states(const TensorView& v_parts, const TensorView& lse_parts, const TensorView& o,
                  const TensorView& lse_out = {}, const RunOptions& opts = {});

// Page table from a serving engine's token-to-slot map: out[b, p] = req_to_token[req_pool_indices[b], p * page_size]
// / page_size for p < ceil(seq_lens[b] / page_size), -1 for the rest of the row.
//   req_to_token [R, max_context] int32; req_pool_indices [B], seq_lens [B] int32 or int64; out [B, max_pages] int32.
void build_page_table(const TensorView& req_to_token, const TensorView& req_pool_indices, const TensorView& seq_lens,
                      int page_size, const TensorView& out, const RunOptions& opts = {});

// The whole MiniMax-M3 sparse layer as a serving engine calls it: block_scores of the index queries
// (one index head per KV head: q_index [T, Hkv, Di]) over the index-K cache (same page table as k/v), then
// select_topk of plan.config().topk blocks per (token, KV head) with the forced first/last blocks, then
// sparse attention with the plan. scores (fp32, `layout`, max_blocks >= ceil(max kv_len / 128)) and block_idx
// ([T, Hkv, topk] int32) are caller-provided workspaces, so the call allocates nothing and can be captured.
// opts' q_scale / k_scale / v_scale are the attention's (the index keys carry their own index.k_scale).
struct IndexerInputs {
  TensorView q;        // [total_q, Hkv, Di]
  TensorView k;        // [num_pages, Hk, page_size, Di], bf16/fp16 or fp8 e4m3
  TensorView k_scale;  // fp8 only: [num_pages, Hk, page_size] fp32
};
void sparse_attention_layer(const Plan& plan, const TensorView& q, const TensorView& k, const TensorView& v,
                            const IndexerInputs& index, const PageTable& pages, const Sequences& seqs, int force_begin,
                            int force_end, const TensorView& scores, ScoreLayout layout, const TensorView& block_idx,
                            const TensorView& o, const TensorView& lse = {}, const RunOptions& opts = {});

// The KV-cache writer: the rows of src [n, H, D] go to the paged cache [num_pages, H, page_size, D] at the
// slots slot_ids[i] (slot s: page s / page_size, offset s % page_size); a negative slot id skips its row.
//   cache dtype = src dtype: a plain copy. cache fp8 e4m3: stored = e4m3(satfinite(src / scale)), rounded to
//   nearest even, saturating at +-448, NaN stored as NaN (0x7f); a stored value means its e4m3 value x scale.
//   Per-tensor `scale` (> 0, finite), or per-slot scales when slot_scale [num_pages, H, page_size] fp32 is
//   given (the k_scale of block_scores' fp8 index keys): each row's scale is amax(|finite elements|) / 448,
//   1 where that is 0, written to slot_scale with the row.
//   src bf16 / fp16 (fp32 on the CPU); cache and slot_scale any non-negative strides (cache: innermost
//   contiguous); slot_ids [n]
//   int32 / int64. Graph-safe on CUDA (no allocation, no host read); slots >= num_pages * page_size are
//   refused on the CPU and by RunOptions::validate, skipped by the GPU kernel. Duplicate slots are a caller
//   error: which row a GPU slot keeps is unspecified.
void write_cache(const TensorView& src, const TensorView& cache, const TensorView& slot_ids, float scale = 1.0f,
                 const TensorView& slot_scale = {}, const RunOptions& opts = {});

// True when this build has the CUDA backend and its kernels run on the current GPU at compute capability
// >= 8.0 (the lower of the device's and the newest code the binary holds for it).
bool cuda_available();

// The compute capability (major * 10 + minor) msa's kernels run as on the current GPU: the GPU's own, or lower
// where this build holds only older code for it (a build for sm_80 run on an H200 reports 80 and takes the
// portable kernels there); 0 without a usable GPU.
int cuda_compute_capability();

}  // namespace msa
