// Bad input (contract §6): one case per validation rule of src/plan/plan.cpp and src/core/dispatch.cpp.
// Each case starts from a valid call, breaks one thing, and expects msa::Error of the right kind whose
// message names the entry point and the argument.
#include <cmath>
#include <ostream>

#include "core/backend.h"
#include "core/checks.h"
#include "test_util.h"

namespace msa_test {
namespace {

using msa::ErrorKind;

const msa::Device kCuda{msa::DeviceType::kCUDA, 0};

// ---- view edits ----

TensorView remake(const TensorView& t, std::vector<int64_t> shape, std::vector<int64_t> strides, DType dtype,
                  msa::Device device) {
  return TensorView(t.data(), dtype, static_cast<int>(shape.size()), shape.data(), strides.data(), device);
}
std::vector<int64_t> shape_of(const TensorView& t) { return {t.shape(), t.shape() + t.ndim()}; }
std::vector<int64_t> strides_of(const TensorView& t) { return {t.strides(), t.strides() + t.ndim()}; }

TensorView with_dtype(const TensorView& t, DType d) { return remake(t, shape_of(t), strides_of(t), d, t.device()); }
TensorView with_dl_dtype(const TensorView& t, DLDataType d) {  // any DLPack dtype, also those msa does not take
  return TensorView(t.data(), d, t.ndim(), t.shape(), t.strides(), t.device());
}
TensorView with_device(const TensorView& t, msa::Device d) {
  return remake(t, shape_of(t), strides_of(t), t.dtype(), d);
}
TensorView with_size(const TensorView& t, int dim, int64_t size) {
  auto s = shape_of(t);
  s[dim] = size;
  return remake(t, s, strides_of(t), t.dtype(), t.device());
}
TensorView with_stride(const TensorView& t, int dim, int64_t stride) {
  auto s = strides_of(t);
  s[dim] = stride;
  return remake(t, shape_of(t), s, t.dtype(), t.device());
}
TensorView with_shape(const TensorView& t, std::vector<int64_t> shape, std::vector<int64_t> strides) {
  return remake(t, std::move(shape), std::move(strides), t.dtype(), t.device());
}
TensorView first_dims(const TensorView& t, int n) {  // drop trailing dims (rank errors)
  auto s = shape_of(t), st = strides_of(t);
  s.resize(n);
  st.resize(n);
  return remake(t, s, st, t.dtype(), t.device());
}

// ---- the cases ----

struct BadCase {
  std::string name;
  ErrorKind kind;
  std::vector<std::string> needles;
  std::function<void()> run;
  bool needs_cpu_only_build = false;  // CUDA tensors reach a kernel in a build with the CUDA backend
};

void PrintTo(const BadCase& c, std::ostream* os) { *os << c.name; }

class BadInput : public ::testing::TestWithParam<BadCase> {};

TEST_P(BadInput, Throws) {
  const BadCase& c = GetParam();
  if (c.needs_cpu_only_build && msa::detail::cuda::compiled()) GTEST_SKIP() << "this build has the CUDA backend";
  expect_msa_error(c.run, c.kind, c.needles);
}

std::string case_name(const ::testing::TestParamInfo<BadCase>& info) { return info.param.name; }

// ---- plans ----

msa::AttentionConfig good_config() {
  msa::AttentionConfig c;
  c.num_qo_heads = 8;
  c.num_kv_heads = 2;
  c.head_dim = 64;
  c.page_size = 64;
  c.topk = 4;
  return c;
}

std::function<void()> prefill_with(std::function<void(msa::AttentionConfig&, msa::SplitOptions&)> edit,
                                   std::vector<int32_t> qo = {10, 5}, std::vector<int32_t> kv = {100, 5},
                                   std::vector<int32_t> offset = {}) {
  return [=] {
    msa::AttentionConfig c = good_config();
    msa::SplitOptions s;
    edit(c, s);
    msa::plan_prefill(c, {}, qo, kv, offset, s);
  };
}

std::function<void()> prefill_lengths(std::vector<int32_t> qo, std::vector<int32_t> kv,
                                      std::vector<int32_t> offset = {}, bool causal = true) {
  return prefill_with([causal](msa::AttentionConfig& c, msa::SplitOptions&) { c.causal = causal; }, qo, kv, offset);
}

std::function<void()> decode_with(int batch, int max_qo, int64_t max_kv) {
  return [=] { msa::plan_decode(good_config(), {}, batch, max_qo, max_kv); };
}

std::vector<BadCase> plan_cases() {
  using C = msa::AttentionConfig;
  using S = msa::SplitOptions;
  const std::string pf = "msa.plan_prefill", pd = "msa.plan_decode";
  return {
      {"NumQoHeadsZero", ErrorKind::kValue, {pf, "'num_qo_heads'", "got 0"},
       prefill_with([](C& c, S&) { c.num_qo_heads = 0; })},
      {"NumKvHeadsZero", ErrorKind::kValue, {pf, "'num_kv_heads'"}, prefill_with([](C& c, S&) { c.num_kv_heads = 0; })},
      {"HeadsNotDivisible", ErrorKind::kValue, {pf, "'num_qo_heads'", "num_kv_heads = 3"},
       prefill_with([](C& c, S&) { c.num_kv_heads = 3; })},
      {"HeadDimZero", ErrorKind::kValue, {pf, "'head_dim'"}, prefill_with([](C& c, S&) { c.head_dim = 0; })},
      {"HeadDimVNegative", ErrorKind::kValue, {pf, "'head_dim_v'"}, prefill_with([](C& c, S&) { c.head_dim_v = -1; })},
      {"PageSizeZero", ErrorKind::kValue, {pf, "'page_size'"}, prefill_with([](C& c, S&) { c.page_size = 0; })},
      {"BlockSizeNot128", ErrorKind::kValue, {pf, "'block_size'", "got 64"},
       prefill_with([](C& c, S&) { c.block_size = 64; })},
      {"TopkNegative", ErrorKind::kValue, {pf, "'topk'"}, prefill_with([](C& c, S&) { c.topk = -1; })},
      {"TopkPastEveryBlock", ErrorKind::kValue, {pf, "'topk'", "0..16777216"},
       prefill_with([](C& c, S&) { c.topk = (1 << 24) + 1; })},
      {"MaxSplitsNegative", ErrorKind::kValue, {pf, "'max_splits'"}, prefill_with([](C&, S& s) { s.max_splits = -1; })},
      {"FixedSplitBlocksNegative", ErrorKind::kValue, {pf, "'fixed_split_blocks'"},
       prefill_with([](C&, S& s) { s.fixed_split_blocks = -2; })},
      {"NoRequests", ErrorKind::kValue, {pf, "'qo_lens'"}, prefill_lengths({}, {})},
      {"KvLensCount", ErrorKind::kValue, {pf, "'kv_lens'"}, prefill_lengths({1, 1}, {5})},
      {"QoOffsetCount", ErrorKind::kValue, {pf, "'qo_offset'"}, prefill_lengths({1, 1}, {5, 5}, {0})},
      {"QoLenNegative", ErrorKind::kValue, {pf, "'qo_lens'", "-1"}, prefill_lengths({-1}, {5}, {0}, false)},
      {"KvLenNegative", ErrorKind::kValue, {pf, "'kv_lens'", "-5"}, prefill_lengths({0}, {-5}, {0}, false)},
      {"CausalQoLongerThanKv", ErrorKind::kValue, {pf, "'qo_lens'", "kv_len = 5"}, prefill_lengths({10}, {5})},
      {"CausalOffsetPastKv", ErrorKind::kValue, {pf, "'qo_offset'"}, prefill_lengths({5}, {6}, {3})},
      {"NonCausalNegativeOffset", ErrorKind::kValue, {pf, "'qo_offset'"}, prefill_lengths({5}, {6}, {-1}, false)},
      {"CudaDeviceInCpuBuild", ErrorKind::kNotImplemented, {pf, "'device'"},
       [] { msa::plan_prefill(good_config(), kCuda, std::vector<int32_t>{1}, std::vector<int32_t>{1}); }, true},
      {"DecodeBatchZero", ErrorKind::kValue, {pd, "'batch_size'"}, decode_with(0, 1, 100)},
      {"DecodeMaxQoLenAbove16", ErrorKind::kValue, {pd, "'max_qo_len'", "got 17"}, decode_with(2, 17, 100)},
      {"DecodeMaxQoLenZero", ErrorKind::kValue, {pd, "'max_qo_len'"}, decode_with(2, 0, 100)},
      {"DecodeMaxKvLenZero", ErrorKind::kValue, {pd, "'max_kv_len'"}, decode_with(2, 1, 0)},
      {"DecodeMaxKvLenPastInt32", ErrorKind::kValue, {pd, "'max_kv_len'"}, decode_with(2, 1, int64_t{1} << 31)},
      {"DecodeTokensPastInt32", ErrorKind::kValue, {pd, "'batch_size' x 'max_qo_len'"},
       decode_with(1 << 28, 16, 100)},
      {"PrefillTokensPastInt32", ErrorKind::kValue, {pf, "'qo_lens'", "below 2^31"},
       prefill_lengths({1 << 30, 1 << 30}, {1 << 30, 1 << 30})},
  };
}

INSTANTIATE_TEST_SUITE_P(Plan, BadInput, ::testing::ValuesIn(plan_cases()), case_name);

// ---- attention ----

// A valid sparse call; the problem and the outputs live for the whole test program.
struct AttnArgs {
  msa::Plan plan;
  TensorView q, k, v;
  msa::PageTable pages;
  msa::Sequences seqs;
  TensorView block_idx, o, lse;
  msa::RunOptions opts;
  void operator()() const { msa::attention(plan, q, k, v, pages, seqs, block_idx, o, lse, opts); }
};

const Problem& attention_problem(bool flat) {
  static const Problem dense_table = [] {
    ProblemSpec s;
    s.qo_lens = {20, 5};
    s.kv_lens = {300, 5};
    s.topk = 4;
    return make_problem(s);
  }();
  static const Problem flat_table = [] {
    ProblemSpec s = dense_table.spec;
    s.flat_table = true;
    return make_problem(s);
  }();
  return flat ? flat_table : dense_table;
}

AttnArgs valid_attention(bool flat = false) {
  const Problem& pr = attention_problem(flat);
  static Buffer o(pr.spec.dtype, pr.total_q * pr.spec.num_qo_heads * pr.dv());
  static std::vector<float> lse(static_cast<size_t>(pr.total_q * pr.spec.num_qo_heads));
  AttnArgs a;
  a.plan = pr.plan;
  a.q = pr.q_view(), a.k = pr.k_view(), a.v = pr.v_view();
  a.pages = pr.page_table();
  a.seqs = pr.seqs();
  a.block_idx = pr.rows.view();
  a.o = o.view({pr.total_q, pr.spec.num_qo_heads, pr.dv()});
  a.lse = TensorView(lse.data(), DType::kF32, {pr.total_q, pr.spec.num_qo_heads});
  return a;
}

TEST(Validation, TheBaselineCallsAreValid) {
  EXPECT_NO_THROW(valid_attention()());
  EXPECT_NO_THROW(valid_attention(true)());
  AttnArgs deep = valid_attention();
  deep.opts.validate = true;
  EXPECT_NO_THROW(deep());
}

std::function<void()> attn(std::function<void(AttnArgs&)> edit, bool flat = false) {
  return [=] {
    AttnArgs a = valid_attention(flat);
    edit(a);
    a();
  };
}

// Runs the valid call with int32 vectors replaced (they must outlive the call, hence this shape).
std::function<void()> attn_values(std::function<void(std::vector<int32_t>& qo_indptr, std::vector<int32_t>& kv_lens,
                                                     std::vector<int32_t>& qo_offset, std::vector<int32_t>& table,
                                                     std::vector<int32_t>& indptr, IndexRows& rows)>
                                      edit,
                                  bool flat = false, bool validate = false) {
  return [=] {
    const Problem& pr = attention_problem(flat);
    std::vector<int32_t> qo_indptr = pr.qo_indptr, kv = pr.kv_lens, offset, table = pr.table,
                         indptr = pr.page_indptr;
    IndexRows rows = pr.rows;
    edit(qo_indptr, kv, offset, table, indptr, rows);
    AttnArgs a = valid_attention(flat);
    a.seqs = {int_view(qo_indptr), int_view(kv), offset.empty() ? TensorView() : int_view(offset)};
    a.pages = flat ? msa::PageTable{int_view(table), int_view(indptr)}
                   : msa::PageTable{TensorView(table.data(), DType::kI32, {pr.batch, pr.table_cols}), {}};
    a.block_idx = rows.view();
    a.opts.validate = validate;
    a();
  };
}

using V = std::vector<int32_t>;

// A decode plan over the first `rows` tokens of the problem (q, o, lse, block_idx cut to them).
std::function<void()> decode_call(int batch, int max_qo, V qo_indptr, int64_t rows, int64_t max_kv = 4096) {
  return [=] {
    AttnArgs a = valid_attention();
    a.plan = msa::plan_decode(a.plan.config(), {}, batch, max_qo, max_kv);
    a.q = with_size(a.q, 0, rows), a.o = with_size(a.o, 0, rows), a.lse = with_size(a.lse, 0, rows);
    a.block_idx = with_size(a.block_idx, 0, rows);
    const V kv = {300, 5};
    a.seqs = {int_view(qo_indptr), int_view(kv), {}};
    a();
  };
}

std::vector<BadCase> attention_cases() {
  const std::string fn = "msa.attention";
  const auto T = ErrorKind::kType;
  const auto Vk = ErrorKind::kValue;
  return {
      {"InvalidPlan", Vk, {fn, "'plan'"}, attn([](AttnArgs& a) { a.plan = msa::Plan(); })},
      {"QDtype", T, {fn, "'q'", "int32"}, attn([](AttnArgs& a) { a.q = with_dtype(a.q, DType::kI32); })},
      {"QRank", Vk, {fn, "'q'", "3 dimensions"}, attn([](AttnArgs& a) { a.q = first_dims(a.q, 2); })},
      {"QDeviceKind", T, {fn, "'q'", "cuda:0"}, attn([](AttnArgs& a) { a.q = with_device(a.q, kCuda); })},
      {"QHeads", Vk, {fn, "'q'", "num_qo_heads"}, attn([](AttnArgs& a) { a.q = with_size(a.q, 1, 4); })},
      {"QHeadDim", Vk, {fn, "'q'", "head_dim"}, attn([](AttnArgs& a) { a.q = with_size(a.q, 2, 32); })},
      {"QInnerStride", Vk, {fn, "'q'", "innermost"}, attn([](AttnArgs& a) { a.q = with_stride(a.q, 2, 2); })},
      {"QNegativeStride", Vk, {fn, "'q'", "non-negative"},
       attn([](AttnArgs& a) { a.q = with_stride(a.q, 0, -a.q.stride(0)); })},
      {"QTokensDifferFromPrefillPlan", Vk, {fn, "'q'", "prefill plan"},
       attn([](AttnArgs& a) { a.q = with_size(a.q, 0, a.q.size(0) - 1); })},
      {"QTokensAboveDecodePlan", Vk, {fn, "'q'", "decode plan"},
       attn([](AttnArgs& a) { a.plan = msa::plan_decode(a.plan.config(), {}, 2, 1, 4096); })},
      {"KDtypeDiffersFromQ", T,
       {fn, "'k'", "bfloat16 or float8_e4m3fn (the dtype of q, or fp8 e4m3 with k_scale and v_scale), got float16"},
       attn([](AttnArgs& a) { a.k = with_dtype(a.k, DType::kF16); })},
      // K and V are both fp8 or both in q's dtype; the message says which V must be.
      {"KFp8VInQDtype", T, {fn, "'v'", "expected dtype float8_e4m3fn (as k: K and V are both fp8 e4m3", "got bfloat16"},
       attn([](AttnArgs& a) { a.k = with_dtype(a.k, DType::kF8E4M3); })},
      {"KInQDtypeVFp8", T, {fn, "'v'", "expected dtype bfloat16 (the dtype of q, as k", "got float8_e4m3fn"},
       attn([](AttnArgs& a) { a.v = with_dtype(a.v, DType::kF8E4M3); })},
      {"QFp8", T, {fn, "'q'", "got float8_e4m3fn"}, attn([](AttnArgs& a) {
         a.q = with_dtype(a.q, DType::kF8E4M3);
         a.k = with_dtype(a.k, DType::kF8E4M3);
         a.v = with_dtype(a.v, DType::kF8E4M3);
       })},
      {"OutFp8", T, {fn, "'out'", "bfloat16 (the dtype of q)"}, attn([](AttnArgs& a) {
         a.k = with_dtype(a.k, DType::kF8E4M3);
         a.v = with_dtype(a.v, DType::kF8E4M3);
         a.o = with_dtype(a.o, DType::kF8E4M3);
       })},
      // A dtype msa takes nowhere is named as such, for the first argument (in the order of the signature)
      // whose dtype is wrong.
      {"KFloat64", T, {fn, "'k'", "got float64"}, attn([](AttnArgs& a) { a.k = with_dl_dtype(a.k, {2, 64, 1}); })},
      {"FirstWrongDtypeIsNamed", T, {fn, "'q'", "expected dtype bfloat16, float16 or float32, got int32"},
       attn([](AttnArgs& a) {
         a.q = with_dtype(a.q, DType::kI32);
         a.k = with_dl_dtype(a.k, {2, 64, 1});
         a.v = with_dtype(a.v, DType::kF32);
       })},
      {"LseBool", T, {fn, "'lse'", "expected dtype float32, got bool"},
       attn([](AttnArgs& a) { a.lse = with_dl_dtype(a.lse, {6, 8, 1}); })},
      {"KRank", Vk, {fn, "'k'", "4 dimensions"}, attn([](AttnArgs& a) { a.k = first_dims(a.k, 3); })},
      {"KDeviceKind", T, {fn, "'k'"}, attn([](AttnArgs& a) { a.k = with_device(a.k, kCuda); })},
      {"KHeads", Vk, {fn, "'k'", "num_kv_heads"}, attn([](AttnArgs& a) { a.k = with_size(a.k, 1, 1); })},
      {"KPageSize", Vk, {fn, "'k'", "page_size"}, attn([](AttnArgs& a) { a.k = with_size(a.k, 2, 32); })},
      {"KHeadDim", Vk, {fn, "'k'", "head_dim"}, attn([](AttnArgs& a) { a.k = with_size(a.k, 3, 32); })},
      {"KInnerStride", Vk, {fn, "'k'", "innermost"}, attn([](AttnArgs& a) { a.k = with_stride(a.k, 3, 2); })},
      {"KNegativeStride", Vk, {fn, "'k'", "non-negative"},
       attn([](AttnArgs& a) { a.k = with_stride(a.k, 1, -a.k.stride(1)); })},
      {"KPagesPastInt32", Vk, {fn, "'k'", "below 2^31"},
       attn([](AttnArgs& a) { a.k = with_stride(with_size(a.k, 0, int64_t{1} << 31), 0, 0); })},
      {"VPagesDifferFromK", Vk, {fn, "'v'", "num_pages"},
       attn([](AttnArgs& a) { a.v = with_size(a.v, 0, a.v.size(0) - 1); })},
      {"VHeadDim", Vk, {fn, "'v'", "head_dim_v"}, attn([](AttnArgs& a) { a.v = with_size(a.v, 3, 32); })},
      {"VDtype", T, {fn, "'v'"}, attn([](AttnArgs& a) { a.v = with_dtype(a.v, DType::kF32); })},
      {"ODtype", T, {fn, "'out'"}, attn([](AttnArgs& a) { a.o = with_dtype(a.o, DType::kF32); })},
      {"OTokens", Vk, {fn, "'out'", "total_q"}, attn([](AttnArgs& a) { a.o = with_size(a.o, 0, a.o.size(0) - 1); })},
      {"OHeadDim", Vk, {fn, "'out'", "head_dim_v"}, attn([](AttnArgs& a) { a.o = with_size(a.o, 2, 32); })},
      {"OInnerStride", Vk, {fn, "'out'", "innermost"}, attn([](AttnArgs& a) { a.o = with_stride(a.o, 2, 2); })},
      {"LseDtype", T, {fn, "'lse'", "float32"}, attn([](AttnArgs& a) { a.lse = with_dtype(a.lse, DType::kF16); })},
      {"LseRank", Vk, {fn, "'lse'"}, attn([](AttnArgs& a) { a.lse = first_dims(a.lse, 1); })},
      {"LseHeads", Vk, {fn, "'lse'", "num_qo_heads"}, attn([](AttnArgs& a) { a.lse = with_size(a.lse, 1, 4); })},
      {"LseNegativeStride", Vk, {fn, "'lse'"}, attn([](AttnArgs& a) { a.lse = with_stride(a.lse, 0, -8); })},
      {"BlockIdxMissingForSparsePlan", Vk, {fn, "'block_idx'", "required"},
       attn([](AttnArgs& a) { a.block_idx = TensorView(); })},
      {"BlockIdxWithDensePlan", Vk, {fn, "'block_idx'", "dense"}, attn([](AttnArgs& a) {
         msa::AttentionConfig c = a.plan.config();
         c.topk = 0;
         a.plan = msa::plan_prefill(c, {}, a.plan.qo_lens(), a.plan.kv_lens());
       })},
      {"BlockIdxDtype", T, {fn, "'block_idx'", "int32"},
       attn([](AttnArgs& a) { a.block_idx = with_dtype(a.block_idx, DType::kI64); })},
      {"BlockIdxRank", Vk, {fn, "'block_idx'"}, attn([](AttnArgs& a) { a.block_idx = first_dims(a.block_idx, 2); })},
      {"BlockIdxTopk", Vk, {fn, "'block_idx'", "topk"},
       attn([](AttnArgs& a) { a.block_idx = with_size(a.block_idx, 2, 3); })},
      {"BlockIdxHeads", Vk, {fn, "'block_idx'", "num_kv_heads"},
       attn([](AttnArgs& a) { a.block_idx = with_size(a.block_idx, 1, 1); })},
      {"BlockIdxNegativeStride", Vk, {fn, "'block_idx'", "non-negative"},
       attn([](AttnArgs& a) { a.block_idx = with_stride(a.block_idx, 0, -4); })},
      {"QoIndptrDtype", T, {fn, "'qo_indptr'"},
       attn([](AttnArgs& a) { a.seqs.qo_indptr = with_dtype(a.seqs.qo_indptr, DType::kI64); })},
      {"QoIndptrSize", Vk, {fn, "'qo_indptr'", "batch_size + 1"},
       attn([](AttnArgs& a) { a.seqs.qo_indptr = with_size(a.seqs.qo_indptr, 0, 2); })},
      {"KvLensSize", Vk, {fn, "'kv_lens'", "batch_size"},
       attn([](AttnArgs& a) { a.seqs.kv_lens = with_size(a.seqs.kv_lens, 0, 1); })},
      {"KvLensStrided", Vk, {fn, "'kv_lens'", "contiguous"},
       attn([](AttnArgs& a) { a.seqs.kv_lens = with_stride(a.seqs.kv_lens, 0, 2); })},
      {"KvLensDeviceKind", T, {fn, "'kv_lens'"},
       attn([](AttnArgs& a) { a.seqs.kv_lens = with_device(a.seqs.kv_lens, kCuda); })},
      {"QoOffsetSize", Vk, {fn, "'qo_offset'"}, attn([](AttnArgs& a) { a.seqs.qo_offset = a.seqs.qo_indptr; })},
      {"PageTableRank", Vk, {fn, "'page_table'", "dense form"},
       attn([](AttnArgs& a) { a.pages.table = first_dims(a.pages.table, 1); })},
      {"PageTableDtype", T, {fn, "'page_table'"},
       attn([](AttnArgs& a) { a.pages.table = with_dtype(a.pages.table, DType::kI64); })},
      {"PageTableFewerRowsThanBatch", Vk, {fn, "'page_table'", "batch_size"},
       attn([](AttnArgs& a) { a.pages.table = with_size(a.pages.table, 0, 1); })},
      {"PageTableRowsNotContiguous", Vk, {fn, "'page_table'", "contiguous rows"},
       attn([](AttnArgs& a) { a.pages.table = with_stride(a.pages.table, 1, 2); })},
      {"PageTableNegativeStride", Vk, {fn, "'page_table'", "non-negative"},
       attn([](AttnArgs& a) { a.pages.table = with_stride(a.pages.table, 0, -1); })},
      {"FlatPageTableRank", Vk, {fn, "'page_table'", "flat form"},
       attn([](AttnArgs& a) { a.pages.table = with_shape(a.pages.table, {1, a.pages.table.size(0)}, {1, 1}); },
            /*flat=*/true)},
      {"PageIndptrSize", Vk, {fn, "'page_indptr'", "batch_size + 1"},
       attn([](AttnArgs& a) { a.pages.indptr = with_size(a.pages.indptr, 0, 2); }, true)},
      {"SmScaleNotFinite", Vk, {fn, "'sm_scale'"}, attn([](AttnArgs& a) { a.opts.sm_scale = NAN; })},
      {"QScaleZero", Vk, {fn, "'q_scale'", "finite number > 0, got 0"}, attn([](AttnArgs& a) { a.opts.q_scale = 0; })},
      {"KScaleNegative", Vk, {fn, "'k_scale'", "got -2"}, attn([](AttnArgs& a) { a.opts.k_scale = -2; })},
      {"KScaleNaN", Vk, {fn, "'k_scale'", "got nan"}, attn([](AttnArgs& a) { a.opts.k_scale = NAN; })},
      {"VScaleInfinite", Vk, {fn, "'v_scale'", "got inf"}, attn([](AttnArgs& a) { a.opts.v_scale = INFINITY; })},
      {"ScaleProductOverflows", Vk, {fn, "'sm_scale' * 'q_scale' * 'k_scale'", "float range"}, attn([](AttnArgs& a) {
         a.opts.q_scale = 1e30f;
         a.opts.k_scale = 1e30f;
       })},
      // Values of the lengths (host-readable on the CPU).
      {"QoIndptrFirstNonzero", Vk, {fn, "'qo_indptr'", "qo_indptr[0] = 0"},
       attn_values([](V& qi, V&, V&, V&, V&, IndexRows&) { qi = {1, 20, 25}; })},
      {"QoIndptrDecreasing", Vk, {fn, "'qo_indptr'", "non-decreasing"},
       attn_values([](V& qi, V&, V&, V&, V&, IndexRows&) { qi = {0, -1, 25}; })},
      {"KvLenNegative", Vk, {fn, "'kv_lens'", "-3"},
       attn_values([](V&, V& kv, V&, V&, V&, IndexRows&) { kv[1] = -3; })},
      {"CausalOffsetPastKvLen", Vk, {fn, "'qo_offset'", "qo_offset + qo_len <= kv_len"},
       attn_values([](V&, V&, V& off, V&, V&, IndexRows&) { off = {290, 0}; })},
      {"CausalDefaultOffsetNegative", Vk, {fn, "'kv_lens'", "qo_offset + qo_len <= kv_len"},
       attn_values([](V&, V& kv, V&, V&, V&, IndexRows&) { kv[1] = 4; })},
      {"LengthsDifferFromPrefillPlan", Vk, {fn, "'kv_lens'", "prefill plan"},
       attn_values([](V&, V& kv, V&, V&, V&, IndexRows&) { kv[0] = 299; })},
      {"DecodeQoLenAbovePlan", Vk, {fn, "'qo_indptr'", "max_qo_len = 1"}, decode_call(2, 1, {0, 2, 2}, 2)},
      {"QoIndptrPastTokensInQ", Vk, {fn, "'qo_indptr'", "tokens in q"}, decode_call(2, 2, {0, 1, 3}, 2)},
      {"DecodeKvLenAbovePlan", Vk, {fn, "'kv_lens'", "kv_len = 300", "max_kv_len = 299"},
       decode_call(2, 1, {0, 1, 2}, 2, 299)},
      {"PageIndptrFirstNegative", Vk, {fn, "'page_indptr'"},
       attn_values([](V&, V&, V&, V&, V& ip, IndexRows&) { ip[0] = -1; }, true)},
      {"PageIndptrDecreasing", Vk, {fn, "'page_indptr'", "non-decreasing"},
       attn_values([](V&, V&, V&, V&, V& ip, IndexRows&) { ip[1] = ip[2] + 1; }, true)},
      {"PageIndptrPastTable", Vk, {fn, "'page_indptr'", "entries in page_table"},
       attn_values([](V&, V&, V&, V& table, V& ip, IndexRows&) { ip.back() = static_cast<int32_t>(table.size()) + 1; },
                   true)},
      {"DenseRowTooShortForKvLen", Vk, {fn, "'page_table'", "kv_len = 300"}, attn([](AttnArgs& a) {
         a.pages.table = with_size(a.pages.table, 1, 4);  // 300 keys need 5 pages of 64
       })},
      {"FlatRowTooShortForKvLen", Vk, {fn, "'page_table'", "kv_len = 300"},
       attn_values([](V&, V&, V&, V&, V& ip, IndexRows&) { ip[1] = ip[0] + 4; }, true)},
      // The deep scan (validate = true).
      {"ValidatePageIdPastPool", Vk, {fn, "'page_table'", "page id"},
       attn_values([](V&, V&, V&, V& table, V&, IndexRows&) { table[2] = 1000; }, false, true)},
      {"ValidateNegativePageId", Vk, {fn, "'page_table'", "logical page 1"},
       attn_values([](V&, V&, V&, V& table, V& ip, IndexRows&) { table[ip[0] + 1] = -1; }, true, true)},
      {"ValidateBlockOutOfRange", Vk, {fn, "'block_idx'", "out of range", "block 3"},
       attn_values([](V&, V&, V&, V&, V&, IndexRows& r) { r.at(22, 1, 0) = 3; }, false, true)},
      {"ValidateDuplicateBlock", Vk, {fn, "'block_idx'", "twice", "token 7"},
       attn_values([](V&, V&, V&, V&, V&, IndexRows& r) { r.at(7, 0, 0) = r.at(7, 0, 1) = 0; }, false, true)},
  };
}

INSTANTIATE_TEST_SUITE_P(Attention, BadInput, ::testing::ValuesIn(attention_cases()), case_name);

TEST(Validation, Fp8KvWithScalesIsAValidCpuCall) {
  AttnArgs a = valid_attention();
  a.k = with_dtype(a.k, DType::kF8E4M3);  // the bf16 bytes read as e4m3 codes (NaN ones included)
  a.v = with_dtype(a.v, DType::kF8E4M3);
  a.opts.q_scale = 0.5f, a.opts.k_scale = 3.0f, a.opts.v_scale = 0.01f;
  EXPECT_NO_THROW(a());
}

// ---- block_scores ----

struct ScoreArgs {
  TensorView q, k, k_scale;
  msa::PageTable pages;
  msa::Sequences seqs;
  TensorView out;
  msa::ScoreLayout layout = msa::ScoreLayout::kHKT;
  bool causal = true;
  void operator()() const { msa::block_scores(q, k, k_scale, pages, seqs, out, layout, causal); }
};

ScoreArgs valid_scores(bool fp8 = false) {
  static const Problem bf16 = [] {
    ProblemSpec s;
    s.qo_lens = {20, 5};
    s.kv_lens = {300, 5};
    s.num_qo_heads = 4;
    s.num_kv_heads = 1;
    return make_problem(s);
  }();
  static const Problem with_fp8 = [] {
    ProblemSpec s = bf16.spec;
    s.k_dtype = DType::kF8E4M3;
    return make_problem(s);
  }();
  const Problem& pr = fp8 ? with_fp8 : bf16;
  static std::vector<float> out(static_cast<size_t>(4 * 3 * 25));
  return {pr.q_view(), pr.k_view(), pr.k_scale_view(), pr.page_table(), pr.seqs(),
          TensorView(out.data(), DType::kF32, {4, 3, 25})};
}

std::function<void()> scores(std::function<void(ScoreArgs&)> edit, bool fp8 = false) {
  return [=] {
    ScoreArgs a = valid_scores(fp8);
    edit(a);
    a();
  };
}

TEST(Validation, TheBaselineScoreCallsAreValid) {
  EXPECT_NO_THROW(valid_scores()());
  EXPECT_NO_THROW(valid_scores(true)());
}

std::vector<BadCase> block_score_cases() {
  const std::string fn = "msa.block_scores";
  const auto T = ErrorKind::kType;
  const auto Vk = ErrorKind::kValue;
  return {
      {"QDtype", T, {fn, "'q'"}, scores([](ScoreArgs& a) { a.q = with_dtype(a.q, DType::kI32); })},
      {"QRank", Vk, {fn, "'q'"}, scores([](ScoreArgs& a) { a.q = first_dims(a.q, 2); })},
      {"QInnerStride", Vk, {fn, "'q'", "innermost"}, scores([](ScoreArgs& a) { a.q = with_stride(a.q, 2, 3); })},
      {"QNegativeStride", Vk, {fn, "'q'"}, scores([](ScoreArgs& a) { a.q = with_stride(a.q, 1, -64); })},
      {"QOnCudaInCpuBuild", ErrorKind::kNotImplemented, {fn, "CUDA"},
       scores([](ScoreArgs& a) { a.q = with_device(a.q, kCuda); }), true},
      {"KRank", Vk, {fn, "'k_index'"}, scores([](ScoreArgs& a) { a.k = first_dims(a.k, 3); })},
      {"KHeadDim", Vk, {fn, "'k_index'", "head_dim"}, scores([](ScoreArgs& a) { a.k = with_size(a.k, 3, 32); })},
      {"KDtypeDiffersFromQ", T, {fn, "'k_index'"}, scores([](ScoreArgs& a) { a.k = with_dtype(a.k, DType::kF16); })},
      {"KDeviceKind", T, {fn, "'k_index'"}, scores([](ScoreArgs& a) { a.k = with_device(a.k, kCuda); })},
      {"KHeadsDoNotDivide", Vk, {fn, "'k_index'", "divide"}, scores([](ScoreArgs& a) { a.k = with_size(a.k, 1, 3); })},
      {"Fp8WithoutScale", Vk, {fn, "'k_scale'", "required"},
       scores([](ScoreArgs& a) { a.k_scale = TensorView(); }, true)},
      {"ScaleShape", Vk, {fn, "'k_scale'", "page_size"},
       scores([](ScoreArgs& a) { a.k_scale = with_size(a.k_scale, 2, 32); }, true)},
      {"ScaleDtype", T, {fn, "'k_scale'"}, scores([](ScoreArgs& a) { a.k_scale = with_dtype(a.k_scale, DType::kF16); },
                                                  true)},
      {"ScaleWithBf16Keys", Vk, {fn, "'k_scale'", "only used with float8_e4m3fn"},
       scores([](ScoreArgs& a) { a.k_scale = valid_scores(true).k_scale; })},
      {"NoKvLens", Vk, {fn, "'kv_lens'"}, scores([](ScoreArgs& a) { a.seqs.kv_lens = TensorView(); })},
      {"OutDtype", T, {fn, "'out'"}, scores([](ScoreArgs& a) { a.out = with_dtype(a.out, DType::kF16); })},
      {"OutHktTokens", Vk, {fn, "'out'", "total_q"}, scores([](ScoreArgs& a) { a.out = with_size(a.out, 2, 24); })},
      {"OutThkHeads", Vk, {fn, "'out'", "num_heads"}, scores([](ScoreArgs& a) {
         a.layout = msa::ScoreLayout::kTHK;
         a.out = with_shape(a.out, {25, 3, 3}, {12, 3, 1});
       })},
      {"OutTooFewBlocks", Vk, {fn, "'out'", "max_blocks = 2"},
       scores([](ScoreArgs& a) { a.out = with_size(a.out, 1, 2); })},
      {"CausalOffsetPastKvLen", Vk, {fn, "qo_offset + qo_len <= kv_len"}, [] {
         ScoreArgs a = valid_scores();
         const V kv = {300, 4};
         a.seqs.kv_lens = int_view(kv);
         a();
       }},
      {"PageTableRowTooShort", Vk, {fn, "'page_table'", "kv_len = 300"},
       scores([](ScoreArgs& a) { a.pages.table = with_size(a.pages.table, 1, 3); })},
  };
}

INSTANTIATE_TEST_SUITE_P(BlockScores, BadInput, ::testing::ValuesIn(block_score_cases()), case_name);

// ---- select_topk ----

struct SelectArgs {
  TensorView scores;
  msa::Sequences seqs;
  int topk = 4, force_begin = 0, force_end = 1;
  TensorView out;
  void operator()() const {
    msa::select_topk(scores, msa::ScoreLayout::kHKT, seqs, topk, force_begin, force_end, out);
  }
};

SelectArgs valid_select() {
  static std::vector<float> s(static_cast<size_t>(2 * 3 * 25), 1.0f);
  static std::vector<int32_t> out(static_cast<size_t>(25 * 2 * 4));
  static const V qo_indptr = {0, 20, 25}, kv = {300, 5};
  SelectArgs a;
  a.scores = TensorView(s.data(), DType::kF32, {2, 3, 25});
  a.seqs = {int_view(qo_indptr), int_view(kv), {}};
  a.out = TensorView(out.data(), DType::kI32, {25, 2, 4});
  return a;
}

std::function<void()> select(std::function<void(SelectArgs&)> edit) {
  return [=] {
    SelectArgs a = valid_select();
    edit(a);
    a();
  };
}

TEST(Validation, TheBaselineSelectCallIsValid) { EXPECT_NO_THROW(valid_select()()); }

std::vector<BadCase> select_cases() {
  const std::string fn = "msa.select_topk";
  const auto T = ErrorKind::kType;
  const auto Vk = ErrorKind::kValue;
  return {
      {"ScoresDtype", T, {fn, "'scores'"}, select([](SelectArgs& a) { a.scores = with_dtype(a.scores, DType::kF16); })},
      {"ScoresRank", Vk, {fn, "'scores'"}, select([](SelectArgs& a) { a.scores = first_dims(a.scores, 2); })},
      {"ScoresNegativeStride", Vk, {fn, "'scores'"},
       select([](SelectArgs& a) { a.scores = with_stride(a.scores, 2, -1); })},
      {"TopkZero", Vk, {fn, "'topk'", "got 0"}, select([](SelectArgs& a) { a.topk = 0; })},
      {"ForceBeginNegative", Vk, {fn, "'force_begin'"}, select([](SelectArgs& a) { a.force_begin = -1; })},
      {"ForceEndNegative", Vk, {fn, "'force_end'"}, select([](SelectArgs& a) { a.force_end = -1; })},
      {"ForcedAboveTopk", Vk, {fn, "'force_begin'", "topk = 4"}, select([](SelectArgs& a) {
         a.force_begin = 3;
         a.force_end = 2;
       })},
      {"ForcedSumPastInt32", Vk, {fn, "'force_begin'", "got 2147483648"}, select([](SelectArgs& a) {
         a.force_begin = INT32_MAX;
         a.force_end = 1;
       })},
      {"OutTopk", Vk, {fn, "'out'", "topk"}, select([](SelectArgs& a) { a.out = with_size(a.out, 2, 3); })},
      {"OutHeads", Vk, {fn, "'out'", "num_heads"}, select([](SelectArgs& a) { a.out = with_size(a.out, 1, 1); })},
      {"OutDtype", T, {fn, "'out'"}, select([](SelectArgs& a) { a.out = with_dtype(a.out, DType::kI64); })},
      {"OutDeviceKind", T, {fn, "'out'"}, select([](SelectArgs& a) { a.out = with_device(a.out, kCuda); })},
      {"OutNegativeStride", Vk, {fn, "'out'"}, select([](SelectArgs& a) { a.out = with_stride(a.out, 1, -4); })},
      {"NoKvLens", Vk, {fn, "'kv_lens'"}, select([](SelectArgs& a) { a.seqs.kv_lens = TensorView(); })},
      // Scores of the wrong shape are named, with the shape the lengths need, before the lengths are.
      {"ScoresTooFewBlocks", Vk, {fn, "'scores'", "max_blocks >= 3", "got [2, 2, 25]"},
       select([](SelectArgs& a) { a.scores = with_size(a.scores, 1, 2); })},
      {"ScoresFewerTokensThanQoIndptr", Vk, {fn, "'scores'", "total_q >= 25", "got [2, 3, 20]"},
       select([](SelectArgs& a) {
         a.scores = with_size(a.scores, 2, 20);
         a.out = with_size(a.out, 0, 20);
       })},
      {"ScoresInTheOtherLayout", Vk, {fn, "'scores'", "total_q >= 25", "got [25, 2, 3]"}, select([](SelectArgs& a) {
         a.scores = with_shape(a.scores, {25, 2, 3}, {6, 3, 1});
       })},
      {"QoIndptrPastScores", Vk, {fn, "'scores'", "total_q >= 26"}, [] {
         SelectArgs a = valid_select();
         const V qo_indptr = {0, 20, 26}, kv = {300, 6};
         a.seqs = {int_view(qo_indptr), int_view(kv), {}};
         a();
       }},
  };
}

INSTANTIATE_TEST_SUITE_P(SelectTopk, BadInput, ::testing::ValuesIn(select_cases()), case_name);

// ---- merge_states ----

struct MergeArgs {
  TensorView v, lse, o, lse_out;
  void operator()() const { msa::merge_states(v, lse, o, lse_out); }
};

MergeArgs valid_merge() {
  static Buffer v(DType::kF32, 2 * 3 * 4 * 16);
  static std::vector<float> lse(2 * 3 * 4), lse_out(3 * 4);
  static Buffer o(DType::kBF16, 3 * 4 * 16);
  return {v.view({2, 3, 4, 16}), TensorView(lse.data(), DType::kF32, {2, 3, 4}), o.view({3, 4, 16}),
          TensorView(lse_out.data(), DType::kF32, {3, 4})};
}

std::function<void()> merge(std::function<void(MergeArgs&)> edit) {
  return [=] {
    MergeArgs a = valid_merge();
    edit(a);
    a();
  };
}

TEST(Validation, TheBaselineMergeCallIsValid) { EXPECT_NO_THROW(valid_merge()()); }

std::vector<BadCase> merge_cases() {
  const std::string fn = "msa.merge_states";
  const auto T = ErrorKind::kType;
  const auto Vk = ErrorKind::kValue;
  return {
      {"VDtype", T, {fn, "'v_parts'"}, merge([](MergeArgs& a) { a.v = with_dtype(a.v, DType::kI32); })},
      {"VRank", Vk, {fn, "'v_parts'"}, merge([](MergeArgs& a) { a.v = first_dims(a.v, 3); })},
      {"VInnerStride", Vk, {fn, "'v_parts'", "innermost"}, merge([](MergeArgs& a) { a.v = with_stride(a.v, 3, 2); })},
      {"VNegativeStride", Vk, {fn, "'v_parts'"}, merge([](MergeArgs& a) { a.v = with_stride(a.v, 0, -1); })},
      {"VSplitsPastInt32", Vk, {fn, "'v_parts'", "below 2^31"},
       merge([](MergeArgs& a) { a.v = with_stride(with_size(a.v, 0, int64_t{1} << 31), 0, 0); })},
      {"LseSplits", Vk, {fn, "'lse_parts'", "num_splits"}, merge([](MergeArgs& a) { a.lse = with_size(a.lse, 0, 1); })},
      {"LseDtype", T, {fn, "'lse_parts'"}, merge([](MergeArgs& a) { a.lse = with_dtype(a.lse, DType::kF16); })},
      {"LseDeviceKind", T, {fn, "'lse_parts'"}, merge([](MergeArgs& a) { a.lse = with_device(a.lse, kCuda); })},
      {"OHeadDim", Vk, {fn, "'out'", "head_dim"}, merge([](MergeArgs& a) { a.o = with_size(a.o, 2, 8); })},
      {"ODtype", T, {fn, "'out'"}, merge([](MergeArgs& a) { a.o = with_dtype(a.o, DType::kI32); })},
      {"LseOutShape", Vk, {fn, "'lse_out'", "num_heads"},
       merge([](MergeArgs& a) { a.lse_out = with_size(a.lse_out, 1, 2); })},
  };
}

INSTANTIATE_TEST_SUITE_P(MergeStates, BadInput, ::testing::ValuesIn(merge_cases()), case_name);

// ---- build_page_table ----

struct BuildArgs {
  TensorView r2t, req, lens;
  int page_size = 16;
  TensorView out;
  void operator()() const { msa::build_page_table(r2t, req, lens, page_size, out); }
};

BuildArgs valid_build() {
  static std::vector<int32_t> r2t(3 * 64, 0), out(2 * 4);
  static const V req = {2, 0}, lens = {64, 10};
  return {TensorView(r2t.data(), DType::kI32, {3, 64}), int_view(req), int_view(lens), 16,
          TensorView(out.data(), DType::kI32, {2, 4})};
}

std::function<void()> build(std::function<void(BuildArgs&)> edit) {
  return [=] {
    BuildArgs a = valid_build();
    edit(a);
    a();
  };
}

std::function<void()> build_values(V req, V lens) {
  return [=] {
    BuildArgs a = valid_build();
    a.req = int_view(req);
    a.lens = int_view(lens);
    a();
  };
}

TEST(Validation, TheBaselineBuildCallIsValid) { EXPECT_NO_THROW(valid_build()()); }

std::vector<BadCase> build_cases() {
  const std::string fn = "msa.build_page_table";
  const auto T = ErrorKind::kType;
  const auto Vk = ErrorKind::kValue;
  return {
      {"ReqToTokenDtype", T, {fn, "'req_to_token'"},
       build([](BuildArgs& a) { a.r2t = with_dtype(a.r2t, DType::kI64); })},
      {"ReqToTokenRank", Vk, {fn, "'req_to_token'"}, build([](BuildArgs& a) { a.r2t = first_dims(a.r2t, 1); })},
      {"ReqToTokenNegativeStride", Vk, {fn, "'req_to_token'"},
       build([](BuildArgs& a) { a.r2t = with_stride(a.r2t, 0, -64); })},
      {"ReqPoolIndicesDtype", T, {fn, "'req_pool_indices'"},
       build([](BuildArgs& a) { a.req = with_dtype(a.req, DType::kF32); })},
      {"ReqPoolIndicesStrided", Vk, {fn, "'req_pool_indices'", "contiguous"},
       build([](BuildArgs& a) { a.req = with_shape(a.req, {2}, {2}); })},
      {"SeqLensSize", Vk, {fn, "'seq_lens'", "batch_size"},
       build([](BuildArgs& a) { a.lens = with_size(a.lens, 0, 1); })},
      {"SeqLensStrided", Vk, {fn, "'seq_lens'", "contiguous"},
       build([](BuildArgs& a) { a.lens = with_shape(a.lens, {2}, {3}); })},
      {"SeqLensDeviceKind", T, {fn, "'seq_lens'"}, build([](BuildArgs& a) { a.lens = with_device(a.lens, kCuda); })},
      {"PageSizeZero", Vk, {fn, "'page_size'"}, build([](BuildArgs& a) { a.page_size = 0; })},
      {"OutDtype", T, {fn, "'out'"}, build([](BuildArgs& a) { a.out = with_dtype(a.out, DType::kI64); })},
      {"OutRows", Vk, {fn, "'out'", "batch_size"}, build([](BuildArgs& a) { a.out = with_size(a.out, 0, 1); })},
      {"OutRowsNotContiguous", Vk, {fn, "'out'", "contiguous rows"},
       build([](BuildArgs& a) { a.out = with_shape(a.out, {2, 2}, {4, 2}); })},
      {"ReqIndexOutOfPool", Vk, {fn, "'req_pool_indices'", "got 3"}, build_values({3, 0}, {64, 10})},
      {"ReqIndexNegative", Vk, {fn, "'req_pool_indices'", "got -1"}, build_values({-1, 0}, {64, 10})},
      {"SeqLenPastContext", Vk, {fn, "'seq_lens'", "got 65"}, build_values({2, 0}, {65, 10})},
      {"SeqLenNegative", Vk, {fn, "'seq_lens'", "got -2"}, build_values({2, 0}, {-2, 10})},
      {"OutTooNarrow", Vk, {fn, "'out'", "max_pages = 3"}, build([](BuildArgs& a) { a.out = with_size(a.out, 1, 3); })},
  };
}

INSTANTIATE_TEST_SUITE_P(BuildPageTable, BadInput, ::testing::ValuesIn(build_cases()), case_name);

}  // namespace
}  // namespace msa_test
