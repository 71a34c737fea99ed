// Plans: the host-side half of the plan/run split.
//
// A Plan fixes what an attention call computes (heads, head dims, page and block size, top-k,
// causality), where it runs, and how the work is decomposed; it owns every workspace buffer that
// run needs. Building a plan never waits on the device. Running it (msa::attention) only launches.
//
//  * plan_decode depends only on (batch size, heads, top-k, limits), never on the lengths: the
//    lengths, page table and block indexes are read on the device at run time, so a CUDA graph
//    captured once stays correct when the caller rewrites them in place.
//  * plan_prefill takes the host lengths of the batch and may use them to balance work; the
//    tensors passed to run must then describe the same lengths (kernels still never read out of
//    bounds if they do not).
//
// One plan, one run at a time: a CUDA plan's workspaces (split partials, work lists and their
// counters) are written by every run, so two runs of one plan in flight at once (on two streams, or
// from two threads) overwrite each other's and give wrong results. Concurrent callers use one plan
// each: Plan::clone() gives a second plan of the same configuration and lengths with workspaces of
// its own. Copying a Plan (or a shared_ptr to one) shares the workspaces.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "msa/tensor.h"

namespace msa {

enum class Phase { kPrefill, kDecode };

struct AttentionConfig {
  int num_qo_heads = 0;
  int num_kv_heads = 0;
  int head_dim = 128;    // D of q and k
  int head_dim_v = 0;    // D of v and o; 0 means head_dim
  int page_size = 128;   // tokens per physical KV page (any positive value)
  int block_size = 128;  // tokens per selectable block; the contract fixes 128
  int topk = 0;          // 0: dense attention; > 0: sparse, each block_idx row holds topk slots
  bool causal = true;

  int dv() const { return head_dim_v > 0 ? head_dim_v : head_dim; }
  int group_size() const { return num_kv_heads > 0 ? num_qo_heads / num_kv_heads : 0; }
};

struct SplitOptions {
  // Read by the paged kernel family (decode on every GPU, prefill off sm_90); the Hopper prefill kernels
  // do not split. Upper bound on the number of splits of one (request, KV head) over its blocks.
  // 0: chosen from the device (enough work items to fill every SM); 1: never split.
  int max_splits = 0;
  // > 0 (decode plans): split s covers entries [sF, (s + 1)F) of a request's list, the last split the
  // rest, whatever the batch, so results are bitwise batch-invariant (the merge order is fixed too).
  int fixed_split_blocks = 0;
};

namespace detail {
struct PlanState;  // backend-owned: work lists, workspaces (defined per backend)
}

class Plan {
 public:
  Plan() = default;

  const AttentionConfig& config() const { return cfg_; }
  Phase phase() const { return phase_; }
  Device device() const { return device_; }
  int batch_size() const { return batch_size_; }
  int max_qo_len() const { return max_qo_len_; }
  int64_t max_kv_len() const { return max_kv_len_; }
  // Prefill plans: the sum of qo_lens. Decode plans: batch_size * max_qo_len (an upper bound).
  int64_t total_q() const { return total_q_; }
  // Host lengths a prefill plan was built from (empty for decode plans).
  const std::vector<int32_t>& qo_lens() const { return qo_lens_; }
  const std::vector<int32_t>& kv_lens() const { return kv_lens_; }
  const std::vector<int32_t>& qo_offset() const { return qo_offset_; }  // empty: kv_len - qo_len
  const SplitOptions& split_options() const { return split_; }
  bool valid() const { return batch_size_ > 0; }

  // How the plan runs, as space-separated key=value pairs: the backend, and for CUDA plans the kernel
  // family of each path and its work split (e.g. "backend=cuda phase=decode device=0 sm=90 paged=token
  // splits=16 merge=push").
  // For logs and tests; the keys may grow.
  std::string describe() const;

  // A plan of the same configuration, device, lengths and split options with workspaces of its own
  // (the backend's planning runs again; it never synchronizes), for a run that may overlap this plan's
  // runs, e.g. on another stream. On the CPU backend, which keeps no state, an equal plan.
  Plan clone() const;

  // Backend state (work lists, workspaces); null for the CPU backend. Copies of a Plan share it.
  const std::shared_ptr<detail::PlanState>& state() const { return state_; }

 private:
  friend Plan plan_prefill(const AttentionConfig&, Device, std::span<const int32_t>, std::span<const int32_t>,
                           std::span<const int32_t>, const SplitOptions&);
  friend Plan plan_decode(const AttentionConfig&, Device, int, int, int64_t, const SplitOptions&);

  AttentionConfig cfg_{};
  Phase phase_ = Phase::kPrefill;
  Device device_{};
  int batch_size_ = 0;
  int max_qo_len_ = 0;
  int64_t max_kv_len_ = 0;
  int64_t total_q_ = 0;
  std::vector<int32_t> qo_lens_, kv_lens_, qo_offset_;
  SplitOptions split_{};
  std::shared_ptr<detail::PlanState> state_;
};

// Prefill (or any ragged batch): host lengths; qo_offset empty means kv_len - qo_len.
Plan plan_prefill(const AttentionConfig& cfg, Device device, std::span<const int32_t> qo_lens,
                  std::span<const int32_t> kv_lens, std::span<const int32_t> qo_offset = {},
                  const SplitOptions& split = {});

// Decode: 1..16 query tokens per request (MTP), every length read on the device at run time.
Plan plan_decode(const AttentionConfig& cfg, Device device, int batch_size, int max_qo_len, int64_t max_kv_len,
                 const SplitOptions& split = {});

}  // namespace msa
