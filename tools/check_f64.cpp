#include "check_f64.h"

#include <algorithm>
#include <cmath>
#include <mutex>
#include <unordered_set>
#include <utility>
#include <vector>

#include "bf16.h"
#include "parallel.h"
#include "rng.h"

namespace msa::cli {

namespace {

// Attention of one (token, head) row in float64; writes D values into out (zeros when no key is visible).
void reference_row(const Workload& w, int64_t t, int h, double* out) {
  const AttentionConfig& c = w.cfg;
  const int D = c.head_dim, g = h / c.group_size();
  const int64_t b = w.request_of(t), pos = w.position_of(t), kv_len = w.kv_lens[b];
  const double scale = 1.0 / std::sqrt(static_cast<double>(D));
  std::vector<double> q(D);
  const uint16_t* qr = w.q.data.get() + (t * c.num_qo_heads + h) * D;
  for (int d = 0; d < D; ++d) q[d] = bf16_to_float(qr[d]);

  std::vector<int64_t> keys;  // visible keys: in a selected block, existing, and not after the query
  std::vector<double> logits, kv(D);
  for (int32_t blk : w.selected_blocks(t, g)) {
    const int64_t end = std::min<int64_t>({int64_t(blk + 1) * c.block_size, kv_len, pos + 1});
    for (int64_t j = int64_t(blk) * c.block_size; j < end; ++j) {
      w.k.load(w.kv_offset(b, j, g), D, kv.data());  // dequantized when fp8
      double s = 0.0;
      for (int d = 0; d < D; ++d) s += q[d] * kv[d];
      keys.push_back(j);
      logits.push_back(s * scale);
    }
  }
  std::fill(out, out + D, 0.0);
  if (keys.empty()) return;
  const double m = *std::max_element(logits.begin(), logits.end());
  double denom = 0.0;
  for (size_t i = 0; i < keys.size(); ++i) {
    const double p = std::exp(logits[i] - m);
    denom += p;
    w.v.load(w.kv_offset(b, keys[i], g), D, kv.data());
    for (int d = 0; d < D; ++d) out[d] += p * kv[d];
  }
  for (int d = 0; d < D; ++d) out[d] /= denom;
}

}  // namespace

bool CheckResult::pass() const {
  // Written so that a NaN in either figure fails.
  return rows > 0 && nan_values == 0 && rel_l2 < kMaxRelL2 && max_abs < kMaxAbs;
}

std::vector<CheckRow> sample_rows(const Workload& w, int64_t count, uint64_t seed) {
  const int H = w.cfg.num_qo_heads;
  const int64_t total = w.total_q * H;
  std::vector<int64_t> ids;
  if (count >= total) {
    for (int64_t i = 0; i < total; ++i) ids.push_back(i);
  } else {
    std::unordered_set<int64_t> chosen;
    for (int64_t id : {int64_t(0), int64_t(H - 1), (w.total_q - 1) * H, total - 1})
      if (static_cast<int64_t>(chosen.size()) < count) chosen.insert(id);
    // Rejection: at worst (count = total - 1) about total * ln(total) draws, 3.3M for 262144 rows.
    Rng rng(seed);
    while (static_cast<int64_t>(chosen.size()) < count) chosen.insert(rng.below(total));
    ids.assign(chosen.begin(), chosen.end());
    std::sort(ids.begin(), ids.end());
  }
  std::vector<CheckRow> rows(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) rows[i] = {ids[i] / H, static_cast<int>(ids[i] % H)};
  return rows;
}

CheckResult check_rows(const Workload& w, const uint16_t* o, const std::vector<CheckRow>& rows) {
  const int D = w.cfg.dv(), H = w.cfg.num_qo_heads;
  CheckResult r;
  r.rows = static_cast<int64_t>(rows.size());
  double diff2 = 0.0, ref2 = 0.0;
  std::mutex mu;
  parallel_for(r.rows, 8, [&](int64_t begin, int64_t end) {
    std::vector<double> ref(D);
    double local_diff2 = 0.0, local_ref2 = 0.0, local_max = 0.0;
    int64_t local_nan = 0;
    for (int64_t i = begin; i < end; ++i) {
      const CheckRow& row = rows[i];
      reference_row(w, row.token, row.head, ref.data());
      const uint16_t* got = o + (row.token * H + row.head) * D;
      for (int d = 0; d < D; ++d) {
        const double x = bf16_to_float(got[d]);
        if (!std::isfinite(x)) {
          ++local_nan;
          continue;
        }
        const double e = x - ref[d];
        local_diff2 += e * e;
        local_ref2 += ref[d] * ref[d];
        local_max = std::max(local_max, std::abs(e));
      }
    }
    std::lock_guard<std::mutex> lock(mu);
    diff2 += local_diff2;
    ref2 += local_ref2;
    r.max_abs = std::max(r.max_abs, local_max);
    r.nan_values += local_nan;
  });
  // An all-zero reference (no visible key anywhere) only passes with an all-zero output.
  r.rel_l2 = ref2 > 0.0 ? std::sqrt(diff2 / ref2) : (diff2 > 0.0 ? INFINITY : 0.0);
  return r;
}

int64_t check_selections(const Workload& w, const std::vector<CheckRow>& rows) {
  const AttentionConfig& c = w.cfg;
  std::vector<std::pair<int64_t, int>> pairs;  // distinct (token, KV head)
  for (const CheckRow& r : rows) pairs.emplace_back(r.token, r.head / c.group_size());
  std::sort(pairs.begin(), pairs.end());
  pairs.erase(std::unique(pairs.begin(), pairs.end()), pairs.end());
  std::mutex mu;
  int64_t bad = 0;
  parallel_for(static_cast<int64_t>(pairs.size()), 8, [&](int64_t begin, int64_t end) {
    int64_t local_bad = 0;
    for (int64_t i = begin; i < end; ++i) {
      const auto [t, g] = pairs[i];
      const int64_t b = w.request_of(t), pos = w.position_of(t);
      const int64_t visible_end = std::min<int64_t>(w.kv_lens[b], pos + 1);  // keys [0, visible_end)
      const int64_t n_valid = visible_end <= 0 ? 0 : (visible_end - 1) / c.block_size + 1;
      const uint16_t* qr = w.q_index.data.get() + (t * c.num_kv_heads + g) * kIndexHeadDim;
      std::vector<double> score(n_valid, -INFINITY);
      for (int64_t j = 0; j < visible_end; ++j) {
        const uint16_t* kr = w.k_index.data.get() + w.index_k_offset(b, j);
        double s = 0.0;
        for (int d = 0; d < kIndexHeadDim; ++d) s += double(bf16_to_float(qr[d])) * bf16_to_float(kr[d]);
        score[j / c.block_size] = std::max(score[j / c.block_size], s);
      }
      const int32_t* row = w.block_idx.data() + (t * c.num_kv_heads + g) * c.topk;
      const int64_t want = std::min<int64_t>(c.topk, n_valid);
      bool ok = true;
      std::vector<char> chosen(n_valid, 0);
      for (int k = 0; k < c.topk && ok; ++k) {
        if (k < want) {
          ok = row[k] >= 0 && row[k] < n_valid && (k == 0 || row[k] > row[k - 1]);
          if (ok) chosen[row[k]] = 1;
        } else {
          ok = row[k] == -1;
        }
      }
      // Forced: the first kForceBegin and the last kForceEnd valid blocks (the own block is the last).
      for (int64_t e = 0; ok && e < n_valid; ++e)
        if ((e < kForceBegin || e >= n_valid - kForceEnd) && !chosen[e]) ok = false;
      double weakest = INFINITY, strongest_left = -INFINITY;
      for (int64_t e = 0; ok && e < n_valid; ++e) {
        if (e < kForceBegin || e >= n_valid - kForceEnd) continue;
        if (chosen[e]) weakest = std::min(weakest, score[e]);
        else strongest_left = std::max(strongest_left, score[e]);
      }
      if (ok && weakest != INFINITY && strongest_left > weakest + 1e-3 * std::max(1.0, std::abs(weakest))) ok = false;
      if (!ok) ++local_bad;
    }
    std::lock_guard<std::mutex> lock(mu);
    bad += local_bad;
  });
  return bad;
}

}  // namespace msa::cli
