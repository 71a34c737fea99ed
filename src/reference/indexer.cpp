// Reference indexer (contract §4): per-block max scores, then the top-k block selection.
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

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

struct ScoreScratch {
  std::vector<int64_t> key;     // visible key indexes
  std::vector<int64_t> offset;  // their K rows' element offsets
  std::vector<float> scale;     // their fp8 scales (1 otherwise)
  std::vector<float> kt;        // [head_dim][n], so the dot products vectorize over keys
  std::vector<float> q, s;
};

// Work item (token t, index-K head kg): every query head reading kg shares its widened K rows.
void score_item(const BlockScoresParams& p, const BatchMap& batch, int64_t t, int32_t kg, ScoreScratch& w) {
  const int32_t heads_per_k = p.num_heads / p.k.num_heads;
  for (int32_t h = kg * heads_per_k; h < (kg + 1) * heads_per_k; ++h)
    for (int32_t blk = 0; blk < p.max_blocks; ++blk)
      p.out[t * p.out_stride_token + h * p.out_stride_head + blk * p.out_stride_block] = kNegInf;

  const TokenPlace pl = batch.place(t);
  const int64_t end = std::min<int64_t>(BatchMap::visible_end(pl, p.causal), int64_t(p.max_blocks) * p.block_size);
  w.key.clear();
  w.offset.clear();
  w.scale.clear();
  for (int64_t j = 0; j < end; ++j) {
    const int64_t page = physical_page(p.pages, pl.request, j / p.k.page_size);
    if (page < 0) continue;  // a key on an invalid page is invisible
    const int64_t in_page = j % p.k.page_size;
    w.key.push_back(j);
    w.offset.push_back(page * p.k.stride_page + kg * p.k.stride_head + in_page * p.k.stride_token);
    w.scale.push_back(p.k_scale ? p.k_scale[page * p.ks_stride_page + kg * p.ks_stride_head +
                                            in_page * p.ks_stride_token]
                                : 1.f);
  }
  const int64_t n = static_cast<int64_t>(w.key.size());
  if (n == 0) return;
  const int32_t D = p.head_dim;
  w.kt.resize(size_t(D) * n);
  for (int64_t j = 0; j < n; ++j) {
    float* col = w.kt.data() + j;
    load_row(p.k.data, p.k_dtype, w.offset[j], D, col, n);
    if (w.scale[j] != 1.f)
      for (int32_t d = 0; d < D; ++d) col[int64_t(d) * n] *= w.scale[j];
  }
  w.q.resize(D);
  w.s.resize(n);
  for (int32_t h = kg * heads_per_k; h < (kg + 1) * heads_per_k; ++h) {
    load_row(p.q, p.q_dtype, t * p.q_stride_token + h * p.q_stride_head, D, w.q.data());
    float* s = w.s.data();
    qk_scores(w.q.data(), w.kt.data(), D, n, s);
    float* out = p.out + t * p.out_stride_token + h * p.out_stride_head;
    for (int64_t j = 0; j < n; ++j) {
      float& best = out[(w.key[j] / p.block_size) * p.out_stride_block];
      best = std::fmax(best, s[j]);  // as fmaxf on the GPU: a NaN product does not win
    }
  }
}

// Strict "ranks higher" order of select_topk: higher score first, NaN below everything (-inf
// included), equal scores by lower block index. A total order, so the selection is deterministic.
struct RanksHigher {
  const float* scores;
  int64_t stride;
  bool operator()(int32_t a, int32_t b) const {
    const float sa = scores[a * stride], sb = scores[b * stride];
    const bool nan_a = std::isnan(sa), nan_b = std::isnan(sb);
    if (nan_a != nan_b) return nan_b;
    if (!nan_a && sa != sb) return sa > sb;
    return a < b;
  }
};

// The row's selection: the forced blocks (the first force_begin and the last force_end valid ones), then the
// topk - force_begin - force_end best candidates (the other valid blocks; with finite_only only those of finite
// score), all of them when fewer; ascending, -1 after them. With fewer valid blocks than topk every candidate
// is taken, so that case needs no branch of its own.
// row / stride: the (token t, head h) row's scores (select_topk's, or one merge_candidates builds).
void select_from_row(const SelectTopkParams& p, const BatchMap& batch, int64_t t, int32_t h, const float* row,
                     int64_t stride, std::vector<int32_t>& chosen) {
  const TokenPlace pl = batch.place(t);
  int64_t valid = 0;  // valid blocks are [0, valid)
  if (pl.request >= 0) {
    valid = (pl.kv_len + p.block_size - 1) / p.block_size;
    if (p.causal) valid = pl.pos < 0 ? 0 : std::min<int64_t>(valid, pl.pos / p.block_size + 1);
    valid = std::min<int64_t>(valid, p.max_blocks);
  }
  const int32_t nv = static_cast<int32_t>(valid);
  auto score = [&](int32_t blk) { return row[blk * stride]; };
  auto forced = [&](int32_t blk) { return blk < p.force_begin || blk >= nv - p.force_end; };
  chosen.clear();
  for (int32_t blk = 0; blk < nv; ++blk)
    if (forced(blk)) chosen.push_back(blk);
  const size_t num_forced = chosen.size();
  for (int32_t blk = 0; blk < nv; ++blk)
    if (!forced(blk) && (!p.finite_only || std::isfinite(score(blk)))) chosen.push_back(blk);
  const size_t by_score = static_cast<size_t>(p.topk - p.force_begin - p.force_end);
  const size_t keep = num_forced + std::min(by_score, chosen.size() - num_forced);
  const RanksHigher order{row, stride};
  std::nth_element(chosen.begin() + num_forced, chosen.begin() + keep, chosen.end(), order);
  chosen.resize(keep);
  std::sort(chosen.begin(), chosen.end());

  const int32_t* map = p.block_map && pl.request >= 0 ? p.block_map + pl.request * p.bm_stride_req : nullptr;
  int32_t* out = p.out + t * p.out_stride_token + h * p.out_stride_head;
  float* out_scores = p.out_scores ? p.out_scores + t * p.os_stride_token + h * p.os_stride_head : nullptr;
  for (int32_t i = 0; i < p.topk; ++i) {
    const int32_t blk = i < static_cast<int32_t>(chosen.size()) ? chosen[i] : -1;
    out[i * p.out_stride_k] = blk < 0 ? -1 : map ? map[blk * p.bm_stride_block] : blk;
    if (out_scores) out_scores[i * p.os_stride_k] = blk < 0 ? std::numeric_limits<float>::quiet_NaN() : score(blk);
  }
}

void select_item(const SelectTopkParams& p, const BatchMap& batch, int64_t t, int32_t h,
                 std::vector<int32_t>& chosen) {
  select_from_row(p, batch, t, h, p.scores + t * p.s_stride_token + h * p.s_stride_head, p.s_stride_block, chosen);
}

struct MergeScratch {
  std::vector<float> row;
  std::vector<int32_t> chosen;
};

// The row of candidates: NaN everywhere, each candidate's score at its block id; a block proposed twice keeps
// the score that ranks higher (NaN lowest), whatever the order of the proposals.
void merge_item(const MergeCandidatesParams& p, const BatchMap& batch, int64_t t, int32_t h, MergeScratch& w) {
  const int32_t nb = p.select.max_blocks;
  w.row.assign(static_cast<size_t>(nb), std::numeric_limits<float>::quiet_NaN());
  for (int32_t r = 0; r < p.num_ranks; ++r) {
    for (int32_t c = 0; c < p.per_rank; ++c) {
      const int32_t id = p.ids[r * p.i_stride_rank + t * p.i_stride_token + h * p.i_stride_head + c * p.i_stride_k];
      if (id < 0 || id >= nb) continue;
      const float sc = p.scores[r * p.s_stride_rank + t * p.s_stride_token + h * p.s_stride_head + c * p.s_stride_k];
      float& cur = w.row[static_cast<size_t>(id)];
      if (std::isnan(cur) || (!std::isnan(sc) && sc > cur)) cur = sc;
    }
  }
  select_from_row(p.select, batch, t, h, w.row.data(), 1, w.chosen);
}

}  // namespace

void block_scores(const BlockScoresParams& p) {
  const BatchMap batch(p.seqs);
  const int64_t items = p.seqs.total_q * p.k.num_heads;
  std::vector<ScoreScratch> scratch(worker_count(items));
  parallel_for(items, [&](int64_t i, int worker) {
    score_item(p, batch, i / p.k.num_heads, static_cast<int32_t>(i % p.k.num_heads), scratch[worker]);
  });
}

void select_topk(const SelectTopkParams& p) {
  const BatchMap batch(p.seqs);
  const int64_t items = p.seqs.total_q * p.num_heads;
  std::vector<std::vector<int32_t>> scratch(worker_count(items));
  parallel_for(items, [&](int64_t i, int worker) {
    select_item(p, batch, i / p.num_heads, static_cast<int32_t>(i % p.num_heads), scratch[worker]);
  });
}

void merge_candidates(const MergeCandidatesParams& p) {
  const BatchMap batch(p.select.seqs);
  const int64_t items = p.select.seqs.total_q * p.select.num_heads;
  std::vector<MergeScratch> scratch(worker_count(items));
  parallel_for(items, [&](int64_t i, int worker) {
    merge_item(p, batch, i / p.select.num_heads, static_cast<int32_t>(i % p.select.num_heads), scratch[worker]);
  });
}

}  // namespace msa::detail::reference
