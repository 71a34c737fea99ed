// Entry points of the portable prefill's KV-major path (declared in cuda/plan_state.h): which plans have
// one, the workspaces sized from the plan's host lengths, and the run-time sequence of launches.
//
// run_prefill() launches, in order on the caller's stream:
//   tile schedule (1 CTA)        tile_cum / blk_cum from device lengths, counters zeroed  (prefill_sm90)
//   tile lists                   per-tile union of blocks and the path of each tile         (prefill_sm90)
//   item flags                   the paged kernel's items of KV-major tiles                 (item_flags.cu)
//   paged kernel                 the query-major tiles; KV-major tiles' items return at once (decode)
//   memset, rank, scan, fill     the KV-major key lists and work items                      (prefill_sm90)
//   per window: KV-major kernel (kernel.cuh), LSE merge                                      (prefill_sm90)
// The two paths write disjoint rows of o / lse. They run one after the other on the caller's stream (the
// KV-major chain on a side stream beside the paged kernel, as the Hopper family runs it, measured no faster:
// docs/prefill_portable.md, "Alternatives measured").
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <string>

#include "core/knobs.h"
#include "cuda/decode/state.cuh"
#include "cuda/plan_state.h"
#include "cuda/prefill_portable/config.h"
#include "cuda/prefill_portable/launch.h"
#include "cuda/prefill_portable/state.h"
#include "cuda/prefill_sm90/config.h"
#include "cuda/prefill_sm90/kvmajor_lists.h"
#include "cuda/prefill_sm90/schedule.h"
#include "cuda/runtime/check.cuh"
#include "msa/error.h"

namespace msa::detail::cuda::prefill_portable {

namespace {

using prefill_sm90::KvMajorRule;
constexpr float kLog2e = 1.4426950408889634f;

template <typename T>
T* ptr(const DeviceBuffer& b) {
  return static_cast<T*>(b.get());
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

}  // namespace

std::string describe(const PortableState& s) {
  return std::string("portable=prefill kvmajor=") + (s.rule == KvMajorRule::kAlways ? "always" : "wide-union") +
         " tiles=" + std::to_string(s.num_tiles) + " windows=" + std::to_string(s.num_windows) +
         " window_tiles=" + std::to_string(s.window_tiles) + " key_stripes=" + std::to_string(s.key_stripes) +
         " kv_stages=" + std::to_string(s.kv_stages);
}

std::shared_ptr<PortableState> make_portable_state(const Plan& plan, const CudaPlanState& dev,
                                                   const decode::State& paged) {
  const AttentionConfig& c = plan.config();
  if (c.topk <= 0 || c.topk > prefill_sm90::kMaxTopk) return nullptr;
  if (c.head_dim != kHeadDim || c.dv() != kHeadDim || c.block_size != kBlockKeys || c.page_size % kBlockKeys != 0)
    return nullptr;
  const int group = c.group_size();
  if (group < kMinGroup || group > kRows || !std::has_single_bit(static_cast<unsigned>(group))) return nullptr;
  const int tile_tokens = kRows / group;
  // The paged kernel's tiles must be the canonical tiles (item_flags.cu maps one onto the other).
  if (!paged.unsupported.empty() || paged.token_kernel || !paged.scan_tiles || paged.rows != kRows ||
      paged.tile_tokens != tile_tokens)
    return nullptr;
  int kv_stages = kv_stages_for(smem_optin(dev.device));
  if (knobs::portable_one_kv_stage("msa.plan_prefill")) kv_stages = std::min(kv_stages, 1);
  if (kv_stages == 0) return nullptr;
  if (!configure_kvmajor<__nv_bfloat16, false>(kv_stages) || !configure_kvmajor<__half, false>(kv_stages))
    return nullptr;

  auto s = std::make_shared<PortableState>();
  s->sm_count = dev.sm_count;
  s->pdl = dev.cc >= 90;
  s->kv_stages = kv_stages;
  s->f8_ready = configure_kvmajor<__nv_bfloat16, true>(kv_stages) && configure_kvmajor<__half, true>(kv_stages);
  s->batch_size = plan.batch_size();
  s->num_kv_heads = c.num_kv_heads;
  s->group_shift = std::countr_zero(static_cast<unsigned>(group));
  s->tile_tokens = tile_tokens;
  s->page_blocks = c.page_size / kBlockKeys;
  s->topk = c.topk;
  s->causal = c.causal;
  s->rule = knobs::portable_prefill("msa.plan_prefill") == knobs::PortablePrefill::kKvMajor ? KvMajorRule::kAlways
                                                                                            : KvMajorRule::kWideUnion;
  s->union_ratio_x4 = kKvMajorUnionRatioX4;
  int64_t tiles = 0, blocks = 0;
  for (int b = 0; b < plan.batch_size(); ++b) {
    tiles += (static_cast<int64_t>(plan.qo_lens()[b]) + tile_tokens - 1) / tile_tokens * c.num_kv_heads;
    blocks += (static_cast<int64_t>(plan.kv_lens()[b]) + kBlockKeys - 1) / kBlockKeys * c.num_kv_heads;
  }
  if (tiles == 0 || tiles > std::numeric_limits<int32_t>::max() / 2) return nullptr;
  s->num_tiles = static_cast<int32_t>(tiles);
  s->paged_items = paged.num_tiles * paged.num_kv_heads;
  s->list_capacity = tile_tokens * c.topk;
  if (!prefill_sm90::plan_kv_windows(*s, blocks)) return nullptr;

  const size_t B1 = static_cast<size_t>(plan.batch_size()) + 1;
  s->tile_cum = DeviceBuffer(B1 * sizeof(int32_t));
  s->blk_cum = DeviceBuffer(B1 * sizeof(int32_t));
  s->list_entries = DeviceBuffer(static_cast<size_t>(s->num_tiles) * s->list_capacity * sizeof(int2));
  s->list_count = DeviceBuffer(static_cast<size_t>(s->num_tiles) * sizeof(int32_t));
  s->kv_major = DeviceBuffer(static_cast<size_t>(s->num_tiles) * sizeof(int32_t));
  s->skip_items = DeviceBuffer(static_cast<size_t>(s->paged_items) * sizeof(int32_t));
  s->counters = DeviceBuffer(static_cast<size_t>(2 + 2 * s->num_windows) * sizeof(int32_t));
  return s;
}

bool can_run(const PortableState& s, const AttentionParams& p) {
  if (p.dtype != ScalarType::kBF16 && p.dtype != ScalarType::kF16) return false;
  const bool f8 = p.kv_dtype == ScalarType::kF8E4M3;
  if (f8 ? !s.f8_ready : p.kv_dtype != p.dtype) return false;
  if (p.head_dim != kHeadDim || p.head_dim_v != kHeadDim || p.block_idx == nullptr) return false;
  if (p.seqs.total_q >= (int64_t(1) << 30)) return false;  // {q row, entry} pairs are 32-bit
  if (!(p.sm_scale > 0.f) || !std::isfinite(p.sm_scale)) return false;  // the max is taken on unscaled logits
  // cp.async moves 16-byte chunks: q rows, K/V rows and their bases 16-byte aligned; the merge writes o in
  // 16-byte octets.
  if (!aligned16(p.q) || p.q_stride_token % 8 != 0 || p.q_stride_head % 8 != 0) return false;
  if (!aligned16(p.o) || p.o_stride_token % 8 != 0 || p.o_stride_head % 8 != 0) return false;
  const int64_t per16 = f8 ? 16 : 8;  // elements in 16 bytes
  for (const CacheParams* c : {&p.k, &p.v}) {
    if (c->dim != kHeadDim || c->page_size != s.page_blocks * kBlockKeys || c->num_heads != s.num_kv_heads) return false;
    if (!aligned16(c->data) || c->stride_token % per16 != 0 || c->stride_head % per16 != 0 ||
        c->stride_page % per16 != 0)
      return false;
  }
  return true;
}

void run_prefill(const PortableState& s, const decode::State& paged, const Plan& plan, const AttentionParams& p,
                 cudaStream_t stream) {
  if (s.num_tiles == 0 || p.seqs.total_q == 0) return;
  const bool bf16 = p.dtype == ScalarType::kBF16;
  const bool f8 = p.kv_dtype == ScalarType::kF8E4M3;
  prefill_sm90::launch_tile_schedule(p.seqs, s.tile_tokens, s.num_kv_heads, ptr<int32_t>(s.tile_cum),
                                     ptr<int32_t>(s.blk_cum), ptr<int32_t>(s.counters), 2 + 2 * s.num_windows, stream);
  const prefill_sm90::TileListParams tl = prefill_sm90::tile_list_params(s, p);
  prefill_sm90::launch_tile_lists(tl, s.pdl, stream);
  launch_item_flags(p.seqs, tl.sched, tl.kv_major, ptr<int32_t>(s.skip_items), s.paged_items, s.pdl, stream);

  decode::run(paged, plan, p, stream, ptr<int32_t>(s.skip_items));

  const prefill_sm90::KvListParams lp = prefill_sm90::kv_list_params(s, p);
  const KvLists& lists = lp.lists;
  MSA_CUDA_CHECK(cudaMemsetAsync(lists.key_count, 0, s.key_count.bytes(), stream));
  prefill_sm90::launch_kv_rank(lp, false, stream);  // after a memset: no PDL edge
  prefill_sm90::launch_kv_scan(lp, s.pdl, stream);
  prefill_sm90::launch_kv_fill(lp, s.pdl, stream);

  KvParams kp;
  kp.q = p.q;
  kp.q_stride_token = p.q_stride_token;
  kp.q_stride_head = p.q_stride_head;
  kp.k = p.k;
  kp.v = p.v;
  kp.seqs = p.seqs;
  kp.pages = p.pages;
  kp.lists = lists;
  kp.group_shift = s.group_shift;
  kp.page_blocks = s.page_blocks;
  kp.causal = s.causal;
  kp.scale_log2 = p.sm_scale * kLog2e;

  prefill_sm90::KvMergeParams mp = prefill_sm90::kv_merge_params(s, p);
  mp.quad_major_partials = true;  // kernel.cuh stores a partial row as its quads hold it
  const int grid = s.sm_count;
  for (int32_t w = 0; w < s.num_windows; ++w) {
    kp.window = w;
    mp.window = w;
    if (f8)
      bf16 ? launch_kvmajor<__nv_bfloat16, true>(kp, s.kv_stages, grid, s.pdl, stream)
           : launch_kvmajor<__half, true>(kp, s.kv_stages, grid, s.pdl, stream);
    else
      bf16 ? launch_kvmajor<__nv_bfloat16, false>(kp, s.kv_stages, grid, s.pdl, stream)
           : launch_kvmajor<__half, false>(kp, s.kv_stages, grid, s.pdl, stream);
    prefill_sm90::launch_kv_merge(mp, false, stream);
  }
}

}  // namespace msa::detail::cuda::prefill_portable
