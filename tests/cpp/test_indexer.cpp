// The indexer's two steps on the CPU backend (contract §4): block_scores against a float64 max of
// dot products, select_topk against a selection written as plain repeated "take the best".
#include <cmath>
#include <limits>
#include <tuple>

#include "test_util.h"

namespace msa_test {
namespace {

constexpr int kBlock = 128;
constexpr double kInf = std::numeric_limits<double>::infinity();
using msa::ScoreLayout;

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// ---- block_scores ----

// A [T, H, NB] float buffer in either layout, optionally with padded strides.
struct ScoreTensor {
  int64_t T, H, NB;
  ScoreLayout layout;
  std::vector<int64_t> strides;  // of the view's dims, in its own order
  std::vector<float> mem;
  ScoreTensor(int64_t T_, int64_t H_, int64_t NB_, ScoreLayout layout_, int64_t pad = 0)
      : T(T_), H(H_), NB(NB_), layout(layout_) {
    if (layout == ScoreLayout::kHKT) strides = {NB * (T + pad), T + pad, 1};
    else strides = {H * (NB + pad), NB + pad, 1};
    mem.assign(static_cast<size_t>(strides[0] * (layout == ScoreLayout::kHKT ? H : T)), std::nanf(""));
  }
  int64_t offset(int64_t t, int64_t h, int64_t blk) const {
    return layout == ScoreLayout::kHKT ? h * strides[0] + blk * strides[1] + t : t * strides[0] + h * strides[1] + blk;
  }
  float& at(int64_t t, int64_t h, int64_t blk) { return mem[offset(t, h, blk)]; }
  float at(int64_t t, int64_t h, int64_t blk) const { return mem[offset(t, h, blk)]; }
  TensorView view() const {
    const std::vector<int64_t> shape =
        layout == ScoreLayout::kHKT ? std::vector<int64_t>{H, NB, T} : std::vector<int64_t>{T, H, NB};
    return TensorView(const_cast<float*>(mem.data()), DType::kF32, 3, shape.data(), strides.data());
  }
};

// max over visible keys of the block of q . k (fp8: k * its scale), -inf where none: [T, H, NB].
std::vector<double> naive_block_scores(const Problem& pr, int64_t NB) {
  const int64_t H = pr.spec.num_qo_heads, Hk = pr.spec.num_kv_heads, D = pr.spec.head_dim, P = pr.spec.page_size;
  std::vector<double> out(static_cast<size_t>(pr.total_q * H * NB), -kInf);
  for (int64_t b = 0; b < pr.batch; ++b)
    for (int64_t i = 0; i < pr.qo_len(b); ++i) {
      const int64_t t = pr.qo_indptr[b] + i, pos = pr.position(b, i);
      for (int64_t h = 0; h < H; ++h) {
        const int64_t kg = h / (H / Hk);
        for (int64_t j = 0; j < pr.kv_lens[b] && (!pr.spec.causal || j <= pos); ++j) {
          const int64_t page = pr.pages_of[b][j / P];
          if (page < 0) continue;
          const int64_t row = page * pr.k_strides[0] + kg * pr.k_strides[1] + (j % P) * pr.k_strides[2];
          const double scale = pr.k_scale.numel()
              ? pr.k_scale.get(page * pr.ks_strides[0] + kg * pr.ks_strides[1] + (j % P) * pr.ks_strides[2])
              : 1.0;
          double dot = 0;
          for (int64_t d = 0; d < D; ++d) dot += pr.q.get((t * H + h) * D + d) * pr.k.get(row + d) * scale;
          double& best = out[(t * H + h) * NB + j / kBlock];
          best = std::max(best, dot);
        }
      }
    }
  return out;
}

ScoreTensor run_block_scores(const Problem& pr, int64_t NB, ScoreLayout layout, int64_t pad = 0) {
  ScoreTensor s(pr.total_q, pr.spec.num_qo_heads, NB, layout, pad);
  msa::block_scores(pr.q_view(), pr.k_view(), pr.k_scale_view(), pr.page_table(), pr.seqs(), s.view(), layout,
                    pr.spec.causal);
  return s;
}

void expect_scores_match(const Problem& pr, const ScoreTensor& got, const std::vector<double>& ref) {
  int64_t mismatches = 0;
  double max_err = 0;
  for (int64_t t = 0; t < got.T; ++t)
    for (int64_t h = 0; h < got.H; ++h)
      for (int64_t blk = 0; blk < got.NB; ++blk) {
        const double x = got.at(t, h, blk), y = ref[(t * got.H + h) * got.NB + blk];
        if (std::isnan(x) || (y == -kInf) != (x == -kInf)) {
          ++mismatches;
          continue;
        }
        if (y != -kInf) max_err = std::max(max_err, std::fabs(x - y) / (1.0 + std::fabs(y)));
      }
  EXPECT_EQ(mismatches, 0) << "elements that are NaN (unwritten) or disagree on -inf";
  // fp32 sums of head_dim products of unit-scale values: ~1e-6 relative.
  EXPECT_LT(max_err, 1e-4);
}

void check_block_scores(const ProblemSpec& spec, int64_t extra_blocks = 2, int64_t pad = 0) {
  const Problem pr = make_problem(spec);
  int64_t NB = 0;
  for (int32_t kl : spec.kv_lens) NB = std::max<int64_t>(NB, ceil_div(kl, kBlock));
  NB += extra_blocks;  // blocks past every request's end must come back -inf
  const std::vector<double> ref = naive_block_scores(pr, NB);
  for (ScoreLayout layout : {ScoreLayout::kHKT, ScoreLayout::kTHK}) {
    SCOPED_TRACE(layout == ScoreLayout::kHKT ? "HKT" : "THK");
    expect_scores_match(pr, run_block_scores(pr, NB, layout, pad), ref);
  }
}

ProblemSpec index_spec(std::vector<int32_t> qo, std::vector<int32_t> kv) {
  // M3's indexer: 4 index heads sharing one index-K head.
  ProblemSpec s;
  s.qo_lens = std::move(qo);
  s.kv_lens = std::move(kv);
  s.num_qo_heads = 4;
  s.num_kv_heads = 1;
  s.head_dim = 64;
  return s;
}

TEST(BlockScores, CausalPrefixesBothLayouts) { check_block_scores(index_spec({100, 30, 1}, {600, 30, 129})); }

TEST(BlockScores, NonCausalWithOffsets) {
  ProblemSpec s = index_spec({40, 10}, {500, 0});
  s.causal = false;
  s.qo_offset = {7, 0};
  check_block_scores(s);
}

TEST(BlockScores, ChunkWithExplicitOffset) {
  ProblemSpec s = index_spec({64}, {700});
  s.qo_offset = {300};
  check_block_scores(s);
}

TEST(BlockScores, Fp8KeysWithPerTokenScales) {
  ProblemSpec s = index_spec({90, 20}, {450, 200});
  s.k_dtype = DType::kF8E4M3;
  s.num_kv_heads = 2;
  check_block_scores(s);
}

TEST(BlockScores, Float16AndFloat32Queries) {
  for (DType dt : {DType::kF16, DType::kF32}) {
    SCOPED_TRACE(msa::dtype_name(dt));
    ProblemSpec s = index_spec({70}, {300});
    s.dtype = dt;
    check_block_scores(s);
  }
}

TEST(BlockScores, PagedLayoutsAndPaddedOutput) {
  ProblemSpec s = index_spec({80, 33}, {500, 260});
  s.page_size = 16;
  s.kv_layout = KvLayout::kSlotMajor;
  s.flat_table = true;
  check_block_scores(s, 1, 3);
}

TEST(BlockScores, TheCpuBackendRefusesPageIdsOutsideThePool) {
  // The GPU kernels skip such pages (GPU tests); the CPU backend reads the table on the host and refuses them.
  Problem pr = make_problem(index_spec({120}, {500}));
  pr.set_page(0, 3, pr.num_pages);
  expect_msa_error([&] { run_block_scores(pr, 4, ScoreLayout::kTHK); }, msa::ErrorKind::kValue,
                   {"msa.block_scores", "'page_table'", "request 0, logical page 3",
                    "got " + std::to_string(pr.num_pages)});
}

// ---- select_topk ----

// Ranking key of a block: NaN below everything, then the score, then the lower index first.
std::tuple<int, double, int64_t> rank_key(float score, int64_t blk) {
  if (std::isnan(score)) return {0, 0.0, -blk};
  return {1, score, -blk};
}

std::vector<int32_t> naive_select(const std::function<float(int64_t)>& score, int64_t valid, int topk, int fb,
                                  int fe) {
  std::vector<int32_t> chosen;
  if (valid <= topk) {
    for (int32_t blk = 0; blk < valid; ++blk) chosen.push_back(blk);
  } else {
    std::vector<bool> taken(valid, false);
    for (int64_t blk = 0; blk < valid; ++blk)
      if (blk < fb || blk >= valid - fe) taken[blk] = true;
    for (int n = 0; n < topk - fb - fe; ++n) {
      int64_t best = -1;
      for (int64_t blk = 0; blk < valid; ++blk)
        if (!taken[blk] && (best < 0 || rank_key(score(blk), blk) > rank_key(score(best), best))) best = blk;
      taken[best] = true;
    }
    for (int32_t blk = 0; blk < valid; ++blk)
      if (taken[blk]) chosen.push_back(blk);
  }
  chosen.resize(topk, -1);
  return chosen;
}

struct SelectCase {
  std::vector<int32_t> qo, kv, offset;
  bool causal = true;
  ScoreLayout layout = ScoreLayout::kHKT;
  int topk = 4, fb = 0, fe = 1;
  bool head_major_out = false;
};

// Random scores with many ties (small integers), NaN, -inf and +inf, then select_topk against naive_select.
void check_select(const SelectCase& c, uint64_t seed) {
  Rng rng(seed);
  const int64_t H = 3;
  std::vector<int32_t> qo_indptr = {0};
  int64_t NB = 0;
  for (size_t b = 0; b < c.qo.size(); ++b) {
    qo_indptr.push_back(qo_indptr.back() + c.qo[b]);
    NB = std::max<int64_t>(NB, ceil_div(c.kv[b], kBlock));
  }
  const int64_t T = qo_indptr.back();
  ScoreTensor scores(T, H, NB + 1, c.layout);
  for (float& x : scores.mem) {
    const double u = rng.uniform();
    x = u < 0.1 ? std::nanf("") : u < 0.2 ? -INFINITY : u < 0.25 ? INFINITY : static_cast<float>(rng.randint(0, 4));
  }
  IndexRows out(T, H, c.topk, c.head_major_out);
  std::fill(out.mem.begin(), out.mem.end(), 12345);
  const msa::Sequences seqs{int_view(qo_indptr), int_view(c.kv), c.offset.empty() ? TensorView() : int_view(c.offset)};
  msa::select_topk(scores.view(), c.layout, seqs, c.topk, c.fb, c.fe, out.view(), c.causal);
  int64_t wrong_rows = 0;
  for (size_t b = 0; b < c.qo.size(); ++b)
    for (int64_t i = 0; i < c.qo[b]; ++i) {
      const int64_t t = qo_indptr[b] + i;
      const int64_t pos = (c.offset.empty() ? c.kv[b] - c.qo[b] : c.offset[b]) + i;
      int64_t valid = ceil_div(c.kv[b], kBlock);
      if (c.causal) valid = std::min(valid, pos / kBlock + 1);
      for (int64_t h = 0; h < H; ++h) {
        const auto want = naive_select([&](int64_t blk) { return scores.at(t, h, blk); }, valid, c.topk, c.fb, c.fe);
        for (int i2 = 0; i2 < c.topk; ++i2)
          if (out.at(t, h, i2) != want[i2]) {
            if (wrong_rows++ < 3) ADD_FAILURE() << "token " << t << " head " << h << " slot " << i2 << ": got "
                                                 << out.at(t, h, i2) << ", want " << want[i2];
            break;
          }
      }
    }
  EXPECT_EQ(wrong_rows, 0);
}

TEST(SelectTopk, RandomScoresCausalAllForceCombinations) {
  uint64_t seed = 1;
  for (int topk : {1, 2, 4, 8})
    for (int fb = 0; fb <= 2; ++fb)
      for (int fe = 0; fe <= 2 && fb + fe <= topk; ++fe) {
        SCOPED_TRACE("topk " + std::to_string(topk) + " force_begin " + std::to_string(fb) + " force_end " +
                     std::to_string(fe));
        SelectCase c;
        c.qo = {300, 50, 1};
        c.kv = {1500, 50, 1000};
        c.topk = topk, c.fb = fb, c.fe = fe;
        c.layout = seed % 2 ? ScoreLayout::kHKT : ScoreLayout::kTHK;
        check_select(c, seed++);
      }
}

TEST(SelectTopk, ChunkWithExplicitOffsetAndHeadMajorOutput) {
  SelectCase c;
  c.qo = {200, 30};
  c.kv = {1800, 400};
  c.offset = {1000, 0};
  c.topk = 6, c.fb = 1, c.fe = 1;
  c.head_major_out = true;
  check_select(c, 7);
}

TEST(SelectTopk, NonCausal) {
  SelectCase c;
  c.qo = {20, 5};
  c.kv = {1500, 129};
  c.offset = {0, 3};
  c.causal = false;
  c.topk = 5, c.fb = 2, c.fe = 1;
  c.layout = ScoreLayout::kTHK;
  check_select(c, 9);
}

// One token of one request: scores of one row, the returned block_idx row.
std::vector<int32_t> select_one(const std::vector<float>& row, int32_t kv_len, int32_t pos, int topk, int fb, int fe,
                                bool causal = true) {
  ScoreTensor s(1, 1, static_cast<int64_t>(row.size()), ScoreLayout::kTHK);
  for (size_t i = 0; i < row.size(); ++i) s.at(0, 0, i) = row[i];
  const std::vector<int32_t> qo_indptr = {0, 1}, kv = {kv_len}, offset = {pos};
  IndexRows out(1, 1, topk, false);
  msa::select_topk(s.view(), ScoreLayout::kTHK, {int_view(qo_indptr), int_view(kv), int_view(offset)}, topk, fb, fe,
                   out.view(), causal);
  return out.mem;
}

TEST(SelectTopk, TiesGoToTheLowerBlock) {
  const std::vector<float> row(10, 1.0f);
  EXPECT_EQ(select_one(row, 1280, 1279, 3, 0, 0), (std::vector<int32_t>{0, 1, 2}));
  EXPECT_EQ(select_one({2, 5, 5, 2, 5, 2}, 768, 767, 2, 0, 0), (std::vector<int32_t>{1, 2}));
}

TEST(SelectTopk, NanRanksBelowNegativeInfinity) {
  const float nan = std::nanf("");
  EXPECT_EQ(select_one({nan, -INFINITY, nan, 1.f, nan}, 640, 639, 2, 0, 0), (std::vector<int32_t>{1, 3}));
  EXPECT_EQ(select_one({nan, nan, nan, nan}, 512, 511, 2, 0, 0), (std::vector<int32_t>{0, 1}));
}

TEST(SelectTopk, ForcedBlocksAreAlwaysKept) {
  const float nan = std::nanf("");
  // 8 blocks, valid 0..5 (pos 700); the first and the last two valid ones forced whatever their scores.
  EXPECT_EQ(select_one({nan, 9, 8, 7, -INFINITY, nan, 100, 100}, 900, 700, 4, 1, 2),
            (std::vector<int32_t>{0, 1, 4, 5}));
}

TEST(SelectTopk, FewerValidBlocksThanTopk) {
  EXPECT_EQ(select_one({1, 2, 3, 4}, 300, 299, 5, 0, 1), (std::vector<int32_t>{0, 1, 2, -1, -1}));
  EXPECT_EQ(select_one({1, 2, 3, 4}, 300, 100, 3, 0, 1), (std::vector<int32_t>{0, -1, -1}));  // causal frontier
  EXPECT_EQ(select_one({1, 2, 3, 4}, 300, 0, 3, 0, 1, false), (std::vector<int32_t>{0, 1, 2}));
}

// ---- both steps feeding attention ----

TEST(Indexer, SelectionFeedsSparseAttention) {
  ProblemSpec s;
  s.qo_lens = {150, 40};
  s.kv_lens = {900, 300};
  s.topk = 4;
  const Problem pr = make_problem(s);
  // Index queries [T, Hkv, D] scored against the K cache itself, one index head per KV head.
  Buffer iq(DType::kBF16, pr.total_q * s.num_kv_heads * s.head_dim);
  Rng rng(5);
  for (int64_t i = 0; i < iq.numel(); ++i) iq.set(i, rng.normal());
  ScoreTensor scores(pr.total_q, s.num_kv_heads, 8, ScoreLayout::kHKT);
  msa::block_scores(iq.view({pr.total_q, s.num_kv_heads, s.head_dim}), pr.k_view(), {}, pr.page_table(), pr.seqs(),
                    scores.view(), ScoreLayout::kHKT);
  IndexRows selected(pr.total_q, s.num_kv_heads, s.topk, true);
  msa::select_topk(scores.view(), ScoreLayout::kHKT, pr.seqs(), s.topk, 1, 1, selected.view());
  for (int64_t t = 0; t < pr.total_q; ++t)
    for (int64_t g = 0; g < s.num_kv_heads; ++g)
      ASSERT_GE(selected.at(t, g, 0), 0) << "every token has at least its own block";
  expect_attention_matches(pr, run_attention(pr, &selected), naive_attention(pr, &selected));
}

}  // namespace
}  // namespace msa_test
