// Attention with fp8 e4m3 K/V and the per-tensor scales (q_scale, k_scale, v_scale) on the CPU backend,
// against the naive float64 reference over the dequantized cache (contract §1, §3).
#include <cmath>
#include <cstring>
#include <limits>

#include "test_util.h"

namespace msa_test {
namespace {

constexpr double kNegInf = -std::numeric_limits<double>::infinity();

// Scales that are not powers of two, so that a scale applied twice, or not at all, shows.
ProblemSpec fp8_spec(std::vector<int32_t> qo, std::vector<int32_t> kv, int topk, KvLayout layout) {
  ProblemSpec s;
  s.qo_lens = std::move(qo);
  s.kv_lens = std::move(kv);
  s.topk = topk;
  s.kv_layout = layout;
  s.fp8_kv = true;
  s.q_scale = 1.7;
  s.k_scale = 0.137;
  s.v_scale = 0.29;
  return s;
}

const char* layout_name(KvLayout l) {
  switch (l) {
    case KvLayout::kContiguous: return "separate pools";
    case KvLayout::kInterleaved: return "halves of one interleaved pool";
    case KvLayout::kSlotMajor: return "slot-major pools";
    case KvLayout::kPadded: return "padded pools";
  }
  return "?";
}

void check(const ProblemSpec& spec) {
  const Problem pr = make_problem(spec);
  ASSERT_EQ(pr.k_view().dtype(), DType::kF8E4M3);
  ASSERT_EQ(pr.v_view().dtype(), DType::kF8E4M3);
  expect_attention_matches(pr, run_attention(pr), naive_attention(pr));
}

TEST(Fp8Attention, PrefillWithPrefixDenseAndSparse) {
  // Chunks after a cached prefix (default offsets), and one with an explicit offset mid-request.
  for (KvLayout layout : {KvLayout::kContiguous, KvLayout::kInterleaved, KvLayout::kSlotMajor}) {
    for (int topk : {0, 4}) {
      SCOPED_TRACE(std::string(layout_name(layout)) + (topk ? ", sparse" : ", dense"));
      ProblemSpec s = fp8_spec({100, 37, 1}, {600, 300, 129}, topk, layout);
      if (layout == KvLayout::kSlotMajor) s.page_size = 16;
      check(s);
      s.qo_lens = {64, 50};
      s.kv_lens = {700, 400};
      s.qo_offset = {300, 129};
      check(s);
    }
  }
}

TEST(Fp8Attention, DecodeDenseAndSparse) {
  // A decode plan: batch * max_qo_len rows of q, the rows past the last request see no key.
  for (KvLayout layout : {KvLayout::kContiguous, KvLayout::kInterleaved}) {
    for (int topk : {0, 4}) {
      SCOPED_TRACE(std::string(layout_name(layout)) + (topk ? ", sparse" : ", dense"));
      ProblemSpec s = fp8_spec({1, 3, 0, 2}, {300, 129, 57, 1000}, topk, layout);
      s.decode = true;
      const Problem pr = make_problem(s);
      const AttnResult r = run_attention(pr);
      expect_attention_matches(pr, r, naive_attention(pr));
      expect_padding_rows_empty(pr, r);
    }
  }
}

TEST(Fp8Attention, EmptySlotsAndEmptyRows) {
  // Rows with -1 slots anywhere (random_rows) and rows with every slot -1: o = 0 and lse = -inf there.
  for (KvLayout layout : {KvLayout::kContiguous, KvLayout::kInterleaved}) {
    SCOPED_TRACE(layout_name(layout));
    ProblemSpec s = fp8_spec({200, 90}, {500, 90}, 4, layout);
    s.empty_row_prob = 0.4;
    const Problem pr = make_problem(s);
    int64_t empty_slots = 0;
    for (int64_t t = 0; t < pr.total_q; ++t)
      for (int64_t g = 0; g < s.num_kv_heads; ++g)
        for (int i = 0; i < s.topk; ++i) empty_slots += pr.rows.at(t, g, i) < 0;
    EXPECT_GT(empty_slots, 0);
    const AttnResult r = run_attention(pr);
    int64_t empty_rows = 0;
    for (int64_t t = 0; t < pr.total_q; ++t)
      for (int64_t h = 0; h < s.num_qo_heads; ++h) empty_rows += r.lse_at(t, h) == kNegInf;
    EXPECT_GT(empty_rows, 0);
    expect_attention_matches(pr, r, naive_attention(pr));
  }
}

TEST(Fp8Attention, Float16AndFloat32Queries) {
  // The output takes q's dtype; fp32 q on the CPU holds fp32's tolerance, so the dequantization is exact.
  for (DType dt : {DType::kF16, DType::kF32}) {
    SCOPED_TRACE(msa::dtype_name(dt));
    ProblemSpec s = fp8_spec({120, 31}, {500, 31}, 4, KvLayout::kInterleaved);
    s.dtype = dt;
    check(s);
  }
}

TEST(Fp8Attention, PowerOfTwoScalesEqualTheDequantizedBf16CacheBitForBit) {
  // With power-of-two scales every product is exact, so fp8 K/V with k_scale / v_scale and a bf16 cache
  // holding the dequantized values (e4m3 value x scale; exact in bf16) must give identical o and lse.
  ProblemSpec s = fp8_spec({100, 20}, {600, 300}, 4, KvLayout::kContiguous);
  s.k_scale = 0.25;
  s.v_scale = 0.5;
  const Problem pr = make_problem(s);
  const AttnResult fp8 = run_attention(pr);

  Buffer kb(DType::kBF16, pr.k.numel()), vb(DType::kBF16, pr.v.numel());
  for (int64_t i = 0; i < kb.numel(); ++i) kb.set(i, pr.k.get(i) * s.k_scale);
  for (int64_t i = 0; i < vb.numel(); ++i) vb.set(i, pr.v.get(i) * s.v_scale);
  const int64_t H = s.num_qo_heads, Dv = pr.dv(), T = pr.total_q;
  Buffer o(DType::kBF16, T * H * Dv);
  std::vector<float> lse(static_cast<size_t>(T * H));
  msa::RunOptions opts;
  opts.q_scale = static_cast<float>(s.q_scale);
  msa::attention(pr.plan, pr.q_view(), kb.view(pr.kv_shape, pr.k_strides),
                 vb.view({pr.kv_shape[0], pr.kv_shape[1], pr.kv_shape[2], Dv}, pr.v_strides), pr.page_table(),
                 pr.seqs(), pr.rows.view(), o.view({T, H, Dv}), TensorView(lse.data(), DType::kF32, {T, H}), opts);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < H; ++h) {
      ASSERT_EQ(std::memcmp(&lse[t * H + h], &fp8.lse[t * fp8.lse_stride + h], sizeof(float)), 0)
          << "lse of token " << t << ", head " << h;
      for (int64_t d = 0; d < Dv; ++d)
        ASSERT_EQ(o.get((t * H + h) * Dv + d), fp8.o_at(t, h, d)) << "o of token " << t << ", head " << h;
    }
}

TEST(ScaledAttention, ScalesApplyToBf16KvToo) {
  // q_scale and k_scale multiply the logits and v_scale the output whatever the cache's dtype.
  for (int topk : {0, 4}) {
    SCOPED_TRACE(topk ? "sparse" : "dense");
    ProblemSpec s;
    s.qo_lens = {100, 37};
    s.kv_lens = {600, 300};
    s.topk = topk;
    s.q_scale = 0.6;
    s.k_scale = 2.3;
    s.v_scale = 0.45;
    const Problem pr = make_problem(s);
    ASSERT_EQ(pr.k_view().dtype(), DType::kBF16);
    expect_attention_matches(pr, run_attention(pr), naive_attention(pr));
  }
}

TEST(ScaledAttention, QAndKScalesAreSmScaleMultiplied) {
  // q_scale * k_scale enter as a factor of sm_scale (multiplied in double, rounded once): the same result
  // bit for bit as a caller folding them into sm_scale.
  ProblemSpec s;
  s.qo_lens = {64, 9};
  s.kv_lens = {256, 300};
  s.topk = 2;
  s.q_scale = 0.6;
  s.k_scale = 2.3;
  const Problem pr = make_problem(s);
  const AttnResult scaled = run_attention(pr);
  ProblemSpec unscaled_spec = s;
  unscaled_spec.q_scale = unscaled_spec.k_scale = 1.0;
  Problem unscaled = make_problem(unscaled_spec);  // the same seed: the same data
  msa::RunOptions opts;
  opts.sm_scale = static_cast<float>(double(1.0f / std::sqrt(64.0f)) * double(0.6f) * double(2.3f));
  const AttnResult folded = run_attention(unscaled, nullptr, opts);
  for (int64_t i = 0; i < scaled.o.numel(); ++i) {
    const double x = scaled.o.get(i), y = folded.o.get(i);
    ASSERT_TRUE(x == y || (std::isnan(x) && std::isnan(y))) << "o element " << i;
  }
  EXPECT_EQ(scaled.lse, folded.lse);
}

}  // namespace
}  // namespace msa_test
