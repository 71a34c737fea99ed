// Reference attention (contract §2-§3): dense or block-sparse, paged, GQA, with LSE.
//
// Work item = (query token, KV head). The item's visible keys are the same for every query head of
// the group, so they are gathered and widened to float once, then each head runs
// scores -> max -> exp -> weighted sum over them. K is kept transposed ([D][n]) and V row-major
// ([n][Dv]) so both inner loops run over contiguous floats and vectorize without reassociation.
// Scores and the weighted sum accumulate in fp32, the softmax denominator in fp64.
//
// fp8 e4m3 K/V are widened exactly (scalar.h) and their per-tensor scales applied where they are linear:
// k_scale (with q_scale) in the logits' scale, v_scale on the output. That is the contract's dequantized
// cache (value x scale) with one rounding per row instead of one per element.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "core/backend.h"
#include "reference/paged_batch.h"
#include "reference/parallel.h"
#include "reference/qk_scores.h"
#include "reference/scalar.h"

namespace msa::detail::reference {

namespace {

struct Scratch {
  std::vector<int32_t> blocks;    // the row's selected blocks, in range, sorted, each once
  std::vector<int64_t> k_offset;  // element offsets of the visible keys' K rows
  std::vector<int64_t> v_offset;
  std::vector<float> kt;   // [head_dim][n]
  std::vector<float> v;    // [n][head_dim_v]
  std::vector<float> q, s, acc;
};

// Appends the keys [begin, end) of request b whose pages exist; keys on invalid pages stay invisible.
void add_keys(const AttentionParams& p, int32_t b, int32_t g, int64_t begin, int64_t end, Scratch& w) {
  for (int64_t j = begin; j < end; ++j) {
    const int64_t page = physical_page(p.pages, b, j / p.k.page_size);
    if (page < 0) continue;
    const int64_t in_page = j % p.k.page_size;
    w.k_offset.push_back(page * p.k.stride_page + g * p.k.stride_head + in_page * p.k.stride_token);
    w.v_offset.push_back(page * p.v.stride_page + g * p.v.stride_head + in_page * p.v.stride_token);
  }
}

// Visible keys of (token t, KV head g): the dense mask, intersected with the selected blocks when sparse.
void gather_keys(const AttentionParams& p, const TokenPlace& pl, int64_t t, int32_t g, Scratch& w) {
  w.k_offset.clear();
  w.v_offset.clear();
  const int64_t end = BatchMap::visible_end(pl, p.causal);
  if (end <= 0) return;
  if (!p.block_idx) {
    add_keys(p, pl.request, g, 0, end, w);
    return;
  }
  const int64_t num_blocks = (pl.kv_len + p.block_size - 1) / p.block_size;
  const int32_t* row = p.block_idx + t * p.bi_stride_token + g * p.bi_stride_head;
  w.blocks.clear();
  for (int32_t i = 0; i < p.topk; ++i) {
    const int32_t e = row[i * p.bi_stride_k];
    if (e >= 0 && e < num_blocks) w.blocks.push_back(e);  // negative: empty slot; past the end: ignored
  }
  std::sort(w.blocks.begin(), w.blocks.end());
  w.blocks.erase(std::unique(w.blocks.begin(), w.blocks.end()), w.blocks.end());  // a duplicate counts once
  for (int32_t blk : w.blocks) {
    const int64_t begin = int64_t(blk) * p.block_size;
    add_keys(p, pl.request, g, begin, std::min<int64_t>(begin + p.block_size, end), w);
  }
}

void attend_item(const AttentionParams& p, const BatchMap& batch, int64_t t, int32_t g, Scratch& w) {
  const TokenPlace pl = batch.place(t);
  gather_keys(p, pl, t, g, w);
  const int64_t n = static_cast<int64_t>(w.k_offset.size());
  const int32_t D = p.head_dim, Dv = p.head_dim_v;

  w.kt.resize(size_t(D) * n);
  w.v.resize(size_t(n) * Dv);
  for (int64_t j = 0; j < n; ++j) {
    load_row(p.k.data, p.kv_dtype, w.k_offset[j], D, w.kt.data() + j, n);
    load_row(p.v.data, p.kv_dtype, w.v_offset[j], Dv, w.v.data() + j * Dv);
  }
  w.q.resize(D);
  w.s.resize(n);
  w.acc.resize(Dv);

  for (int32_t h = g * p.group_size; h < (g + 1) * p.group_size; ++h) {
    const int64_t o_base = t * p.o_stride_token + h * p.o_stride_head;
    float* lse = p.lse ? p.lse + t * p.lse_stride_token + h * p.lse_stride_head : nullptr;
    if (n == 0) {  // no visible key: o = 0, lse = -inf (never NaN)
      for (int32_t d = 0; d < Dv; ++d) store_scalar(p.o, p.dtype, o_base + d, 0.f);
      if (lse) *lse = -std::numeric_limits<float>::infinity();
      continue;
    }
    load_row(p.q, p.dtype, t * p.q_stride_token + h * p.q_stride_head, D, w.q.data());

    float* s = w.s.data();
    qk_scores(w.q.data(), w.kt.data(), D, n, s);
    float m = -std::numeric_limits<float>::infinity();
    for (int64_t j = 0; j < n; ++j) {
      s[j] *= p.sm_scale;
      m = std::max(m, s[j]);
    }
    double sum = 0.0;
    for (int64_t j = 0; j < n; ++j) {
      s[j] = std::exp(s[j] - m);
      sum += s[j];
    }

    float* acc = w.acc.data();
    std::fill(acc, acc + Dv, 0.f);
    for (int64_t j = 0; j < n; ++j) {
      const float pj = s[j];
      const float* vj = w.v.data() + j * Dv;
      for (int32_t d = 0; d < Dv; ++d) acc[d] += pj * vj[d];
    }
    const float inv = static_cast<float>(p.v_scale / sum);
    for (int32_t d = 0; d < Dv; ++d) store_scalar(p.o, p.dtype, o_base + d, acc[d] * inv);
    if (lse) *lse = static_cast<float>(m + std::log(sum));
  }
}

}  // namespace

void attention(const AttentionParams& p) {
  const BatchMap batch(p.seqs);
  const int64_t items = p.seqs.total_q * p.num_kv_heads;
  std::vector<Scratch> scratch(worker_count(items));
  parallel_for(items, [&](int64_t i, int worker) {
    attend_item(p, batch, i / p.num_kv_heads, static_cast<int32_t>(i % p.num_kv_heads), scratch[worker]);
  });
}

}  // namespace msa::detail::reference
