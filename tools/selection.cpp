#include "selection.h"

#include <algorithm>
#include <vector>

#include "rng.h"

namespace msa::cli {

namespace {

enum : uint64_t { kTagRow = 1, kTagClusterPool = 2, kTagShared = 3 };

// Floyd's algorithm: `count` distinct values of [lo, hi), count <= hi - lo, appended to out.
void sample_distinct(Rng& rng, int64_t lo, int64_t hi, int count, std::vector<int32_t>& out) {
  const size_t first = out.size();
  for (int64_t j = hi - lo - count; j < hi - lo; ++j) {
    const int32_t t = static_cast<int32_t>(lo + rng.below(j + 1));
    const bool taken = std::find(out.begin() + first, out.end(), t) != out.end();
    out.push_back(taken ? static_cast<int32_t>(lo + j) : t);
  }
}

}  // namespace

void select_blocks(Pattern pattern, int64_t pos, int block_size, int topk, uint64_t row_key, uint64_t block_key,
                   int32_t* row) {
  const int64_t own = pos / block_size;  // causally valid blocks: [0, own]
  // The stream of this row's draws: per token, except shared, where every token of the query block
  // gets the same selection in the same order.
  Rng row_rng(pattern == Pattern::kShared ? stream_key(block_key, {kTagShared}) : stream_key(row_key, {kTagRow}));
  std::vector<int32_t> picks;
  picks.reserve(topk);
  if (own + 1 <= topk) {
    for (int32_t b = 0; b <= own; ++b) picks.push_back(b);
  } else if (pattern == Pattern::kClustered) {
    // Block 0, the own block, and topk - 2 of the query block's candidates among blocks [1, own).
    const int need = topk - 2;
    const int pool_size = static_cast<int>(std::min<int64_t>(own - 1, std::max(kClusterCandidates, need)));
    std::vector<int32_t> pool;
    Rng pool_rng(stream_key(block_key, {kTagClusterPool}));
    sample_distinct(pool_rng, 1, own, pool_size, pool);
    picks.push_back(0);
    picks.push_back(static_cast<int32_t>(own));
    std::vector<int32_t> which;
    sample_distinct(row_rng, 0, pool_size, need, which);
    for (int32_t w : which) picks.push_back(pool[w]);
  } else {
    picks.push_back(static_cast<int32_t>(own));
    sample_distinct(row_rng, 0, own, topk - 1, picks);
  }
  picks.resize(topk, -1);
  // Order must not matter (contract §2), and empty slots may sit anywhere in the row.
  row_rng.shuffle(picks.data(), topk);
  std::copy(picks.begin(), picks.end(), row);
}

}  // namespace msa::cli
