// merge_candidates on the CPU backend: the selection of select_topk over the THK rows that hold each candidate's
// score at its block id and NaN elsewhere (a block proposed twice keeps the higher score), over random batches
// with ties, NaN, -inf, empty (-1) and out-of-range ids, forced blocks, prefixes, causal or not; and its checks.
#include <cmath>
#include <limits>

#include "test_util.h"

namespace msa_test {
namespace {

constexpr int kBlock = 128;
const float kNan = std::numeric_limits<float>::quiet_NaN();
const float kInf = std::numeric_limits<float>::infinity();

struct MergeCase {
  std::vector<int32_t> qo, kv;
  int ranks = 3, per_rank = 4, topk = 5, fb = 0, fe = 1;
  bool causal = true;
  int extra_blocks = 2;  // max_blocks past ceil(max kv_len / 128)
};

// Keeps the higher of two scores, NaN lowest (the rule for a block proposed twice).
float higher(float cur, float s) { return std::isnan(cur) || (!std::isnan(s) && s > cur) ? s : cur; }

void check_merge(const MergeCase& c, uint64_t seed) {
  Rng rng(seed);
  const int64_t H = 2, N = c.ranks, K = c.per_rank, B = static_cast<int64_t>(c.qo.size());
  std::vector<int32_t> qo_indptr = {0}, offset;
  int64_t NB = 1;
  for (int64_t b = 0; b < B; ++b) {
    qo_indptr.push_back(qo_indptr.back() + c.qo[b]);
    offset.push_back(std::max(c.kv[b] - c.qo[b] - static_cast<int32_t>(rng.randint(0, 1)), 0));  // some end early
    NB = std::max<int64_t>(NB, (c.kv[b] + kBlock - 1) / kBlock);
  }
  NB += c.extra_blocks;
  const int64_t T = qo_indptr.back();
  // Candidates [N, T, H, K], the ids drawn from [-2, NB + 1]: empty and out-of-range slots, duplicates.
  std::vector<float> cs(static_cast<size_t>(N * T * H * K));
  std::vector<int32_t> ci(cs.size());
  for (size_t i = 0; i < cs.size(); ++i) {
    const double u = rng.uniform();
    cs[i] = u < 0.1 ? kNan : u < 0.2 ? -kInf : static_cast<float>(rng.randint(-4, 4));
    ci[i] = static_cast<int32_t>(rng.randint(-2, NB + 1));
  }
  // The rows they stand for: [T, H, NB], NaN where nothing was proposed.
  std::vector<float> dense(static_cast<size_t>(T * H * NB), kNan);
  for (int64_t r = 0; r < N; ++r)
    for (int64_t t = 0; t < T; ++t)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t k = 0; k < K; ++k) {
          const size_t i = static_cast<size_t>(((r * T + t) * H + h) * K + k);
          if (ci[i] >= 0 && ci[i] < NB) {
            float& d = dense[static_cast<size_t>((t * H + h) * NB + ci[i])];
            d = higher(d, cs[i]);
          }
        }
  const msa::Sequences seqs{int_view(qo_indptr), int_view(c.kv), int_view(offset)};
  std::vector<int32_t> want(static_cast<size_t>(T * H * c.topk), 777), got(want.size(), 777);
  const int64_t d_shape[3] = {T, H, NB}, d_strides[3] = {H * NB, NB, 1};
  const int64_t o_shape[3] = {T, H, c.topk}, o_strides[3] = {H * c.topk, c.topk, 1};
  msa::select_topk(TensorView(dense.data(), DType::kF32, 3, d_shape, d_strides), msa::ScoreLayout::kTHK, seqs, c.topk,
                   c.fb, c.fe, TensorView(want.data(), DType::kI32, 3, o_shape, o_strides), c.causal);
  // Candidates read through permuted strides: stored [T, N, K, H].
  std::vector<float> cs_p(cs.size());
  std::vector<int32_t> ci_p(ci.size());
  for (int64_t r = 0; r < N; ++r)
    for (int64_t t = 0; t < T; ++t)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t k = 0; k < K; ++k) {
          const size_t src = static_cast<size_t>(((r * T + t) * H + h) * K + k);
          const size_t dst = static_cast<size_t>(((t * N + r) * K + k) * H + h);
          cs_p[dst] = cs[src];
          ci_p[dst] = ci[src];
        }
  const int64_t c_shape[4] = {N, T, H, K}, c_strides[4] = {K * H, N * K * H, 1, H};
  msa::merge_candidates(TensorView(cs_p.data(), DType::kF32, 4, c_shape, c_strides),
                        TensorView(ci_p.data(), DType::kI32, 4, c_shape, c_strides), seqs, static_cast<int>(NB),
                        c.topk, c.fb, c.fe, TensorView(got.data(), DType::kI32, 3, o_shape, o_strides), c.causal);
  EXPECT_EQ(got, want) << "seed " << seed;
}

TEST(MergeCandidates, IsSelectTopkOverTheScatteredRows) {
  for (uint64_t seed = 1; seed <= 6; ++seed) {
    check_merge({{1, 3, 1, 2}, {900, 1500, 100, 2000}}, seed);
    check_merge({{1, 1, 1}, {4000, 129, 1}, 8, 16, 16, 0, 1, true, 0}, seed);
    check_merge({{5, 2}, {1300, 700}, 2, 8, 6, 1, 2, false, 3}, seed);
    check_merge({{2, 1}, {3000, 2600}, 1, 30, 4, 0, 0, true, 1}, seed);
  }
}

TEST(MergeCandidates, ABlockProposedTwiceKeepsTheHigherScore) {
  // One token at position 1279 (10 blocks), top-3 with the last block forced; block 2 is proposed with 1, NaN
  // and 9 by three ranks, block 5 with 8, block 7 with -inf.
  const std::vector<int32_t> qo_indptr = {0, 1}, kv = {1280}, offset = {1279};
  std::vector<float> cs = {1, 8, kNan, -kInf, 9, kNan};
  std::vector<int32_t> ci = {2, 5, 2, 7, 2, -1};
  std::vector<int32_t> out(3, 777);
  const int64_t c_shape[4] = {3, 1, 1, 2}, c_strides[4] = {2, 2, 2, 1};
  const int64_t o_shape[3] = {1, 1, 3}, o_strides[3] = {3, 3, 1};
  msa::merge_candidates(TensorView(cs.data(), DType::kF32, 4, c_shape, c_strides),
                        TensorView(ci.data(), DType::kI32, 4, c_shape, c_strides),
                        {int_view(qo_indptr), int_view(kv), int_view(offset)}, 10, 3, 0, 1,
                        TensorView(out.data(), DType::kI32, 3, o_shape, o_strides));
  EXPECT_EQ(out, (std::vector<int32_t>{2, 5, 9}));
}

TEST(MergeCandidates, ChecksItsArguments) {
  const std::vector<int32_t> qo_indptr = {0, 1}, kv = {1280};
  std::vector<float> cs(6, 1.f);
  std::vector<int32_t> ci(6, 0), out(3, 0);
  const int64_t c_shape[4] = {3, 1, 1, 2}, c_strides[4] = {2, 2, 2, 1};
  const int64_t i_shape[4] = {3, 1, 1, 1}, i_strides[4] = {1, 1, 1, 1};
  const int64_t o_shape[3] = {1, 1, 3}, o_strides[3] = {3, 3, 1};
  const TensorView s(cs.data(), DType::kF32, 4, c_shape, c_strides), ids(ci.data(), DType::kI32, 4, c_shape, c_strides);
  const TensorView o(out.data(), DType::kI32, 3, o_shape, o_strides);
  const msa::Sequences seqs{int_view(qo_indptr), int_view(kv), {}};
  expect_msa_error([&] { msa::merge_candidates(s, TensorView(ci.data(), DType::kI32, 4, i_shape, i_strides), seqs, 10, 3, 0, 1, o); },
                   msa::ErrorKind::kValue, {"msa.merge_candidates", "cand_ids", "k"});
  expect_msa_error([&] { msa::merge_candidates(ids, ids, seqs, 10, 3, 0, 1, o); }, msa::ErrorKind::kType,
                   {"msa.merge_candidates", "cand_scores", "float32"});
  expect_msa_error([&] { msa::merge_candidates(s, ids, seqs, 9, 3, 0, 1, o); }, msa::ErrorKind::kValue,
                   {"msa.merge_candidates", "max_blocks", ">= 10", "got 9"});
  expect_msa_error([&] { msa::merge_candidates(s, ids, seqs, 10, 3, 2, 2, o); }, msa::ErrorKind::kValue,
                   {"msa.merge_candidates", "force_begin", "force_end"});
}

}  // namespace
}  // namespace msa_test
