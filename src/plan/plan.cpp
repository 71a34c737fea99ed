// Host planning: checks the configuration and the host lengths, then lets the backend of the
// plan's device build its work lists and workspaces (CUDA) or nothing (CPU). Never synchronizes.
#include <algorithm>

#include "core/backend.h"
#include "msa/error.h"
#include "msa/plan.h"

namespace msa {

namespace {

void check_config(const char* fn, const AttentionConfig& c, const SplitOptions& s) {
  MSA_CHECK(c.num_qo_heads > 0, kValue, fn, ": argument 'num_qo_heads': expected > 0, got ", c.num_qo_heads);
  MSA_CHECK(c.num_kv_heads > 0, kValue, fn, ": argument 'num_kv_heads': expected > 0, got ", c.num_kv_heads);
  MSA_CHECK(c.num_qo_heads % c.num_kv_heads == 0, kValue, fn,
            ": argument 'num_qo_heads': expected a multiple of num_kv_heads = ", c.num_kv_heads, ", got ",
            c.num_qo_heads);
  MSA_CHECK(c.head_dim > 0, kValue, fn, ": argument 'head_dim': expected > 0, got ", c.head_dim);
  MSA_CHECK(c.head_dim_v >= 0, kValue, fn, ": argument 'head_dim_v': expected >= 0 (0: head_dim), got ",
            c.head_dim_v);
  MSA_CHECK(c.page_size > 0, kValue, fn, ": argument 'page_size': expected > 0, got ", c.page_size);
  MSA_CHECK(c.block_size == 128, kValue, fn, ": argument 'block_size': expected 128 (the contract's block), got ",
            c.block_size);
  // More slots than the blocks of the longest request select nothing more.
  MSA_CHECK(c.topk >= 0 && c.topk <= detail::kMaxRequestBlocks, kValue, fn, ": argument 'topk': expected 0..",
            detail::kMaxRequestBlocks, " (0: dense), got ", c.topk);
  MSA_CHECK(s.max_splits >= 0, kValue, fn, ": argument 'max_splits': expected >= 0, got ", s.max_splits);
  MSA_CHECK(s.fixed_split_blocks >= 0, kValue, fn, ": argument 'fixed_split_blocks': expected >= 0, got ",
            s.fixed_split_blocks);
}

void check_device(const char* fn, Device d) {
  if (d.type == DeviceType::kCPU) return;
  MSA_CHECK(detail::cuda::compiled(), kNotImplemented, fn, ": argument 'device': ", device_name(d),
            " requested, but this build of msa has no CUDA backend (rebuild with nvcc on the PATH)");
  MSA_CHECK(detail::cuda::available(), kNotImplemented, fn, ": argument 'device': ", device_name(d),
            " requested, but no CUDA GPU of compute capability >= 8.0 is visible");
}

}  // namespace

Plan plan_prefill(const AttentionConfig& cfg, Device device, std::span<const int32_t> qo_lens,
                  std::span<const int32_t> kv_lens, std::span<const int32_t> qo_offset, const SplitOptions& split) {
  const char* fn = "msa.plan_prefill";
  check_config(fn, cfg, split);
  const int64_t B = static_cast<int64_t>(qo_lens.size());
  MSA_CHECK(B >= 1, kValue, fn, ": argument 'qo_lens': expected at least one request, got 0");
  MSA_CHECK(static_cast<int64_t>(kv_lens.size()) == B, kValue, fn, ": argument 'kv_lens': expected ", B,
            " entries (one per request), got ", kv_lens.size());
  MSA_CHECK(qo_offset.empty() || static_cast<int64_t>(qo_offset.size()) == B, kValue, fn,
            ": argument 'qo_offset': expected ", B, " entries (one per request) or none, got ", qo_offset.size());
  Plan p;
  p.cfg_ = cfg;
  p.phase_ = Phase::kPrefill;
  p.device_ = device;
  p.batch_size_ = static_cast<int>(B);
  p.split_ = split;
  for (int64_t b = 0; b < B; ++b) {
    const int32_t ql = qo_lens[b], kl = kv_lens[b];
    MSA_CHECK(ql >= 0, kValue, fn, ": argument 'qo_lens': expected >= 0, got ", ql, " at request ", b);
    MSA_CHECK(kl >= 0, kValue, fn, ": argument 'kv_lens': expected >= 0, got ", kl, " at request ", b);
    const int64_t off = qo_offset.empty() ? int64_t(kl) - ql : qo_offset[b];
    if (cfg.causal) {
      MSA_CHECK(off >= 0 && off + ql <= kl, kValue, fn, ": argument '",
                qo_offset.empty() ? "qo_lens" : "qo_offset", "': expected qo_offset + qo_len <= kv_len and ",
                "qo_offset >= 0 for causal attention, got qo_offset = ", off, ", qo_len = ", ql, ", kv_len = ", kl,
                " at request ", b);
    } else {
      MSA_CHECK(off >= 0, kValue, fn, ": argument 'qo_offset': expected >= 0, got ", off, " at request ", b);
    }
    p.max_qo_len_ = std::max<int>(p.max_qo_len_, ql);
    p.max_kv_len_ = std::max<int64_t>(p.max_kv_len_, kl);
    p.total_q_ += ql;
  }
  MSA_CHECK(p.total_q_ <= INT32_MAX, kValue, fn, ": argument 'qo_lens': expected a sum below 2^31 (int32 qo_indptr), "
            "got ", p.total_q_);
  p.qo_lens_.assign(qo_lens.begin(), qo_lens.end());
  p.kv_lens_.assign(kv_lens.begin(), kv_lens.end());
  p.qo_offset_.assign(qo_offset.begin(), qo_offset.end());
  check_device(fn, device);
  if (device.is_cuda()) p.state_ = detail::cuda::make_plan_state(p);
  return p;
}

Plan plan_decode(const AttentionConfig& cfg, Device device, int batch_size, int max_qo_len, int64_t max_kv_len,
                 const SplitOptions& split) {
  const char* fn = "msa.plan_decode";
  check_config(fn, cfg, split);
  MSA_CHECK(batch_size >= 1, kValue, fn, ": argument 'batch_size': expected >= 1, got ", batch_size);
  MSA_CHECK(max_qo_len >= 1 && max_qo_len <= 16, kValue, fn,
            ": argument 'max_qo_len': expected 1..16 query tokens per request, got ", max_qo_len);
  MSA_CHECK(max_kv_len >= 1 && max_kv_len <= INT32_MAX, kValue, fn,
            ": argument 'max_kv_len': expected 1..2^31 - 1 (int32 kv_lens), got ", max_kv_len);
  MSA_CHECK(int64_t{batch_size} * max_qo_len <= INT32_MAX, kValue, fn,
            ": arguments 'batch_size' x 'max_qo_len': expected below 2^31 (int32 qo_indptr), got ", batch_size, " x ",
            max_qo_len);
  Plan p;
  p.cfg_ = cfg;
  p.phase_ = Phase::kDecode;
  p.device_ = device;
  p.batch_size_ = batch_size;
  p.max_qo_len_ = max_qo_len;
  p.max_kv_len_ = max_kv_len;
  p.total_q_ = int64_t(batch_size) * max_qo_len;
  p.split_ = split;
  check_device(fn, device);
  if (device.is_cuda()) p.state_ = detail::cuda::make_plan_state(p);
  return p;
}

Plan Plan::clone() const {
  Plan p = *this;
  p.state_.reset();  // the copy shares this plan's; the backend builds the clone its own
  if (device_.is_cuda()) p.state_ = detail::cuda::make_plan_state(p);
  return p;
}

std::string Plan::describe() const {
  if (!state_) return std::string("backend=cpu phase=") + (phase_ == Phase::kDecode ? "decode" : "prefill");
  return std::string("backend=cuda phase=") + (phase_ == Phase::kDecode ? "decode " : "prefill ") + state_->describe();
}

}  // namespace msa
