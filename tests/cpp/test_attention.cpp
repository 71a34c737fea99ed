// Attention on the CPU backend against the naive float64 reference (contract §2-§3).
#include <chrono>
#include <climits>
#include <cmath>
#include <cstdio>
#include <limits>

#include "test_util.h"

namespace msa_test {
namespace {

constexpr double kNegInf = -std::numeric_limits<double>::infinity();

ProblemSpec spec_of(std::vector<int32_t> qo, std::vector<int32_t> kv, int topk = 0, DType dt = DType::kBF16) {
  ProblemSpec s;
  s.qo_lens = std::move(qo);
  s.kv_lens = std::move(kv);
  s.topk = topk;
  s.dtype = dt;
  return s;
}

void check(const ProblemSpec& spec) {
  const Problem pr = make_problem(spec);
  expect_attention_matches(pr, run_attention(pr), naive_attention(pr));
}

// Runs the problem as given and as sparse with topk (the same lengths, pages and data layout).
void check_dense_and_sparse(ProblemSpec spec, int topk = 4) {
  {
    SCOPED_TRACE("dense");
    spec.topk = 0;
    check(spec);
  }
  {
    SCOPED_TRACE("sparse");
    spec.topk = topk;
    check(spec);
  }
}

int64_t empty_rows(const Problem& pr, const AttnResult& r) {
  int64_t n = 0;
  for (int64_t t = 0; t < pr.qo_indptr.back(); ++t)
    for (int64_t h = 0; h < pr.spec.num_qo_heads; ++h) n += r.lse_at(t, h) == kNegInf;
  return n;
}

TEST(Attention, DenseCausalPrefill) { check(spec_of({300, 129, 1}, {300, 129, 1})); }

TEST(Attention, SparseRowsAreUnsortedWithEmptySlotsAnywhere) {
  ProblemSpec s = spec_of({400, 257}, {700, 513}, 6);
  const Problem pr = make_problem(s);
  // The generator must really produce what this test is about.
  int64_t descending = 0, gap_before_entry = 0;
  for (int64_t t = 0; t < pr.total_q; ++t)
    for (int64_t g = 0; g < pr.spec.num_kv_heads; ++g)
      for (int i = 1; i < s.topk; ++i) {
        const int32_t prev = pr.rows.at(t, g, i - 1), cur = pr.rows.at(t, g, i);
        descending += prev >= 0 && cur >= 0 && prev > cur;
        gap_before_entry += prev < 0 && cur >= 0;
      }
  EXPECT_GT(descending, 0);
  EXPECT_GT(gap_before_entry, 0);
  expect_attention_matches(pr, run_attention(pr), naive_attention(pr));
}

TEST(Attention, EmptyRowsGiveZeroAndNegInf) {
  ProblemSpec s = spec_of({200, 90}, {500, 90}, 4);
  s.empty_row_prob = 0.4;
  const Problem pr = make_problem(s);
  const AttnResult r = run_attention(pr);
  EXPECT_GT(empty_rows(pr, r), 0);
  expect_attention_matches(pr, r, naive_attention(pr));
}

TEST(Attention, LengthsNotMultipleOf128) {
  ProblemSpec s = spec_of({1, 127, 128, 129, 255, 385}, {1, 127, 128, 129, 255, 385});
  s.num_qo_heads = 4;
  s.num_kv_heads = 1;
  check_dense_and_sparse(s, 3);
}

TEST(Attention, PrefixWithDefaultOffset) {
  // qo_offset = kv_len - qo_len: a chunk appended after a cached prefix.
  check_dense_and_sparse(spec_of({100, 37, 1}, {600, 300, 129}));
}

TEST(Attention, ChunkWithExplicitOffset) {
  // A chunk in the middle of its request: keys past the chunk exist but are causally masked.
  ProblemSpec s = spec_of({64, 50}, {700, 400});
  s.qo_offset = {300, 129};
  check_dense_and_sparse(s);
}

TEST(Attention, ExplicitOffsetEqualToDefault) {
  ProblemSpec s = spec_of({80, 20}, {400, 20});
  s.qo_offset = {320, 0};
  check_dense_and_sparse(s);
}

TEST(Attention, NonCausal) {
  ProblemSpec s = spec_of({50, 20, 5}, {300, 129, 0});
  s.causal = false;
  s.qo_offset = {0, 100, 0};
  check_dense_and_sparse(s);
}

TEST(Attention, NonCausalEmptyRequestHasNoKeys) {
  ProblemSpec s = spec_of({7}, {0});
  s.causal = false;
  s.qo_offset = {0};
  const Problem pr = make_problem(s);
  const AttnResult r = run_attention(pr);
  EXPECT_EQ(empty_rows(pr, r), 7 * s.num_qo_heads);
  expect_attention_matches(pr, r, naive_attention(pr));
}

TEST(Attention, GqaRatios) {
  for (int ratio : {1, 4, 16}) {
    SCOPED_TRACE("group size " + std::to_string(ratio));
    ProblemSpec s = spec_of({70, 33}, {400, 33}, 3);
    s.num_kv_heads = 2;
    s.num_qo_heads = 2 * ratio;
    s.seed = ratio;
    check_dense_and_sparse(s, 3);
  }
}

TEST(Attention, HeadDims) {
  for (int d : {64, 128, 256}) {
    SCOPED_TRACE("head_dim " + std::to_string(d));
    ProblemSpec s = spec_of({40, 9}, {400, 200}, 3);
    s.head_dim = d;
    s.num_qo_heads = 4;
    check_dense_and_sparse(s, 3);
  }
}

TEST(Attention, HeadDimVDiffersFromHeadDim) {
  ProblemSpec s = spec_of({60}, {300});
  s.head_dim = 128;
  s.head_dim_v = 64;
  check_dense_and_sparse(s);
}

TEST(Attention, PageSizesWith128TokenBlocks) {
  for (int page : {16, 32, 64, 128}) {
    SCOPED_TRACE("page_size " + std::to_string(page));
    ProblemSpec s = spec_of({90, 41}, {650, 300});
    s.page_size = page;
    s.seed = page;
    check_dense_and_sparse(s);
  }
}

TEST(Attention, FlatPageTable) {
  ProblemSpec s = spec_of({100, 50, 1}, {500, 50, 300});
  s.flat_table = true;
  s.page_size = 32;
  check_dense_and_sparse(s);
}

TEST(Attention, SglangSlotMajorPoolAndHeadMajorIndex) {
  // The pool [slots, Hkv, D] as [pages, Hkv, P, D] with strides [P*Hkv*D, D, Hkv*D, 1], and the
  // [Hkv, T, topk] index tensor as [T, Hkv, topk] with strides [topk, T*topk, 1]: no copies.
  ProblemSpec s = spec_of({100, 60}, {600, 260});
  s.kv_layout = KvLayout::kSlotMajor;
  s.head_major_index = true;
  s.page_size = 16;
  check_dense_and_sparse(s);
}

TEST(Attention, PaddedStridesAndStridedOutputs) {
  ProblemSpec s = spec_of({100, 60}, {600, 260});
  s.kv_layout = KvLayout::kPadded;
  s.strided_out = true;
  check_dense_and_sparse(s);
}

TEST(Attention, Float16) {
  ProblemSpec s = spec_of({120, 31}, {500, 31});
  s.dtype = DType::kF16;
  check_dense_and_sparse(s);
}

TEST(Attention, Float32) {
  ProblemSpec s = spec_of({120, 31}, {500, 31});
  s.dtype = DType::kF32;
  check_dense_and_sparse(s);
}

TEST(Attention, DecodePlanWithPaddingRows) {
  // batch * max_qo_len rows of q; the rows past the last request see no key (o = 0, lse = -inf).
  ProblemSpec s = spec_of({1, 3, 0, 2}, {300, 129, 57, 1000});
  s.decode = true;
  for (int topk : {0, 4}) {
    SCOPED_TRACE("topk " + std::to_string(topk));
    s.topk = topk;
    const Problem pr = make_problem(s);
    ASSERT_EQ(pr.total_q, 12);
    const AttnResult r = run_attention(pr);
    expect_attention_matches(pr, r, naive_attention(pr));
    expect_padding_rows_empty(pr, r);
  }
}

TEST(Attention, PlanDescribesItsBackend) {
  ProblemSpec s = spec_of({1, 1}, {300, 129});
  s.decode = true;
  EXPECT_EQ(make_problem(s).plan.describe(), "backend=cpu phase=decode");
  s.decode = false;
  EXPECT_EQ(make_problem(s).plan.describe(), "backend=cpu phase=prefill");
}

TEST(Attention, ExplicitSmScale) {
  const Problem pr = make_problem(spec_of({64}, {256}, 2));
  msa::RunOptions opts;
  opts.sm_scale = 0.05f;
  expect_attention_matches(pr, run_attention(pr, nullptr, opts), naive_attention(pr, nullptr, 0.05f));
}

TEST(Attention, LseIsOptional) {
  const Problem pr = make_problem(spec_of({64}, {256}, 2));
  const AttnResult with_lse = run_attention(pr);
  Buffer o(pr.spec.dtype, pr.total_q * pr.spec.num_qo_heads * pr.dv());
  msa::attention(pr.plan, pr.q_view(), pr.k_view(), pr.v_view(), pr.page_table(), pr.seqs(), pr.rows.view(),
                 o.view({pr.total_q, pr.spec.num_qo_heads, pr.dv()}));
  for (int64_t i = 0; i < o.numel(); ++i) ASSERT_EQ(o.get(i), with_lse.o.get(i)) << "element " << i;
}

// The CPU backend reads the index tensors on the host, so it always checks them (contract §6) and refuses
// what the GPU kernels skip (duplicates, blocks past the request, page ids outside the pool; the GPU tests
// check those skips): the message names the argument, the entry, the range and the value.
TEST(Attention, TheCpuBackendRefusesDuplicateEntries) {
  const Problem pr = make_problem(spec_of({150}, {600}, 5));
  IndexRows dup = pr.rows;
  dup.at(7, 1, 0) = 2;
  dup.at(7, 1, 3) = 2;
  expect_msa_error([&] { run_attention(pr, &dup); }, msa::ErrorKind::kValue,
                   {"msa.attention", "'block_idx'", "token 7, head 1", "block 2", "twice"});
}

TEST(Attention, TheCpuBackendRefusesBlocksPastTheRequest) {
  const Problem pr = make_problem(spec_of({150, 20}, {600, 20}, 5));
  for (int32_t junk : {5, 6, 1000, INT_MAX}) {
    SCOPED_TRACE(junk);
    IndexRows bad = pr.rows;
    bad.at(3, 0, 4) = junk;  // request 0: ceil(600 / 128) = 5 blocks
    expect_msa_error([&] { run_attention(pr, &bad); }, msa::ErrorKind::kValue,
                     {"msa.attention", "'block_idx'", "token 3, head 0, slot 4", "block " + std::to_string(junk),
                      "[0, 5)"});
  }
}

TEST(Attention, TheCpuBackendRefusesPageIdsOutsideThePool) {
  for (bool flat : {false, true}) {
    SCOPED_TRACE(flat ? "flat table" : "dense table");
    ProblemSpec s = spec_of({100, 64}, {500, 300});
    s.flat_table = flat;
    s.topk = 4;
    Problem pr = make_problem(s);
    pr.set_page(1, 0, pr.num_pages + 7);
    expect_msa_error([&] { run_attention(pr); }, msa::ErrorKind::kValue,
                     {"msa.attention", "'page_table'", "request 1, logical page 0",
                      "[0, " + std::to_string(pr.num_pages) + ")", "got " + std::to_string(pr.num_pages + 7)});
    pr.set_page(0, 1, -1);
    expect_msa_error([&] { run_attention(pr); }, msa::ErrorKind::kValue,
                     {"msa.attention", "'page_table'", "request 0, logical page 1", "got -1"});
  }
}

TEST(Plan, CloneIsAnEqualPlan) {
  // The CPU backend keeps no plan state, so a clone is an equal plan; on CUDA it also gets workspaces of its
  // own (the GPU tests run a plan and its clone on two streams at once).
  for (bool decode : {false, true}) {
    SCOPED_TRACE(decode ? "decode" : "prefill");
    ProblemSpec s = spec_of({1, 1}, {300, 5}, 4);
    if (!decode) s.qo_lens = {20, 5};
    s.decode = decode;
    Problem pr = make_problem(s);
    const msa::Plan clone = pr.plan.clone();
    EXPECT_EQ(clone.describe(), pr.plan.describe());
    EXPECT_EQ(clone.phase(), pr.plan.phase());
    EXPECT_EQ(clone.batch_size(), pr.plan.batch_size());
    EXPECT_EQ(clone.max_qo_len(), pr.plan.max_qo_len());
    EXPECT_EQ(clone.max_kv_len(), pr.plan.max_kv_len());
    EXPECT_EQ(clone.total_q(), pr.plan.total_q());
    EXPECT_EQ(clone.qo_lens(), pr.plan.qo_lens());
    EXPECT_EQ(clone.kv_lens(), pr.plan.kv_lens());
    EXPECT_EQ(clone.config().topk, pr.plan.config().topk);
    const AttnResult a = run_attention(pr);
    pr.plan = clone;
    const AttnResult b = run_attention(pr);
    ASSERT_EQ(a.o.numel(), b.o.numel());
    for (int64_t i = 0; i < a.o.numel(); ++i) {
      const double x = a.o.get(i), y = b.o.get(i);
      ASSERT_TRUE(x == y || (std::isnan(x) && std::isnan(y))) << "o element " << i;
    }
    EXPECT_EQ(a.lse, b.lse);
  }
}

TEST(Attention, RandomizedSweep) {
  // Every option of the builder drawn at random together, so combinations no case above names get run too.
  const DType dtypes[] = {DType::kBF16, DType::kF16, DType::kF32};
  const KvLayout layouts[] = {KvLayout::kContiguous, KvLayout::kSlotMajor, KvLayout::kPadded};
  for (uint64_t seed = 1; seed <= 24; ++seed) {
    Rng rng(1000 + seed);
    ProblemSpec s;
    s.seed = seed;
    s.dtype = dtypes[rng.randint(0, 2)];
    s.num_kv_heads = static_cast<int>(rng.randint(1, 2));
    s.num_qo_heads = s.num_kv_heads * (rng.randint(0, 1) ? 4 : 1);
    s.head_dim = rng.randint(0, 1) ? 128 : 64;
    s.page_size = 16 << rng.randint(0, 3);
    s.causal = rng.randint(0, 3) > 0;
    s.flat_table = rng.randint(0, 1);
    s.kv_layout = layouts[rng.randint(0, 2)];
    s.head_major_index = rng.randint(0, 1);
    s.strided_out = rng.randint(0, 1);
    s.topk = rng.randint(0, 2) ? static_cast<int>(rng.randint(1, 8)) : 0;
    s.empty_row_prob = rng.uniform(0, 0.2);
    const bool explicit_offset = rng.randint(0, 1);
    for (int64_t b = 0, B = rng.randint(1, 3); b < B; ++b) {
      const int32_t kv = static_cast<int32_t>(rng.randint(0, 900));
      const int32_t qo = static_cast<int32_t>(rng.randint(0, std::min<int32_t>(kv, 60)));
      s.kv_lens.push_back(kv);
      s.qo_lens.push_back(qo);
      if (explicit_offset) s.qo_offset.push_back(static_cast<int32_t>(rng.randint(0, kv - qo)));
    }
    SCOPED_TRACE("seed " + std::to_string(seed) + ": " + msa::dtype_name(s.dtype) + ", Hq " +
                 std::to_string(s.num_qo_heads) + ", Hkv " + std::to_string(s.num_kv_heads) + ", D " +
                 std::to_string(s.head_dim) + ", page " + std::to_string(s.page_size) + ", topk " +
                 std::to_string(s.topk) + (s.causal ? ", causal" : ", non-causal"));
    check(s);
  }
}

TEST(Attention, M3LayerChunkIsFast) {
  // MiniMax-M3 per GPU: Hq 64, Hkv 4, D 128, top-16 of 128-token blocks; a 256-token chunk at 4096 context.
  ProblemSpec s = spec_of({256}, {4096}, 16);
  s.num_qo_heads = 64;
  s.num_kv_heads = 4;
  s.head_dim = 128;
  s.page_size = 128;
  const Problem pr = make_problem(s);
  const auto start = std::chrono::steady_clock::now();
  const AttnResult r = run_attention(pr);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  RecordProperty("seconds", std::to_string(seconds));
  std::printf("M3 layer chunk (256 tokens, 4096 context, top-16): %.2f s\n", seconds);
  EXPECT_LT(seconds, 30.0) << "far slower than the few seconds the reference is built for";
  const int64_t step = 32;  // the float64 reference on every 32nd token keeps the test short
  expect_attention_matches(pr, r, naive_attention(pr, nullptr, 0.0, step), step);
}

}  // namespace
}  // namespace msa_test
