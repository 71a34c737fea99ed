// merge_states on the CPU backend: split-KV states merged by their LSEs equal the unsplit result.
#include <cmath>
#include <limits>

#include "test_util.h"

namespace msa_test {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// Splits every row's entries into two disjoint groups in their original slots: alternately, except
// every fifth row, which gives all of them to the first group (the second is then empty: lse -inf).
void split_rows(const IndexRows& all, IndexRows& first, IndexRows& second) {
  first = IndexRows(all.tokens, all.heads, all.topk, all.head_major);
  second = first;
  for (int64_t t = 0; t < all.tokens; ++t)
    for (int64_t g = 0; g < all.heads; ++g) {
      int n = 0;
      for (int i = 0; i < all.topk; ++i) {
        const int32_t e = all.at(t, g, i);
        if (e < 0) continue;
        ((n++ % 2 == 0 || t % 5 == 0) ? first : second).at(t, g, i) = e;
      }
    }
}

// Runs each group as its own sparse attention into slices of one [2, T, H, Dv] buffer, merges into o_dtype.
AttnResult split_and_merge(const Problem& pr, DType o_dtype) {
  IndexRows first, second;
  split_rows(pr.rows, first, second);
  const int64_t T = pr.total_q, H = pr.spec.num_qo_heads, Dv = pr.dv();
  Buffer parts(pr.spec.dtype, 2 * T * H * Dv);
  std::vector<float> lse_parts(static_cast<size_t>(2 * T * H));
  for (int s = 0; s < 2; ++s)
    msa::attention(pr.plan, pr.q_view(), pr.k_view(), pr.v_view(), pr.page_table(), pr.seqs(),
                   (s ? second : first).view(), parts.view_at(s * T * H * Dv, {T, H, Dv}),
                   TensorView(lse_parts.data() + s * T * H, DType::kF32, {T, H}));
  AttnResult merged;
  merged.o = Buffer(o_dtype, T * H * Dv);
  merged.o.fill(std::nan(""));
  merged.o_strides = {H * Dv, Dv};
  merged.lse.assign(static_cast<size_t>(T * H), std::nanf(""));
  merged.lse_stride = H;
  msa::merge_states(parts.view({2, T, H, Dv}), TensorView(lse_parts.data(), DType::kF32, {2, T, H}),
                    merged.o.view({T, H, Dv}), TensorView(merged.lse.data(), DType::kF32, {T, H}));
  return merged;
}

ProblemSpec split_spec(DType dt) {
  ProblemSpec s;
  s.dtype = dt;
  s.qo_lens = {200, 60};
  s.kv_lens = {900, 60};
  s.topk = 6;
  s.empty_row_prob = 0.1;
  return s;
}

TEST(MergeStates, SplitStatesEqualTheUnsplitResultBf16) {
  const Problem pr = make_problem(split_spec(DType::kBF16));
  const AttnResult merged = split_and_merge(pr, DType::kBF16);
  expect_attention_matches(pr, merged, naive_attention(pr));
  // And against the unsplit run itself: both are bf16 roundings of the same value.
  const AttnResult whole = run_attention(pr);
  double max_abs = 0;
  for (int64_t i = 0; i < whole.o.numel(); ++i)
    max_abs = std::max(max_abs, std::fabs(whole.o.get(i) - merged.o.get(i)));
  EXPECT_LT(max_abs, 2e-2);
}

TEST(MergeStates, SplitStatesEqualTheUnsplitResultFp32) {
  const Problem pr = make_problem(split_spec(DType::kF32));
  expect_attention_matches(pr, split_and_merge(pr, DType::kF32), naive_attention(pr));
}

TEST(MergeStates, Fp32PartsIntoBf16Output) {
  ProblemSpec s = split_spec(DType::kF32);
  const Problem pr = make_problem(s);
  const AttnResult merged = split_and_merge(pr, DType::kBF16);
  Problem as_bf16 = pr;  // the comparison uses bf16 tolerances for the bf16 output
  as_bf16.spec.dtype = DType::kBF16;
  expect_attention_matches(as_bf16, merged, naive_attention(pr));
}

TEST(MergeStates, RandomPartsStridedAgainstFormula) {
  // v_parts stored [T, S, H, D] and seen as [S, T, H, D]; some parts at -inf with NaN values.
  const int64_t S = 3, T = 5, H = 4, D = 32;
  Rng rng(3);
  Buffer v(DType::kF32, T * S * H * D);
  std::vector<float> lse(static_cast<size_t>(S * T * H));
  for (int64_t i = 0; i < v.numel(); ++i) v.set(i, rng.normal());
  for (float& x : lse) x = rng.uniform() < 0.25 ? kNegInf : static_cast<float>(rng.uniform(-3, 3));
  const std::vector<int64_t> v_strides = {H * D, S * H * D, D, 1};
  for (int64_t s = 0; s < S; ++s)
    for (int64_t t = 0; t < T; ++t)
      for (int64_t h = 0; h < H; ++h)
        if (lse[(s * T + t) * H + h] == kNegInf)
          for (int64_t d = 0; d < D; ++d) v.set(s * v_strides[0] + t * v_strides[1] + h * v_strides[2] + d, NAN);
  Buffer o(DType::kF32, T * H * D);
  std::vector<float> lse_out(static_cast<size_t>(T * H));
  msa::merge_states(v.view({S, T, H, D}, v_strides), TensorView(lse.data(), DType::kF32, {S, T, H}),
                    o.view({T, H, D}), TensorView(lse_out.data(), DType::kF32, {T, H}));
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < H; ++h) {
      double total = 0;
      for (int64_t s = 0; s < S; ++s) total += std::exp(double(lse[(s * T + t) * H + h]));
      const double want_lse = std::log(total);
      if (total == 0) EXPECT_EQ(lse_out[t * H + h], kNegInf);
      else EXPECT_NEAR(lse_out[t * H + h], want_lse, 1e-5);
      for (int64_t d = 0; d < D; ++d) {
        double want = 0;
        for (int64_t s = 0; s < S; ++s) {
          const double l = lse[(s * T + t) * H + h];
          if (l == kNegInf) continue;
          want += std::exp(l - want_lse) * v.get(s * v_strides[0] + t * v_strides[1] + h * v_strides[2] + d);
        }
        EXPECT_NEAR(o.get((t * H + h) * D + d), want, 1e-5) << "t " << t << " h " << h << " d " << d;
      }
    }
}

// Two parts of one token and head: returns (o[0], lse).
std::pair<double, float> merge_two(float lse0, float v0, float lse1, float v1) {
  Buffer v(DType::kF32, 2);
  v.set(0, v0);
  v.set(1, v1);
  std::vector<float> lse = {lse0, lse1}, lse_out = {0};
  Buffer o(DType::kF32, 1);
  msa::merge_states(v.view({2, 1, 1, 1}), TensorView(lse.data(), DType::kF32, {2, 1, 1}), o.view({1, 1, 1}),
                    TensorView(lse_out.data(), DType::kF32, {1, 1}));
  return {o.get(0), lse_out[0]};
}

TEST(MergeStates, AllPartsEmptyGiveZeroAndNegInf) {
  const auto [o, lse] = merge_two(kNegInf, NAN, kNegInf, NAN);
  EXPECT_EQ(o, 0.0);
  EXPECT_EQ(lse, kNegInf);
}

TEST(MergeStates, EmptyPartIsNotRead) {
  const auto [o, lse] = merge_two(kNegInf, NAN, 0.3f, 2.5f);
  EXPECT_EQ(o, 2.5);
  EXPECT_FLOAT_EQ(lse, 0.3f);
}

TEST(MergeStates, EqualPartsAverage) {
  const auto [o, lse] = merge_two(1.0f, 1.0f, 1.0f, 3.0f);
  EXPECT_NEAR(o, 2.0, 1e-6);
  EXPECT_NEAR(lse, 1.0 + std::log(2.0), 1e-6);
}

TEST(MergeStates, NanLsePropagates) {
  // A NaN input state is not silently dropped.
  const auto [o, lse] = merge_two(NAN, 1.0f, 0.5f, 1.0f);
  EXPECT_TRUE(std::isnan(o));
  EXPECT_TRUE(std::isnan(lse));
}

}  // namespace
}  // namespace msa_test
