// The front door: every public entry point validates its arguments (contract §6), converts the
// TensorViews into the plain params of params.h, and dispatches on the tensors' device.
//
// Checks on tensor metadata (rank, dtype, device, shape, strides) always run; the dtypes first, in
// the order of the arguments, so that a message names the first argument of a wrong dtype. Checks on
// values (lengths, page-table extents, page ids, block ids; core/value_checks.h) run whenever the
// values are host-readable (CPU tensors: they cost little beside the reference's compute) and, for
// CUDA tensors, only with RunOptions::validate, because reading device values would synchronize and
// break CUDA-graph capture. Kernels never read out of bounds whatever the values.
#include <algorithm>
#include <cmath>
#include <optional>

#include "core/backend.h"
#include "core/checks.h"
#include "core/value_checks.h"
#include "msa/error.h"
#include "msa/ops.h"

namespace msa {

using namespace detail;

namespace {

constexpr int kBlock = 128;

// Named lists: a braced list's backing array lives only as long as the list it initialises, so
// choosing between two temporaries with ?: would leave the chosen one dangling.
constexpr std::initializer_list<DType> kGpuFloats{DType::kBF16, DType::kF16};
constexpr std::initializer_list<DType> kCpuFloats{DType::kBF16, DType::kF16, DType::kF32};
std::initializer_list<DType> float_types(bool gpu) { return gpu ? kGpuFloats : kCpuFloats; }

CacheParams cache_params(const TensorView& t) {
  CacheParams c;
  c.data = t.data();
  c.stride_page = t.stride(0);
  c.stride_head = t.stride(1);
  c.stride_token = t.stride(2);
  c.num_heads = static_cast<int32_t>(t.size(1));
  c.page_size = static_cast<int32_t>(t.size(2));
  c.dim = static_cast<int32_t>(t.size(3));
  return c;
}

PageTableParams page_params(const char* fn, const PageTable& pt, int64_t B, Device dev, int64_t num_pages) {
  PageTableParams p;
  p.num_pages = static_cast<int32_t>(num_pages);
  if (pt.indptr.defined()) {
    arg(fn, "page_table", pt.table).present().dtype({DType::kI32}).ndim(1, "[num_page_entries] (flat form)")
        .device(dev).nonneg_strides();
    arg(fn, "page_indptr", pt.indptr).present().dtype({DType::kI32}).ndim(1, "[batch_size + 1]")
        .size(0, B + 1, "batch_size + 1").device(dev);
    MSA_CHECK(pt.table.stride(0) == 1 && pt.indptr.stride(0) == 1, kValue, fn,
              ": arguments 'page_table' and 'page_indptr': expected contiguous, got strides ",
              pt.table.strides_str(), " and ", pt.indptr.strides_str());
    p.table = pt.table.data_as<const int32_t>();
    p.indptr = pt.indptr.data_as<const int32_t>();
    p.row_capacity = pt.table.size(0);
  } else {
    arg(fn, "page_table", pt.table).present().dtype({DType::kI32}).ndim(2, "[batch_size, max_pages] (dense form)")
        .size_at_least(0, B, "batch_size").device(dev).nonneg_strides();
    MSA_CHECK(pt.table.size(1) <= 1 || pt.table.stride(1) == 1, kValue, fn,
              ": argument 'page_table': expected contiguous rows (stride 1 along pages), got strides ",
              pt.table.strides_str());
    p.table = pt.table.data_as<const int32_t>();
    p.row_stride = pt.table.stride(0);
    p.row_capacity = pt.table.size(1);
  }
  return p;
}

float resolve_scale(const char* fn, float s, int head_dim) {
  if (s == 0.f) return 1.0f / std::sqrt(static_cast<float>(head_dim));
  MSA_CHECK(std::isfinite(s), kValue, fn, ": argument 'sm_scale': expected a finite number, got ", s);
  return s;
}

// The logits' scale sm_scale * q_scale * k_scale, multiplied in double and rounded once: for K/V in q's
// dtype exactly what the caller would fold into sm_scale; for fp8 K/V the same as dequantizing every key.
float logit_scale(const char* fn, const RunOptions& opts, int head_dim) {
  const double s = double(resolve_scale(fn, opts.sm_scale, head_dim)) * opts.q_scale * opts.k_scale;
  const float f = static_cast<float>(s);
  MSA_CHECK(std::isfinite(f) && f != 0.f, kValue, fn,
            ": arguments 'sm_scale' * 'q_scale' * 'k_scale': expected a product within the float range, got ", s);
  return f;
}

void check_cuda_ready(const char* fn, Device d) {
  if (!d.is_cuda()) return;
  MSA_CHECK(cuda::compiled(), kNotImplemented, fn,
            ": CUDA tensors passed, but this build of msa has no CUDA backend (rebuild with nvcc on the PATH)");
}

}  // namespace

bool cuda_available() { return cuda::compiled() && cuda::available(); }

int cuda_compute_capability() { return cuda_available() ? cuda::current_compute_capability() : 0; }

void attention(const Plan& plan, const TensorView& q, const TensorView& k, const TensorView& v, const PageTable& pages,
               const Sequences& seqs, const TensorView& block_idx, const TensorView& o, const TensorView& lse,
               const RunOptions& opts) {
  const char* fn = "msa.attention";
  MSA_CHECK(plan.valid(), kValue, fn, ": argument 'plan': expected a plan from plan_prefill or plan_decode");
  const AttentionConfig& c = plan.config();
  const Device dev = plan.device();
  const bool gpu = dev.is_cuda();
  check_cuda_ready(fn, dev);
  arg(fn, "q", q).present();
  const bool fp8_kv = k.dtype() == DType::kF8E4M3;
  check_dtypes(fn, {{"q", q, float_types(gpu)},
                    {"k", k, {q.dtype(), DType::kF8E4M3}, "the dtype of q, or fp8 e4m3 with k_scale and v_scale"},
                    {"v", v, {fp8_kv ? DType::kF8E4M3 : q.dtype()},
                     fp8_kv ? "as k: K and V are both fp8 e4m3 or both in the dtype of q"
                            : "the dtype of q, as k: K and V are both in the dtype of q or both fp8 e4m3"},
                    {"page_table", pages.table, {DType::kI32}},
                    {"qo_indptr", seqs.qo_indptr, {DType::kI32}},
                    {"kv_lens", seqs.kv_lens, {DType::kI32}},
                    {"block_idx", block_idx, {DType::kI32}},
                    {"qo_offset", seqs.qo_offset, {DType::kI32}},
                    {"page_indptr", pages.indptr, {DType::kI32}},
                    {"out", o, {q.dtype()}, "the dtype of q"},
                    {"lse", lse, {DType::kF32}}});
  arg(fn, "q", q).ndim(3, "[total_q, num_qo_heads, head_dim]").device(dev)
      .size(1, c.num_qo_heads, "num_qo_heads").size(2, c.head_dim, "head_dim").inner_contiguous().nonneg_strides();
  const int64_t total_q = q.size(0);
  if (plan.phase() == Phase::kPrefill)
    arg(fn, "q", q).size(0, plan.total_q(), "total_q of the prefill plan");
  else
    MSA_CHECK(total_q <= plan.total_q(), kValue, fn, ": argument 'q': expected shape[0] (total_q) <= ",
              plan.total_q(), " (batch_size * max_qo_len of the decode plan), got ", total_q);
  arg(fn, "k", k).present().ndim(4, "[num_pages, num_kv_heads, page_size, head_dim]").device(dev)
      .size(1, c.num_kv_heads, "num_kv_heads").size(2, c.page_size, "page_size").size(3, c.head_dim, "head_dim")
      .inner_contiguous().nonneg_strides();
  arg(fn, "v", v).present().ndim(4, "[num_pages, num_kv_heads, page_size, head_dim_v]")
      .device(dev).size(0, k.size(0), "num_pages, as k").size(1, c.num_kv_heads, "num_kv_heads")
      .size(2, c.page_size, "page_size").size(3, c.dv(), "head_dim_v").inner_contiguous().nonneg_strides();
  arg(fn, "out", o).present().ndim(3, "[total_q, num_qo_heads, head_dim_v]").device(dev)
      .size(0, total_q, "total_q").size(1, c.num_qo_heads, "num_qo_heads").size(2, c.dv(), "head_dim_v")
      .inner_contiguous().nonneg_strides();
  if (lse.defined())
    arg(fn, "lse", lse).present().ndim(2, "[total_q, num_qo_heads]").device(dev)
        .size(0, total_q, "total_q").size(1, c.num_qo_heads, "num_qo_heads").nonneg_strides();
  if (c.topk > 0) {
    MSA_CHECK(block_idx.defined(), kValue, fn, ": argument 'block_idx' is required: the plan is sparse (topk = ",
              c.topk, ")");
    arg(fn, "block_idx", block_idx).present().ndim(3, "[total_q, num_kv_heads, topk]")
        .device(dev).size(0, total_q, "total_q").size(1, c.num_kv_heads, "num_kv_heads").size(2, c.topk, "topk")
        .nonneg_strides();
  } else {
    MSA_CHECK(!block_idx.defined(), kValue, fn,
              ": argument 'block_idx': the plan is dense (topk = 0); build it with topk > 0 for sparse attention");
  }
  check_scales(fn, opts);
  const float sm_scale = logit_scale(fn, opts, c.head_dim);
  if (gpu) {
    for (auto [name, t] : {std::pair<const char*, const TensorView*>{"q", &q}, {"k", &k}, {"v", &v}, {"out", &o}})
      arg(fn, name, *t).aligned(16);
  }
  const int64_t B = plan.batch_size();
  AttentionParams p;
  p.dtype = scalar_type(q.dtype());
  p.kv_dtype = scalar_type(k.dtype());
  p.q = q.data();
  p.q_stride_token = q.stride(0);
  p.q_stride_head = q.stride(1);
  p.num_qo_heads = c.num_qo_heads;
  p.num_kv_heads = c.num_kv_heads;
  p.group_size = c.group_size();
  p.head_dim = c.head_dim;
  p.head_dim_v = c.dv();
  p.k = cache_params(k);
  p.v = cache_params(v);
  p.pages = page_params(fn, pages, B, dev, k.size(0));
  p.seqs = seq_params(fn, seqs, B, dev, total_q);
  if (c.topk > 0) {
    p.block_idx = block_idx.data_as<const int32_t>();
    p.bi_stride_token = block_idx.stride(0);
    p.bi_stride_head = block_idx.stride(1);
    p.bi_stride_k = block_idx.stride(2);
    p.topk = c.topk;
  }
  p.block_size = c.block_size;
  p.causal = c.causal;
  p.sm_scale = sm_scale;
  p.v_scale = opts.v_scale;
  p.o = o.data();
  p.o_stride_token = o.stride(0);
  p.o_stride_head = o.stride(1);
  if (lse.defined()) {
    p.lse = lse.data_as<float>();
    p.lse_stride_token = lse.stride(0);
    p.lse_stride_head = lse.stride(1);
  }
  p.max_qo_len = plan.max_qo_len();
  p.max_kv_len = plan.max_kv_len();

  if (!gpu || opts.validate) {
    HostSeqs h = host_seqs(seqs, opts.stream);
    check_seq_values(fn, h, B, total_q, c.causal, &plan);
    check_page_values(fn, pages, p.pages, h, B, c.page_size, /*entries=*/true, opts.stream);
    if (c.topk > 0) check_block_idx_values(fn, block_idx, h, B, opts.stream);
  }
  if (total_q == 0) return;
  if (gpu)
    cuda::attention(plan, p, opts.stream);
  else
    reference::attention(p);
}

void block_scores(const TensorView& q, const TensorView& k_index, const TensorView& k_scale, const PageTable& pages,
                  const Sequences& seqs, const TensorView& out, ScoreLayout layout, bool causal,
                  const RunOptions& opts) {
  const char* fn = "msa.block_scores";
  const Device dev = q.device();
  const bool gpu = dev.is_cuda();
  check_cuda_ready(fn, dev);
  arg(fn, "q", q).present();
  check_dtypes(fn, {{"q", q, float_types(gpu)},
                    {"k_index", k_index, {q.dtype(), DType::kF8E4M3}, "the dtype of q, or fp8 with k_scale"},
                    {"page_table", pages.table, {DType::kI32}},
                    {"qo_indptr", seqs.qo_indptr, {DType::kI32}},
                    {"kv_lens", seqs.kv_lens, {DType::kI32}},
                    {"qo_offset", seqs.qo_offset, {DType::kI32}},
                    {"page_indptr", pages.indptr, {DType::kI32}},
                    {"k_scale", k_scale, {DType::kF32}},
                    {"out", out, {DType::kF32}}});
  arg(fn, "q", q).ndim(3, "[total_q, num_heads, head_dim]").inner_contiguous().nonneg_strides();
  const int64_t T = q.size(0), H = q.size(1), D = q.size(2);
  arg(fn, "k_index", k_index).present().ndim(4, "[num_pages, num_k_heads, page_size, head_dim]").device(dev)
      .size(3, D, "head_dim, as q").inner_contiguous().nonneg_strides();
  MSA_CHECK(k_index.size(2) >= 1, kValue, fn, ": argument 'k_index': expected page_size (shape[2]) >= 1, got shape ",
            k_index.shape_str());
  const bool fp8 = k_index.dtype() == DType::kF8E4M3;
  if (fp8) {
    arg(fn, "k_scale", k_scale).present().ndim(3, "[num_pages, num_k_heads, page_size]")
        .device(dev).size(0, k_index.size(0), "num_pages, as k_index").size(1, k_index.size(1), "num_k_heads")
        .size(2, k_index.size(2), "page_size").nonneg_strides();
  } else {
    MSA_CHECK(!k_scale.defined(), kValue, fn,
              ": argument 'k_scale': only used with float8_e4m3fn k_index, got k_index ", dtype_name(k_index.dtype()));
  }
  const int64_t Hk = k_index.size(1);
  MSA_CHECK(Hk >= 1 && H % Hk == 0, kValue, fn, ": argument 'k_index': expected shape[1] (num_k_heads) to divide ",
            "num_heads = ", H, ", got ", Hk);
  const int64_t B = seqs.kv_lens.defined() ? seqs.kv_lens.size(0) : 0;
  MSA_CHECK(B >= 1, kValue, fn, ": argument 'kv_lens': expected at least one request");
  arg(fn, "out", out).present().device(dev).nonneg_strides();
  int64_t max_blocks;
  BlockScoresParams p;
  if (layout == ScoreLayout::kHKT) {
    arg(fn, "out", out).ndim(3, "[num_heads, max_blocks, total_q] (HKT)").size(0, H, "num_heads").size(2, T, "total_q");
    max_blocks = out.size(1);
    p.out_stride_head = out.stride(0);
    p.out_stride_block = out.stride(1);
    p.out_stride_token = out.stride(2);
  } else {
    arg(fn, "out", out).ndim(3, "[total_q, num_heads, max_blocks] (THK)").size(0, T, "total_q").size(1, H, "num_heads");
    max_blocks = out.size(2);
    p.out_stride_token = out.stride(0);
    p.out_stride_head = out.stride(1);
    p.out_stride_block = out.stride(2);
  }
  if (gpu) {
    arg(fn, "q", q).aligned(16);
    arg(fn, "k_index", k_index).aligned(16);
  }
  p.q_dtype = scalar_type(q.dtype());
  p.k_dtype = scalar_type(k_index.dtype());
  p.q = q.data();
  p.q_stride_token = q.stride(0);
  p.q_stride_head = q.stride(1);
  p.num_heads = static_cast<int32_t>(H);
  p.head_dim = static_cast<int32_t>(D);
  p.k = cache_params(k_index);
  if (fp8) {
    p.k_scale = k_scale.data_as<const float>();
    p.ks_stride_page = k_scale.stride(0);
    p.ks_stride_head = k_scale.stride(1);
    p.ks_stride_token = k_scale.stride(2);
  }
  p.pages = page_params(fn, pages, B, dev, k_index.size(0));
  p.seqs = seq_params(fn, seqs, B, dev, T);
  p.causal = causal;
  p.out = out.data_as<float>();
  p.max_blocks = static_cast<int32_t>(max_blocks);
  if (!gpu || opts.validate) {
    HostSeqs h = host_seqs(seqs, opts.stream);
    check_seq_values(fn, h, B, T, causal, nullptr);
    for (int64_t b = 0; b < B; ++b)
      MSA_CHECK(ceil_div(h.kv_len(b), kBlock) <= max_blocks, kValue, fn, ": argument 'out': request ", b,
                " has kv_len = ", h.kv_len(b), " (", ceil_div(h.kv_len(b), kBlock),
                " blocks) but out holds max_blocks = ", max_blocks);
    check_page_values(fn, pages, p.pages, h, B, k_index.size(2), /*entries=*/true, opts.stream);
  }
  if (T == 0 || max_blocks == 0) return;
  if (gpu)
    cuda::block_scores(p, opts.stream);
  else
    reference::block_scores(p);
}

// The selection's own arguments, shared by select_topk and merge_candidates: checked, then into p.
static void selection_args(const char* fn, bool gpu, const Device& dev, int64_t T, int64_t H, int topk, int force_begin,
                           int force_end, const TensorView& out, bool causal, SelectTopkParams& p) {
  constexpr int kMaxTopk = 1 << 20, kMaxGpuTopk = 64;  // kTopkMaxK of the CUDA indexer (cuda/indexer/config.h)
  MSA_CHECK(topk >= 1 && topk <= kMaxTopk, kValue, fn, ": argument 'topk': expected 1..", kMaxTopk, ", got ", topk);
  MSA_CHECK(!gpu || topk <= kMaxGpuTopk, kNotImplemented, fn, ": argument 'topk': the CUDA backend selects 1..",
            kMaxGpuTopk, " blocks a row, got ", topk);
  MSA_CHECK(force_begin >= 0, kValue, fn, ": argument 'force_begin': expected >= 0, got ", force_begin);
  MSA_CHECK(force_end >= 0, kValue, fn, ": argument 'force_end': expected >= 0, got ", force_end);
  MSA_CHECK(int64_t{force_begin} + force_end <= topk, kValue, fn,
            ": arguments 'force_begin' + 'force_end': expected <= topk = ", topk, ", got ",
            int64_t{force_begin} + force_end);
  arg(fn, "out", out).present().ndim(3, "[total_q, num_heads, topk]").device(dev)
      .size(0, T, "total_q").size(1, H, "num_heads").size(2, topk, "topk").nonneg_strides();
  p.topk = topk;
  p.force_begin = force_begin;
  p.force_end = force_end;
  p.causal = causal;
  p.out = out.data_as<int32_t>();
  p.out_stride_token = out.stride(0);
  p.out_stride_head = out.stride(1);
  p.out_stride_k = out.stride(2);
}

void select_topk(const TensorView& scores, ScoreLayout layout, const Sequences& seqs, int topk, int force_begin,
                 int force_end, const TensorView& out, bool causal, const RunOptions& opts,
                 const SelectTopkOptions& select) {
  const char* fn = "msa.select_topk";
  const Device dev = scores.device();
  const bool gpu = dev.is_cuda();
  check_cuda_ready(fn, dev);
  arg(fn, "scores", scores).present();
  check_dtypes(fn, {{"scores", scores, {DType::kF32}},
                    {"qo_indptr", seqs.qo_indptr, {DType::kI32}},
                    {"kv_lens", seqs.kv_lens, {DType::kI32}},
                    {"qo_offset", seqs.qo_offset, {DType::kI32}},
                    {"out", out, {DType::kI32}},
                    {"block_map", select.block_map, {DType::kI32}},
                    {"out_scores", select.out_scores, {DType::kF32}}});
  const bool hkt = layout == ScoreLayout::kHKT;
  arg(fn, "scores", scores)
      .ndim(3, hkt ? "[num_heads, max_blocks, total_q] (HKT)" : "[total_q, num_heads, max_blocks] (THK)")
      .nonneg_strides();
  SelectTopkParams p;
  const int64_t T = scores.size(hkt ? 2 : 0), H = scores.size(hkt ? 0 : 1), NB = scores.size(hkt ? 1 : 2);
  p.s_stride_token = scores.stride(hkt ? 2 : 0);
  p.s_stride_head = scores.stride(hkt ? 0 : 1);
  p.s_stride_block = scores.stride(hkt ? 1 : 2);
  const int64_t B = seqs.kv_lens.defined() ? seqs.kv_lens.size(0) : 0;
  MSA_CHECK(B >= 1, kValue, fn, ": argument 'kv_lens': expected at least one request");
  p.seqs = seq_params(fn, seqs, B, dev, T);
  // The scores against the lengths before anything is checked against the scores: scores of the wrong
  // shape (or layout) are reported as such, not as a qo_indptr past the scores' tokens.
  std::optional<HostSeqs> h;
  if (!gpu || opts.validate) {
    h = host_seqs(seqs, opts.stream);
    int64_t need_t = std::max<int64_t>(h->qo_indptr.at(B), 0), need_nb = 0;
    for (int64_t b = 0; b < B; ++b) need_nb = std::max(need_nb, ceil_div(std::max<int64_t>(h->kv_len(b), 0), kBlock));
    MSA_CHECK(T >= need_t && NB >= need_nb, kValue, fn, ": argument 'scores': expected shape ",
              hkt ? "[num_heads, max_blocks >= " : "[total_q >= ", hkt ? need_nb : need_t,
              hkt ? ", total_q >= " : ", num_heads, max_blocks >= ", hkt ? need_t : need_nb, "] (layout ",
              hkt ? "HKT" : "THK", "; total_q from qo_indptr[batch_size], max_blocks = ceil(max kv_len / 128)), got ",
              scores.shape_str());
  }
  selection_args(fn, gpu, dev, T, H, topk, force_begin, force_end, out, causal, p);
  p.scores = scores.data_as<const float>();
  p.num_heads = static_cast<int32_t>(H);
  p.max_blocks = static_cast<int32_t>(NB);
  p.finite_only = select.finite_only;
  if (select.block_map.defined()) {
    arg(fn, "block_map", select.block_map).ndim(2, "[batch_size, max_blocks]").device(dev)
        .size(0, B, "batch_size").size_at_least(1, NB, "max_blocks, the scores' block extent").nonneg_strides();
    p.block_map = select.block_map.data_as<const int32_t>();
    p.bm_stride_req = select.block_map.stride(0);
    p.bm_stride_block = select.block_map.stride(1);
  }
  if (select.out_scores.defined()) {
    arg(fn, "out_scores", select.out_scores).ndim(3, "[total_q, num_heads, topk]").device(dev)
        .size(0, T, "total_q").size(1, H, "num_heads").size(2, topk, "topk").nonneg_strides();
    p.out_scores = select.out_scores.data_as<float>();
    p.os_stride_token = select.out_scores.stride(0);
    p.os_stride_head = select.out_scores.stride(1);
    p.os_stride_k = select.out_scores.stride(2);
  }
  if (h) check_seq_values(fn, *h, B, T, causal, nullptr, "scores");
  if (T == 0) return;
  if (gpu)
    cuda::select_topk(p, opts.stream);
  else
    reference::select_topk(p);
}

void merge_candidates(const TensorView& cand_scores, const TensorView& cand_ids, const Sequences& seqs,
                      int max_blocks, int topk, int force_begin, int force_end, const TensorView& out, bool causal,
                      const RunOptions& opts) {
  const char* fn = "msa.merge_candidates";
  const Device dev = cand_scores.device();
  const bool gpu = dev.is_cuda();
  check_cuda_ready(fn, dev);
  arg(fn, "cand_scores", cand_scores).present();
  check_dtypes(fn, {{"cand_scores", cand_scores, {DType::kF32}},
                    {"cand_ids", cand_ids, {DType::kI32}},
                    {"qo_indptr", seqs.qo_indptr, {DType::kI32}},
                    {"kv_lens", seqs.kv_lens, {DType::kI32}},
                    {"qo_offset", seqs.qo_offset, {DType::kI32}},
                    {"out", out, {DType::kI32}}});
  arg(fn, "cand_scores", cand_scores).ndim(4, "[num_ranks, total_q, num_heads, k]").nonneg_strides();
  const int64_t N = cand_scores.size(0), T = cand_scores.size(1), H = cand_scores.size(2), K = cand_scores.size(3);
  arg(fn, "cand_ids", cand_ids).present().ndim(4, "[num_ranks, total_q, num_heads, k]").device(dev)
      .size(0, N, "num_ranks").size(1, T, "total_q").size(2, H, "num_heads").size(3, K, "k").nonneg_strides();
  MSA_CHECK(N >= 1 && K >= 1, kValue, fn, ": argument 'cand_scores': expected at least one rank and one candidate "
            "per rank, got shape ", cand_scores.shape_str());
  MSA_CHECK(N * K <= INT32_MAX, kValue, fn, ": argument 'cand_scores': expected num_ranks x k < 2^31, got shape ",
            cand_scores.shape_str());
  // At most the blocks of the longest int32 kv_len (the CPU backend holds a row of max_blocks scores a worker).
  MSA_CHECK(max_blocks >= 1 && max_blocks <= kMaxRequestBlocks, kValue, fn, ": argument 'max_blocks': expected 1..",
            kMaxRequestBlocks, " (ceil(2^31 / 128)), got ", max_blocks);
  const int64_t B = seqs.kv_lens.defined() ? seqs.kv_lens.size(0) : 0;
  MSA_CHECK(B >= 1, kValue, fn, ": argument 'kv_lens': expected at least one request");
  MergeCandidatesParams p;
  SelectTopkParams& s = p.select;
  s.seqs = seq_params(fn, seqs, B, dev, T);
  std::optional<HostSeqs> h;
  if (!gpu || opts.validate) {
    h = host_seqs(seqs, opts.stream);
    int64_t need_t = std::max<int64_t>(h->qo_indptr.at(B), 0), need_nb = 0;
    for (int64_t b = 0; b < B; ++b) need_nb = std::max(need_nb, ceil_div(std::max<int64_t>(h->kv_len(b), 0), kBlock));
    MSA_CHECK(T >= need_t, kValue, fn, ": argument 'cand_scores': expected total_q >= ", need_t,
              " (qo_indptr[batch_size]), got shape ", cand_scores.shape_str());
    MSA_CHECK(max_blocks >= need_nb, kValue, fn, ": argument 'max_blocks': expected >= ", need_nb,
              " (ceil(max kv_len / 128)), got ", max_blocks);
  }
  selection_args(fn, gpu, dev, T, H, topk, force_begin, force_end, out, causal, s);
  s.num_heads = static_cast<int32_t>(H);
  s.max_blocks = max_blocks;
  p.scores = cand_scores.data_as<const float>();
  p.s_stride_rank = cand_scores.stride(0);
  p.s_stride_token = cand_scores.stride(1);
  p.s_stride_head = cand_scores.stride(2);
  p.s_stride_k = cand_scores.stride(3);
  p.ids = cand_ids.data_as<const int32_t>();
  p.i_stride_rank = cand_ids.stride(0);
  p.i_stride_token = cand_ids.stride(1);
  p.i_stride_head = cand_ids.stride(2);
  p.i_stride_k = cand_ids.stride(3);
  p.num_ranks = static_cast<int32_t>(N);
  p.per_rank = static_cast<int32_t>(K);
  if (h) check_seq_values(fn, *h, B, T, causal, nullptr, "cand_scores");
  if (T == 0 || H == 0) return;
  if (gpu)
    cuda::merge_candidates(p, opts.stream);
  else
    reference::merge_candidates(p);
}

void merge_states(const TensorView& v_parts, const TensorView& lse_parts, const TensorView& o,
                  const TensorView& lse_out, const RunOptions& opts) {
  const char* fn = "msa.merge_states";
  const Device dev = v_parts.device();
  const bool gpu = dev.is_cuda();
  check_cuda_ready(fn, dev);
  check_dtypes(fn, {{"v_parts", v_parts, {DType::kF32, DType::kBF16, DType::kF16}},
                    {"lse_parts", lse_parts, {DType::kF32}},
                    {"out", o, {DType::kF32, DType::kBF16, DType::kF16}},
                    {"lse_out", lse_out, {DType::kF32}}});
  arg(fn, "v_parts", v_parts).present()
      .ndim(4, "[num_splits, total_q, num_heads, head_dim]").inner_contiguous().nonneg_strides();
  const int64_t S = v_parts.size(0), T = v_parts.size(1), H = v_parts.size(2), D = v_parts.size(3);
  arg(fn, "lse_parts", lse_parts).present().ndim(3, "[num_splits, total_q, num_heads]")
      .device(dev).size(0, S, "num_splits").size(1, T, "total_q").size(2, H, "num_heads").nonneg_strides();
  arg(fn, "out", o).present().ndim(3, "[total_q, num_heads, head_dim]")
      .device(dev).size(0, T, "total_q").size(1, H, "num_heads").size(2, D, "head_dim").inner_contiguous()
      .nonneg_strides();
  if (lse_out.defined())
    arg(fn, "lse_out", lse_out).present().ndim(2, "[total_q, num_heads]").device(dev)
        .size(0, T, "total_q").size(1, H, "num_heads").nonneg_strides();
  MergeParams p;
  p.v_dtype = scalar_type(v_parts.dtype());
  p.o_dtype = scalar_type(o.dtype());
  p.v = v_parts.data();
  p.v_stride_split = v_parts.stride(0), p.v_stride_token = v_parts.stride(1), p.v_stride_head = v_parts.stride(2);
  p.lse = lse_parts.data_as<const float>();
  p.lse_stride_split = lse_parts.stride(0), p.lse_stride_token = lse_parts.stride(1);
  p.lse_stride_head = lse_parts.stride(2);
  p.num_splits = static_cast<int32_t>(S);
  p.num_heads = static_cast<int32_t>(H);
  p.head_dim = static_cast<int32_t>(D);
  p.num_tokens = T;
  p.o = o.data();
  p.o_stride_token = o.stride(0), p.o_stride_head = o.stride(1);
  if (lse_out.defined()) {
    p.lse_out = lse_out.data_as<float>();
    p.lse_out_stride_token = lse_out.stride(0), p.lse_out_stride_head = lse_out.stride(1);
  }
  if (T == 0 || H == 0) return;
  if (gpu)
    cuda::merge_states(p, opts.stream);
  else
    reference::merge_states(p);
}

void build_page_table(const TensorView& req_to_token, const TensorView& req_pool_indices, const TensorView& seq_lens,
                      int page_size, const TensorView& out, const RunOptions& opts) {
  const char* fn = "msa.build_page_table";
  const Device dev = req_to_token.device();
  const bool gpu = dev.is_cuda();
  check_cuda_ready(fn, dev);
  check_dtypes(fn, {{"req_to_token", req_to_token, {DType::kI32}},
                    {"req_pool_indices", req_pool_indices, {DType::kI32, DType::kI64}},
                    {"seq_lens", seq_lens, {DType::kI32, DType::kI64}},
                    {"out", out, {DType::kI32}}});
  arg(fn, "req_to_token", req_to_token).present().ndim(2, "[pool_size, max_context]")
      .nonneg_strides();
  arg(fn, "req_pool_indices", req_pool_indices).present().ndim(1, "[batch_size]")
      .device(dev);
  const int64_t B = req_pool_indices.size(0);
  arg(fn, "seq_lens", seq_lens).present().ndim(1, "[batch_size]").device(dev)
      .size(0, B, "batch_size");
  MSA_CHECK(page_size > 0, kValue, fn, ": argument 'page_size': expected > 0, got ", page_size);
  arg(fn, "out", out).present().ndim(2, "[batch_size, max_pages]").device(dev)
      .size(0, B, "batch_size").nonneg_strides();
  MSA_CHECK(out.size(1) <= 1 || out.stride(1) == 1, kValue, fn,
            ": argument 'out': expected contiguous rows, got strides ", out.strides_str());
  MSA_CHECK(req_pool_indices.stride(0) == 1 || B <= 1, kValue, fn,
            ": argument 'req_pool_indices': expected contiguous, got strides ", req_pool_indices.strides_str());
  MSA_CHECK(seq_lens.stride(0) == 1 || B <= 1, kValue, fn, ": argument 'seq_lens': expected contiguous, got strides ",
            seq_lens.strides_str());
  PageTableBuildParams p;
  p.req_to_token = req_to_token.data_as<const int32_t>();
  p.r2t_stride_req = req_to_token.stride(0);
  p.r2t_stride_token = req_to_token.stride(1);
  p.num_reqs_pool = static_cast<int32_t>(req_to_token.size(0));
  p.max_context = req_to_token.size(1);
  p.req_pool_indices = req_pool_indices.data();
  p.req_pool_indices_i64 = req_pool_indices.dtype() == DType::kI64;
  p.seq_lens = seq_lens.data();
  p.seq_lens_i64 = seq_lens.dtype() == DType::kI64;
  p.batch_size = static_cast<int32_t>(B);
  p.page_size = page_size;
  p.out = out.data_as<int32_t>();
  p.out_stride_b = out.stride(0);
  p.max_pages = static_cast<int32_t>(out.size(1));
  if (!gpu || opts.validate) {
    HostInts idx(req_pool_indices, opts.stream), lens(seq_lens, opts.stream);
    for (int64_t b = 0; b < B; ++b) {
      MSA_CHECK(idx.at(b) >= 0 && idx.at(b) < p.num_reqs_pool, kValue, fn, ": argument 'req_pool_indices': entry ",
                b, ": expected a row of req_to_token in [0, ", p.num_reqs_pool, "), got ", idx.at(b));
      MSA_CHECK(lens.at(b) >= 0 && lens.at(b) <= p.max_context, kValue, fn, ": argument 'seq_lens': entry ", b,
                ": expected 0..", p.max_context, " (max_context of req_to_token), got ", lens.at(b));
      MSA_CHECK(ceil_div(lens.at(b), page_size) <= p.max_pages, kValue, fn, ": argument 'out': request ", b,
                " needs ", ceil_div(lens.at(b), page_size), " pages, out holds max_pages = ", p.max_pages);
    }
  }
  if (B == 0 || p.max_pages == 0) return;
  if (gpu)
    cuda::build_page_table(p, opts.stream);
  else
    reference::build_page_table(p);
}

}  // namespace msa
