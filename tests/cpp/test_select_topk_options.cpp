// select_topk's options on the CPU backend (contract §4): finite_only, block_map and out_scores against a
// selection written as plain repeated "take the best", and their argument checks.
#include <cmath>
#include <limits>
#include <tuple>

#include "test_util.h"

namespace msa_test {
namespace {

constexpr int kBlock = 128;
using msa::ScoreLayout;

const float kNan = std::numeric_limits<float>::quiet_NaN();
const float kInf = std::numeric_limits<float>::infinity();

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// The forced blocks (first fb, last fe of the n valid ones), then topk - fb - fe times the best remaining
// candidate (NaN lowest, then score, then lower index; with finite_only only finite scores compete),
// ascending, -1 after them.
std::vector<int32_t> naive_select(const std::vector<float>& s, int64_t n, int topk, int fb, int fe, bool finite_only) {
  std::vector<bool> taken(n, false);
  for (int64_t blk = 0; blk < n; ++blk) taken[blk] = blk < fb || blk >= n - fe;
  auto key = [&](int64_t blk) {
    return std::isnan(s[blk]) ? std::tuple<int, double, int64_t>{0, 0.0, -blk}
                              : std::tuple<int, double, int64_t>{1, s[blk], -blk};
  };
  for (int k = 0; k < topk - fb - fe; ++k) {
    int64_t best = -1;
    for (int64_t blk = 0; blk < n; ++blk)
      if (!taken[blk] && (!finite_only || std::isfinite(s[blk])) && (best < 0 || key(blk) > key(best))) best = blk;
    if (best < 0) break;
    taken[best] = true;
  }
  std::vector<int32_t> chosen;
  for (int64_t blk = 0; blk < n; ++blk)
    if (taken[blk]) chosen.push_back(static_cast<int32_t>(blk));
  chosen.resize(topk, -1);
  return chosen;
}

// One token of one request over `row` (pos: its position; all blocks valid when not causal).
struct OneRow {
  std::vector<int32_t> ids;
  std::vector<float> scores;
};
OneRow select_one(const std::vector<float>& row, int32_t kv_len, int32_t pos, int topk, int fb, int fe,
                  bool finite_only, bool causal = true) {
  const int64_t NB = static_cast<int64_t>(row.size());
  std::vector<float> s(row);
  const std::vector<int32_t> qo_indptr = {0, 1}, kv = {kv_len}, offset = {pos};
  OneRow r{std::vector<int32_t>(topk, 12345), std::vector<float>(topk, 12345.f)};
  const int64_t s_shape[3] = {1, 1, NB}, s_strides[3] = {NB, NB, 1};
  const int64_t o_shape[3] = {1, 1, topk}, o_strides[3] = {topk, topk, 1};
  msa::select_topk(TensorView(s.data(), DType::kF32, 3, s_shape, s_strides), ScoreLayout::kTHK,
                   {int_view(qo_indptr), int_view(kv), int_view(offset)}, topk, fb, fe,
                   TensorView(r.ids.data(), DType::kI32, 3, o_shape, o_strides), causal, {},
                   {finite_only, {}, TensorView(r.scores.data(), DType::kF32, 3, o_shape, o_strides)});
  return r;
}

std::vector<int32_t> ids_of(const std::vector<float>& row, int topk, int fb, int fe, bool finite_only = true) {
  const int32_t n = static_cast<int32_t>(row.size());
  return select_one(row, n * kBlock, n * kBlock - 1, topk, fb, fe, finite_only).ids;
}

TEST(SelectTopkFiniteOnly, NonFiniteScoresAreNeverChosenByScore) {
  // -inf, NaN and +inf lose to every finite score and are then left out.
  EXPECT_EQ(ids_of({kNan, -kInf, 3, kNan, 1, kInf}, 3, 0, 0), (std::vector<int32_t>{2, 4, -1}));
  EXPECT_EQ(ids_of({kNan, -kInf, 3, kNan, 1, kInf}, 4, 0, 0, false), (std::vector<int32_t>{1, 2, 4, 5}));
  // Fewer finite candidates than topk, and more of them than topk.
  EXPECT_EQ(ids_of({-kInf, 2, -kInf, 2, -kInf, 5, 1}, 2, 0, 0), (std::vector<int32_t>{1, 5}));
  EXPECT_EQ(ids_of({-kInf, 2, -kInf, 2, -kInf, 5, 1}, 5, 0, 0), (std::vector<int32_t>{1, 3, 5, 6, -1}));
}

TEST(SelectTopkFiniteOnly, AllNonFiniteRowsGiveOnlyTheForcedBlocks) {
  EXPECT_EQ(ids_of({kNan, -kInf, -kInf, kNan, kInf}, 3, 0, 0), (std::vector<int32_t>{-1, -1, -1}));
  EXPECT_EQ(ids_of({kNan, -kInf, -kInf, kNan, kInf}, 3, 1, 1), (std::vector<int32_t>{0, 4, -1}));
  // Fewer valid blocks than topk (the every-block case): forced blocks kept, non-finite others dropped.
  EXPECT_EQ(ids_of({-kInf, -kInf, 7}, 5, 0, 0), (std::vector<int32_t>{2, -1, -1, -1, -1}));
  EXPECT_EQ(ids_of({-kInf, kNan, -kInf}, 5, 1, 1), (std::vector<int32_t>{0, 2, -1, -1, -1}));
  EXPECT_EQ(ids_of({-kInf, kNan}, 4, 2, 2), (std::vector<int32_t>{0, 1, -1, -1}));
}

TEST(SelectTopkFiniteOnly, TiesGoToTheLowerBlockAndForcedBlocksKeepTheirScores) {
  EXPECT_EQ(ids_of({1, 4, 4, -kInf, 4, 4}, 3, 0, 1), (std::vector<int32_t>{1, 2, 5}));
  const OneRow r = select_one({-kInf, 4, 4, 2, kNan}, 640, 639, 4, 1, 1, true);
  EXPECT_EQ(r.ids, (std::vector<int32_t>{0, 1, 2, 4}));
  EXPECT_EQ(r.scores[0], -kInf);
  EXPECT_EQ(r.scores[1], 4.f);
  EXPECT_EQ(r.scores[2], 4.f);
  EXPECT_TRUE(std::isnan(r.scores[3]));
}

TEST(SelectTopkFiniteOnly, EmptyRowsAndTheCausalFrontier) {
  // Query at position 200: blocks 0 and 1 valid; the +inf past the frontier is not seen.
  EXPECT_EQ(select_one({-kInf, 3, kInf}, 384, 200, 2, 0, 0, true).ids, (std::vector<int32_t>{1, -1}));
  const OneRow none = select_one({1, 2}, 0, 0, 2, 0, 1, true, false);
  EXPECT_EQ(none.ids, (std::vector<int32_t>{-1, -1}));
  EXPECT_TRUE(std::isnan(none.scores[0]) && std::isnan(none.scores[1]));
}

// A batch of rows with many ties, NaN and infinities, run with every option at once: ids through a block map
// with a row stride past max_blocks, scores into a strided out_scores; against naive_select.
struct OptionCase {
  std::vector<int32_t> qo, kv, offset;
  bool causal = true, finite_only = true;
  ScoreLayout layout = ScoreLayout::kHKT;
  int topk = 4, fb = 0, fe = 1;
};

void check_options(const OptionCase& c, uint64_t seed) {
  Rng rng(seed);
  const int64_t H = 3;
  std::vector<int32_t> qo_indptr = {0};
  int64_t NB = 1;
  for (size_t b = 0; b < c.qo.size(); ++b) {
    qo_indptr.push_back(qo_indptr.back() + c.qo[b]);
    NB = std::max<int64_t>(NB, ceil_div(c.kv[b], kBlock));
  }
  const int64_t T = qo_indptr.back(), B = static_cast<int64_t>(c.qo.size());
  // Scores [T, H, NB] in the case's layout, tokens padded by 3 in HKT.
  const bool hkt = c.layout == ScoreLayout::kHKT;
  const int64_t tp = T + 3;
  std::vector<float> smem(static_cast<size_t>(H * NB * tp));
  for (float& x : smem) {
    const double u = rng.uniform();
    x = u < 0.15 ? kNan : u < 0.35 ? -kInf : u < 0.4 ? kInf : static_cast<float>(rng.randint(-3, 3));
  }
  auto score_at = [&](int64_t t, int64_t h, int64_t blk) {
    return hkt ? smem[(h * NB + blk) * tp + t] : smem[(t * H + h) * NB + blk];
  };
  const int64_t s_shape[3] = {hkt ? H : T, hkt ? NB : H, hkt ? T : NB};
  const int64_t s_strides[3] = {hkt ? NB * tp : H * NB, hkt ? tp : NB, 1};
  // block_map [B, NB] with row stride NB + 5: block blk of request b is 1000 * b + 7 * blk + 1.
  const int64_t bm_stride = NB + 5;
  std::vector<int32_t> bm(static_cast<size_t>(B * bm_stride), -7);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t blk = 0; blk < NB; ++blk) bm[b * bm_stride + blk] = static_cast<int32_t>(1000 * b + 7 * blk + 1);
  const int64_t bm_shape[2] = {B, NB}, bm_strides[2] = {bm_stride, 1};
  // out [T, H, topk] token-major; out_scores head-major with the slot stride 2.
  std::vector<int32_t> out(static_cast<size_t>(T * H * c.topk), 12345);
  std::vector<float> os(static_cast<size_t>(H * T * c.topk * 2), 12345.f);
  const int64_t o_shape[3] = {T, H, c.topk}, o_strides[3] = {H * c.topk, c.topk, 1};
  const int64_t os_strides[3] = {2 * c.topk, 2 * c.topk * T, 2};
  const msa::Sequences seqs{int_view(qo_indptr), int_view(c.kv), c.offset.empty() ? TensorView() : int_view(c.offset)};
  msa::select_topk(TensorView(smem.data(), DType::kF32, 3, s_shape, s_strides), c.layout, seqs, c.topk, c.fb, c.fe,
                   TensorView(out.data(), DType::kI32, 3, o_shape, o_strides), c.causal, {},
                   {c.finite_only, TensorView(bm.data(), DType::kI32, 2, bm_shape, bm_strides),
                    TensorView(os.data(), DType::kF32, 3, o_shape, os_strides)});
  int64_t wrong = 0;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t i = 0; i < c.qo[b]; ++i) {
      const int64_t t = qo_indptr[b] + i;
      const int64_t pos = (c.offset.empty() ? c.kv[b] - c.qo[b] : c.offset[b]) + i;
      int64_t n = ceil_div(c.kv[b], kBlock);
      if (c.causal) n = pos < 0 ? 0 : std::min(n, pos / kBlock + 1);
      for (int64_t h = 0; h < H; ++h) {
        std::vector<float> row(NB);
        for (int64_t blk = 0; blk < NB; ++blk) row[blk] = score_at(t, h, blk);
        const std::vector<int32_t> want = naive_select(row, n, c.topk, c.fb, c.fe, c.finite_only);
        for (int j = 0; j < c.topk; ++j) {
          const int32_t got = out[t * H * c.topk + h * c.topk + j];
          const float got_s = os[h * 2 * c.topk * T + t * 2 * c.topk + 2 * j];
          const int32_t want_id = want[j] < 0 ? -1 : bm[b * bm_stride + want[j]];
          const bool score_ok = want[j] < 0 ? std::isnan(got_s)
                                            : (std::isnan(row[want[j]]) ? std::isnan(got_s) : got_s == row[want[j]]);
          if (got != want_id || !score_ok) {
            if (wrong++ < 3)
              ADD_FAILURE() << "token " << t << " head " << h << " slot " << j << ": got id " << got << " score "
                            << got_s << ", want block " << want[j] << " (id " << want_id << ")";
            break;
          }
        }
      }
    }
  EXPECT_EQ(wrong, 0);
}

TEST(SelectTopkOptions, RandomRowsAllForceCombinationsBothLayouts) {
  uint64_t seed = 11;
  for (bool finite_only : {true, false})
    for (int topk : {1, 3, 8})
      for (int fb = 0; fb <= 2; ++fb)
        for (int fe = 0; fe <= 2 && fb + fe <= topk; ++fe) {
          SCOPED_TRACE("finite_only " + std::to_string(finite_only) + " topk " + std::to_string(topk) + " fb " +
                       std::to_string(fb) + " fe " + std::to_string(fe));
          OptionCase c;
          c.qo = {40, 3, 0, 2};
          c.kv = {1500, 300, 0, 2000};
          c.finite_only = finite_only;
          c.topk = topk, c.fb = fb, c.fe = fe;
          c.layout = seed % 2 ? ScoreLayout::kHKT : ScoreLayout::kTHK;
          check_options(c, seed++);
        }
}

TEST(SelectTopkOptions, NonCausalWithOffsets) {
  OptionCase c;
  c.qo = {5, 4, 2};
  c.kv = {1100, 129, 0};
  c.offset = {0, 7, 0};
  c.causal = false;
  c.topk = 6, c.fb = 1, c.fe = 1;
  c.layout = ScoreLayout::kTHK;
  check_options(c, 3);
}

// ---- argument checks ----

struct BadOptions {
  std::vector<float> scores = std::vector<float>(2 * 1 * 4, 1.f);  // THK [2, 1, 4]
  std::vector<int32_t> qo_indptr{0, 2}, kv{512};
  std::vector<int32_t> out = std::vector<int32_t>(2 * 2, 0);
  void run(const TensorView& block_map, const TensorView& out_scores) {
    msa::select_topk(TensorView(scores.data(), DType::kF32, {2, 1, 4}), ScoreLayout::kTHK,
                     {int_view(qo_indptr), int_view(kv), {}}, 2, 0, 1, TensorView(out.data(), DType::kI32, {2, 1, 2}),
                     true, {}, {true, block_map, out_scores});
  }
};

TEST(SelectTopkOptions, BadBlockMapAndOutScoresAreNamed) {
  BadOptions c;
  std::vector<int32_t> ints(64, 0);
  std::vector<float> floats(64, 0.f);
  int32_t* i = ints.data();
  float* f = floats.data();
  EXPECT_NO_THROW(c.run(TensorView(i, DType::kI32, {1, 4}), TensorView(f, DType::kF32, {2, 1, 2})));
  expect_msa_error([&] { c.run(TensorView(f, DType::kF32, {1, 4}), {}); }, msa::ErrorKind::kType,
                   {"msa.select_topk", "'block_map'", "int32", "float32"});
  expect_msa_error([&] { c.run(TensorView(i, DType::kI32, {4}), {}); }, msa::ErrorKind::kValue,
                   {"msa.select_topk", "'block_map'", "[batch_size, max_blocks]"});
  expect_msa_error([&] { c.run(TensorView(i, DType::kI32, {2, 4}), {}); }, msa::ErrorKind::kValue,
                   {"msa.select_topk", "'block_map'", "batch_size", "= 1", "got 2"});
  expect_msa_error([&] { c.run(TensorView(i, DType::kI32, {1, 3}), {}); }, msa::ErrorKind::kValue,
                   {"msa.select_topk", "'block_map'", ">= 4", "got 3"});
  expect_msa_error([&] { c.run({}, TensorView(i, DType::kI32, {2, 1, 2})); }, msa::ErrorKind::kType,
                   {"msa.select_topk", "'out_scores'", "float32", "int32"});
  expect_msa_error([&] { c.run({}, TensorView(f, DType::kF32, {2, 1, 3})); }, msa::ErrorKind::kValue,
                   {"msa.select_topk", "'out_scores'", "topk", "= 2", "got 3"});
  expect_msa_error([&] { c.run({}, TensorView(f, DType::kF32, {1, 1, 2})); }, msa::ErrorKind::kValue,
                   {"msa.select_topk", "'out_scores'", "total_q", "= 2", "got 1"});
}

}  // namespace
}  // namespace msa_test
