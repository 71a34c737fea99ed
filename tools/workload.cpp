#include "workload.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "bf16.h"
#include "fp8.h"
#include "parallel.h"
#include "rng.h"
#include "selection.h"

namespace msa::cli {

namespace {

// Pages in the pool beyond those the requests use, so that physical ids do not tile [0, n) exactly.
constexpr int64_t kSparePages = 3;

enum : uint64_t {
  kTagQ = 11,
  kTagK = 12,
  kTagV = 13,
  kTagPages = 14,
  kTagSelectRow = 15,
  kTagSelectBlock = 16,
  kTagQIndex = 17,
  kTagKIndex = 18
};

// Unit-normal values rounded to bf16. Box-Muller on one 64-bit hash per pair of values, so element
// i depends only on (key, i): any thread may fill any range and the data is the same for every
// thread count.
void fill_normal_bf16(Bf16Array& a, uint64_t key) {
  constexpr int64_t kGrainPairs = 1 << 16;
  const int64_t pairs = (a.size + 1) / 2;
  uint16_t* out = a.data.get();
  const int64_t n = a.size;
  parallel_for(pairs, kGrainPairs, [&](int64_t begin, int64_t end) {
    for (int64_t j = begin; j < end; ++j) {
      const uint64_t h = splitmix64(key + static_cast<uint64_t>(j));
      const float u1 = (static_cast<float>(h >> 40) + 0.5f) * 0x1p-24f;  // (0, 1): log(u1) is finite
      const float u2 = static_cast<float>(h & 0xffffffu) * 0x1p-24f;
      const float r = std::sqrt(-2.0f * std::log(u1));
      const float t = 2.0f * std::numbers::pi_v<float> * u2;
      out[2 * j] = bf16_from_float(r * std::cos(t));
      if (2 * j + 1 < n) out[2 * j + 1] = bf16_from_float(r * std::sin(t));
    }
  });
}

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Unit-normal bf16 values (fill_normal_bf16), kept as they are or quantized to fp8 e4m3 with the
// per-tensor scale amax / 448, which maps the largest magnitude onto the largest finite e4m3 value.
KvPool make_kv_pool(KvDtype dtype, int64_t size, uint64_t key) {
  KvPool pool;
  pool.dtype = dtype;
  pool.size = size;
  pool.bf16.allocate(size);
  fill_normal_bf16(pool.bf16, key);
  if (dtype == KvDtype::kBf16) return pool;
  const uint16_t* x = pool.bf16.data.get();
  float amax = 0.0f;
  for (int64_t i = 0; i < size; ++i) amax = std::max(amax, std::fabs(bf16_to_float(x[i])));
  pool.scale = amax > 0.0f ? amax / kFp8E4M3Max : 1.0f;
  pool.fp8.reset(new uint8_t[static_cast<size_t>(size)]);
  uint8_t* codes = pool.fp8.get();
  const float inv = 1.0f / pool.scale;
  parallel_for(size, 1 << 16, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) codes[i] = fp8e4m3_from_float(bf16_to_float(x[i]) * inv);
  });
  pool.bf16 = Bf16Array();  // the bf16 values were only the source of the quantization
  return pool;
}

}  // namespace

void KvPool::load(int64_t offset, int n, double* out) const {
  if (dtype == KvDtype::kFp8) {
    for (int d = 0; d < n; ++d) out[d] = double(fp8e4m3_to_float(fp8[offset + d])) * scale;
    return;
  }
  for (int d = 0; d < n; ++d) out[d] = bf16_to_float(bf16.data[offset + d]);
}

int64_t Workload::request_of(int64_t token) const {
  return std::upper_bound(qo_indptr.begin(), qo_indptr.end(), static_cast<int32_t>(token)) - qo_indptr.begin() - 1;
}

int64_t Workload::position_of(int64_t token) const {
  const int64_t b = request_of(token);
  return int64_t(kv_lens[b]) - qo_lens[b] + (token - qo_indptr[b]);
}

std::vector<int32_t> Workload::selected_blocks(int64_t token, int kv_head) const {
  const int64_t nb = ceil_div(kv_lens[request_of(token)], cfg.block_size);
  std::vector<int32_t> blocks;
  if (cfg.topk == 0) {
    for (int32_t e = 0; e < nb; ++e) blocks.push_back(e);
    return blocks;
  }
  const int32_t* row = block_idx.data() + (token * cfg.num_kv_heads + kv_head) * cfg.topk;
  for (int i = 0; i < cfg.topk; ++i)
    if (row[i] >= 0 && row[i] < nb) blocks.push_back(row[i]);
  std::sort(blocks.begin(), blocks.end());
  blocks.erase(std::unique(blocks.begin(), blocks.end()), blocks.end());
  return blocks;
}

int64_t Workload::kv_offset(int64_t b, int64_t key, int g) const {
  const int64_t page = page_table[b * max_pages + key / cfg.page_size];
  return ((page * cfg.num_kv_heads + g) * cfg.page_size + key % cfg.page_size) * cfg.head_dim;
}

int64_t Workload::index_k_offset(int64_t b, int64_t key) const {
  const int64_t page = page_table[b * max_pages + key / cfg.page_size];
  return (page * kIndexKHeads * cfg.page_size + key % cfg.page_size) * kIndexHeadDim;
}

int64_t workload_bytes(const WorkloadSpec& s) {
  const int64_t pages = s.batch * ceil_div(s.kv_len, kPageSize) + kSparePages;
  const int64_t q_elems = s.batch * s.qo_len * kNumQoHeads * kHeadDim;
  // q, o (read back for the check), k, v: two bf16 pools, or two fp8 pools quantized one after the other
  // from bf16 values (the same peak).
  const int64_t kv_elems = pages * kNumKvHeads * kPageSize * kHeadDim;
  int64_t bytes = 2 * 2 * q_elems + 4 * kv_elems;
  if (s.pattern == Pattern::kIndexer && !s.dense)  // index q and K (bf16), the fp32 scores on the device
    bytes += 2 * (s.batch * s.qo_len * kNumKvHeads * kIndexHeadDim + pages * kIndexKHeads * kPageSize * kIndexHeadDim) +
             4 * s.batch * s.qo_len * kNumKvHeads * ceil_div(s.kv_len, kBlockSize);
  return bytes;
}

Workload make_workload(const WorkloadSpec& s) {
  Workload w;
  w.phase = s.phase;
  w.cfg.num_qo_heads = kNumQoHeads;
  w.cfg.num_kv_heads = kNumKvHeads;
  w.cfg.head_dim = kHeadDim;
  w.cfg.page_size = kPageSize;
  w.cfg.block_size = kBlockSize;
  w.cfg.topk = s.dense ? 0 : kTopk;
  w.cfg.causal = true;

  const int64_t B = s.batch;
  w.qo_lens.assign(B, static_cast<int32_t>(s.qo_len));
  w.kv_lens.assign(B, static_cast<int32_t>(s.kv_len));
  w.qo_indptr.resize(B + 1);
  for (int64_t b = 0; b <= B; ++b) w.qo_indptr[b] = static_cast<int32_t>(b * s.qo_len);
  w.total_q = B * s.qo_len;

  // Physical pages: a shuffled permutation of the pool, the spares left unreferenced.
  w.max_pages = ceil_div(s.kv_len, kPageSize);
  w.num_pages = B * w.max_pages + kSparePages;
  std::vector<int32_t> perm(w.num_pages);
  for (int64_t i = 0; i < w.num_pages; ++i) perm[i] = static_cast<int32_t>(i);
  Rng(stream_key(s.seed, {kTagPages})).shuffle(perm.data(), w.num_pages);
  w.page_table.assign(perm.begin(), perm.begin() + B * w.max_pages);

  w.q.allocate(w.total_q * kNumQoHeads * kHeadDim);
  fill_normal_bf16(w.q, stream_key(s.seed, {kTagQ}));
  const int64_t kv_elems = w.num_pages * kNumKvHeads * kPageSize * kHeadDim;
  w.k = make_kv_pool(s.kv_dtype, kv_elems, stream_key(s.seed, {kTagK}));
  w.v = make_kv_pool(s.kv_dtype, kv_elems, stream_key(s.seed, {kTagV}));

  w.max_blocks = ceil_div(s.kv_len, kBlockSize);
  if (!s.dense && s.pattern == Pattern::kIndexer) {
    w.indexer = true;
    w.q_index.allocate(w.total_q * kNumKvHeads * kIndexHeadDim);
    w.k_index.allocate(w.num_pages * kIndexKHeads * kPageSize * kIndexHeadDim);
    fill_normal_bf16(w.q_index, stream_key(s.seed, {kTagQIndex}));
    fill_normal_bf16(w.k_index, stream_key(s.seed, {kTagKIndex}));
    w.block_idx.assign(w.total_q * kNumKvHeads * kTopk, -1);
  } else if (!s.dense) {
    w.block_idx.resize(w.total_q * kNumKvHeads * kTopk);
    parallel_for(w.total_q, 256, [&](int64_t begin, int64_t end) {
      for (int64_t t = begin; t < end; ++t) {
        const int64_t b = w.request_of(t), pos = w.position_of(t);
        for (int g = 0; g < kNumKvHeads; ++g) {
          const auto ug = static_cast<uint64_t>(g);
          const uint64_t row_key = stream_key(s.seed, {kTagSelectRow, static_cast<uint64_t>(t), ug});
          const uint64_t block_key =
              stream_key(s.seed, {kTagSelectBlock, static_cast<uint64_t>(b), static_cast<uint64_t>(pos / kBlockSize), ug});
          select_blocks(s.pattern, pos, kBlockSize, kTopk, row_key, block_key,
                        &w.block_idx[(t * kNumKvHeads + g) * kTopk]);
        }
      }
    });
  }
  return w;
}

}  // namespace msa::cli
