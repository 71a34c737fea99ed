// Entry points of the Hopper prefill family (declared in cuda/plan_state.h): which plans it serves,
// the workspaces it sizes from the plan's host lengths, and the run-time sequence of launches.
//
// run_prefill() launches, in order on the caller's stream:
//   [fp8 copy, flagged] memset       the copy's flags, at the plan's first eager run only
//   tile schedule (1 CTA)            tile_cum / blk_cum from device lengths, counters zeroed
//   [sparse] tile lists              per-tile sorted union of blocks + token masks, path per tile
//                                    (with a KV-major path, the query-major tiles listed compactly)
//   [fp8 copy] widen                 the blocks of the query-major tiles into the 16-bit copy (fp8_copy.h)
//   query-major kernel               dense tiles, or sparse tiles whose union is narrow
//   [KV-major] memset, rank, scan, fill, then per window: KV-major kernel, LSE merge
// With a KV-major path the KV-major launches run on the plan's side stream (StreamFork, highest
// priority) while the query-major kernel runs on the caller's: the two share no writes (the query-major
// kernel skips KV-major tiles, each path writes its own tiles' rows of o / lse and its own counters).
// In stream order after the query-major kernel, the six KV-major launches add their time even when they
// find nothing to do (M3-TP1 P-chunk `shared`: 21 us of kernels, memset .. merge, and ~10 us of gaps
// behind its 463 us query-major kernel), and in every plan the KV-major work waits for the query-major
// kernel's last tiles.
#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <vector>

#include "core/knobs.h"
#include "cuda/runtime/check.cuh"
#include "cuda/prefill_sm90/config.h"
#include "cuda/prefill_sm90/fp8_copy.h"
#include "cuda/prefill_sm90/kvmajor_lists.h"
#include "cuda/prefill_sm90/launch.h"
#include "cuda/prefill_sm90/prefill_state.h"
#include "cuda/prefill_sm90/schedule.h"
#include "cuda/runtime/tensor_map.h"
#include "msa/error.h"

namespace msa::detail::cuda::prefill_sm90 {

namespace {

constexpr float kLog2e = 1.4426950408889634f;

int log2_exact(int x) {
  if (x <= 0 || (x & (x - 1))) return -1;
  int s = 0;
  while ((1 << s) < x) ++s;
  return s;
}

// The decomposition of sparse tiles: per tile on the device by default (KvMajorRule::kWideUnion), or
// forced one way by MSA_SM90_PREFILL (core/knobs.h).
KvMajorRule sparse_rule(bool sparse, int group) {
  if (!sparse || group < kKvMinGroup) return KvMajorRule::kNever;
  switch (knobs::prefill_decomposition("msa.plan_prefill")) {
    case knobs::PrefillDecomposition::kQMajor: return KvMajorRule::kNever;
    case knobs::PrefillDecomposition::kKvMajor: return KvMajorRule::kAlways;
    default: return KvMajorRule::kWideUnion;
  }
}

template <typename T>
T* ptr(const DeviceBuffer& b) {
  return static_cast<T*>(b.get());
}

// Sizes the KV-major windows and their buffers (kvmajor_state.h) and encodes the partial outputs' maps; leaves
// the rule at kNever when the key arrays would be unreasonably large (query-major serves the plan).
void plan_kv_major(PrefillState& s, int64_t total_blocks) {
  if (!plan_kv_windows(s, total_blocks)) {
    s.rule = KvMajorRule::kNever;
    return;
  }
  const int32_t group = 1 << s.group_shift;
  const int64_t window = s.window_tiles;
  // part_o of one window as [rows, D]; a box = one warp's rows of one token
  const uint64_t dims[2] = {kHeadDim, static_cast<uint64_t>(window) * s.list_capacity * group};
  const uint64_t strides[1] = {kHeadDim * 2};
  const uint32_t box[2] = {kHalfDim, static_cast<uint32_t>(std::min(group, 16))};
  encode_tensor_map(&s.part_map_bf16, ScalarType::kBF16, 2, s.part_o.get(), dims, strides, box, "partial-output");
  encode_tensor_map(&s.part_map_f16, ScalarType::kF16, 2, s.part_o.get(), dims, strides, box, "partial-output");
}

// The 16-bit copy of an fp8 cache's blocks for the query-major tiles (fp8_copy.h) and its TMA maps, K and V
// for bf16 and fp16 q (the plan does not know q's dtype), as a cache [pages, Hkv, 128, D]; none when the copy
// exceeds its budget. Every block is widened, beside the tile lists, when the plan has few (config.h).
void plan_fp8_copy(PrefillState& s, int64_t pages) {
  const int64_t hkv = s.num_kv_heads;
  const int64_t plane = pages * hkv * kBlockKeys * kHeadDim * 2;  // bytes of K (and of V)
  if (pages <= 0 || 2 * plane > kFp8CopyBudgetBytes) return;
  s.copy_pages = static_cast<int32_t>(pages);
  s.fp8_copy = DeviceBuffer(static_cast<size_t>(2 * plane));
  s.copy_every_block = pages * hkv <= kCopyEveryBlockMaxItems;
  if (!s.copy_every_block) s.copy_flags = DeviceBuffer(static_cast<size_t>(pages * hkv * kCopyFlagBytes));
  s.copy_indptr = DeviceBuffer((static_cast<size_t>(s.batch_size) + 1) * sizeof(int32_t));
  s.copy_table = DeviceBuffer(static_cast<size_t>(pages) * sizeof(int32_t));
  const uint64_t dims[4] = {kHeadDim, kBlockKeys, static_cast<uint64_t>(hkv), static_cast<uint64_t>(pages)};
  const uint64_t strides[3] = {kHeadDim * 2, kBlockKeys * kHeadDim * 2,
                               static_cast<uint64_t>(hkv) * kBlockKeys * kHeadDim * 2};
  const uint32_t box[4] = {kHalfDim, kBlockKeys, 1, 1};
  const char* k = static_cast<const char*>(s.fp8_copy.get());
  encode_tensor_map(&s.copy_k_map_bf16, ScalarType::kBF16, 4, k, dims, strides, box, "fp8-copy");
  encode_tensor_map(&s.copy_v_map_bf16, ScalarType::kBF16, 4, k + plane, dims, strides, box, "fp8-copy");
  encode_tensor_map(&s.copy_k_map_f16, ScalarType::kF16, 4, k, dims, strides, box, "fp8-copy");
  encode_tensor_map(&s.copy_v_map_f16, ScalarType::kF16, 4, k + plane, dims, strides, box, "fp8-copy");
}

Fp8CopyParams fp8_copy_params(const PrefillState& s, const AttentionParams& p) {
  Fp8CopyParams cp;
  cp.seqs = p.seqs;
  cp.blk_cum = ptr<int32_t>(s.blk_cum);
  cp.pages = p.pages;
  cp.k = p.k;
  cp.v = p.v;
  cp.page_blocks = s.page_blocks;
  cp.num_kv_heads = s.num_kv_heads;
  cp.copy_pages = s.copy_pages;
  cp.flags = ptr<uint8_t>(s.copy_flags);
  cp.copy_indptr = ptr<int32_t>(s.copy_indptr);
  cp.copy_table = ptr<int32_t>(s.copy_table);
  cp.copy = s.fp8_copy.get();
  return cp;
}

// Maps of q [total_q, Hq, D] (box: 64 dims x G heads x `tokens` tokens) and of a cache
// [pages, Hkv, P, D] (box: 64 dims x 128 keys of one page and head). An fp8 e4m3 cache travels as 16-bit
// pseudo-elements, as the indexer's fp8 keys do (TMA only moves bytes): a row of 128 e4m3 values is 64 of them,
// so one box {64, 128 keys} (128 bytes a row, 128B-swizzled like a 16-bit half) is a block's whole tile.
void encode_q_map(CUtensorMap* map, const AttentionParams& p, int32_t group, int32_t tokens) {
  const uint64_t dims[3] = {kHeadDim, static_cast<uint64_t>(p.num_qo_heads), static_cast<uint64_t>(p.seqs.total_q)};
  const uint64_t strides[2] = {static_cast<uint64_t>(p.q_stride_head) * 2, static_cast<uint64_t>(p.q_stride_token) * 2};
  const uint32_t box[3] = {kHalfDim, static_cast<uint32_t>(group), static_cast<uint32_t>(tokens)};
  encode_tensor_map(map, p.dtype, 3, p.q, dims, strides, box, "q");
}

void encode_cache_map(CUtensorMap* map, const AttentionParams& p, const CacheParams& c, const char* what) {
  const bool f8 = p.kv_dtype == ScalarType::kF8E4M3;
  const uint64_t elem = f8 ? 1 : 2;
  const uint64_t dims[4] = {static_cast<uint64_t>(f8 ? kHeadDim / 2 : kHeadDim), static_cast<uint64_t>(c.page_size),
                            static_cast<uint64_t>(c.num_heads), static_cast<uint64_t>(p.pages.num_pages)};
  const uint64_t strides[3] = {static_cast<uint64_t>(c.stride_token) * elem,
                               static_cast<uint64_t>(c.stride_head) * elem,
                               static_cast<uint64_t>(c.stride_page) * elem};
  const uint32_t box[4] = {kHalfDim, kBlockKeys, 1, 1};
  encode_tensor_map(map, f8 ? ScalarType::kF16 : p.dtype, 4, c.data, dims, strides, box, what);
}

// qp: the query-major launch's params, whose K and V maps and pages the KV-major kernel takes as they are (the
// same encode_cache_map calls: two driver calls fewer on the host per run): the pool's, or the fp8 copy's when
// it holds every block (f8 false then: the copy is in q's dtype).
void run_kv_major(const PrefillState& s, const AttentionParams& p, const QMajorParams& qp, bool bf16, bool f8,
                  cudaStream_t stream) {
  const KvListParams lp = kv_list_params(s, p);
  const KvLists& lists = lp.lists;
  MSA_CUDA_CHECK(cudaMemsetAsync(lists.key_count, 0, s.key_count.bytes(), stream));
  // rank follows the memset (no PDL edge there); scan, fill and the KV-major kernel follow a kernel of
  // this run (PDL); the merge never (launch.h).
  launch_kv_rank(lp, false, stream);
  launch_kv_scan(lp, true, stream);
  launch_kv_fill(lp, true, stream);

  const int32_t group = 1 << s.group_shift;
  KvMajorParams kp{};
  encode_q_map(&kp.q_map, p, group, 1);
  kp.k_map = qp.k_map;
  kp.v_map = qp.v_map;
  kp.part_map = bf16 ? s.part_map_bf16 : s.part_map_f16;
  kp.seqs = p.seqs;
  kp.pages = qp.pages;
  kp.lists = lists;
  kp.group_shift = s.group_shift;
  kp.page_blocks = qp.page_blocks;
  kp.causal = s.causal;
  kp.scale_log2 = p.sm_scale * kLog2e;
  kp.tail_items = kKvTailItemsPerSm * s.sm_count;

  KvMergeParams mp = kv_merge_params(s, p);
  for (int32_t w = 0; w < s.num_windows; ++w) {
    kp.window = w;
    mp.window = w;
    if (f8)
      bf16 ? launch_kvmajor<true, true>(kp, s.sm_count, true, stream)
           : launch_kvmajor<false, true>(kp, s.sm_count, true, stream);
    else
      bf16 ? launch_kvmajor<true>(kp, s.sm_count, true, stream) : launch_kvmajor<false>(kp, s.sm_count, true, stream);
    launch_kv_merge(mp, false, stream);
  }
}

}  // namespace

std::string describe(const PrefillState& s) {
  const char* rule = s.rule == KvMajorRule::kAlways      ? "always"
                     : s.rule == KvMajorRule::kWideUnion ? "wide-union"
                                                         : "never";
  std::string out = std::string("sm90=prefill tiles=") + std::to_string(s.num_tiles) + " kvmajor=" + rule;
  if (s.rule != KvMajorRule::kNever)
    out += " windows=" + std::to_string(s.num_windows) + " window_tiles=" + std::to_string(s.window_tiles) +
           " key_stripes=" + std::to_string(s.key_stripes) + " concurrent";
  if (s.topk > 0) out += std::string(" fp8_qmajor=") + (s.copy_pages > 0 ? "copy" : "tiles");
  if (s.copy_pages > 0) out += std::string(" fp8_copy=") + (s.copy_every_block ? "every-block" : "flagged");
  return out;
}

std::shared_ptr<PrefillState> make_prefill_state(const Plan& plan, const CudaPlanState& dev) {
  const AttentionConfig& c = plan.config();
  if (c.head_dim != kHeadDim || c.dv() != kHeadDim || c.block_size != kBlockKeys) return nullptr;
  if (c.page_size % kBlockKeys != 0) return nullptr;
  const int group = c.group_size();
  const int shift = log2_exact(group);
  if (shift < 0 || group > kTileRows) return nullptr;
  const bool sparse = c.topk > 0;
  const int tile_tokens = kTileRows / group;
  if (sparse && (tile_tokens > kMaxSparseTileTokens || c.topk > kMaxTopk)) return nullptr;
  if (!configure_qmajor<true>() || !configure_qmajor<false>()) return nullptr;

  auto s = std::make_shared<PrefillState>();
  s->sm_count = dev.sm_count;
  s->batch_size = plan.batch_size();
  s->num_kv_heads = c.num_kv_heads;
  s->group_shift = shift;
  s->tile_tokens = tile_tokens;
  s->page_blocks = c.page_size / kBlockKeys;
  s->topk = c.topk;
  s->causal = c.causal;

  // The plan's host lengths fix the workspace extents (the device lengths of a run must agree;
  // tiles past these extents are not run, nothing is read or written out of bounds).
  int64_t tiles = 0, blocks = 0;
  for (int b = 0; b < plan.batch_size(); ++b) {
    tiles += (static_cast<int64_t>(plan.qo_lens()[b]) + tile_tokens - 1) / tile_tokens * c.num_kv_heads;
    blocks += (static_cast<int64_t>(plan.kv_lens()[b]) + kBlockKeys - 1) / kBlockKeys * c.num_kv_heads;
  }
  if (tiles > std::numeric_limits<int32_t>::max() / 2) return nullptr;
  s->num_tiles = static_cast<int32_t>(tiles);
  s->rule = sparse_rule(sparse, group);
  if (s->rule != KvMajorRule::kNever && !(configure_kvmajor<true>() && configure_kvmajor<false>()))
    s->rule = KvMajorRule::kNever;
  // The plan does not know the caches' dtype: the fp8 K/V kernels of its paths are configured too.
  s->f8_ready = configure_qmajor<true, true>() && configure_qmajor<false, true>() &&
                (s->rule == KvMajorRule::kNever ||
                 (configure_kvmajor<true, true>() && configure_kvmajor<false, true>()));

  const size_t B1 = static_cast<size_t>(plan.batch_size()) + 1;
  s->tile_cum = DeviceBuffer(B1 * sizeof(int32_t));
  s->blk_cum = DeviceBuffer(B1 * sizeof(int32_t));
  if (sparse) {
    s->list_capacity = tile_tokens * c.topk;
    s->list_entries = DeviceBuffer(static_cast<size_t>(s->num_tiles) * s->list_capacity * sizeof(int2));
    s->list_count = DeviceBuffer(static_cast<size_t>(s->num_tiles) * sizeof(int32_t));
    s->kv_major = DeviceBuffer(static_cast<size_t>(s->num_tiles) * sizeof(int32_t));
    if (s->rule != KvMajorRule::kNever && s->num_tiles > 0) plan_kv_major(*s, blocks);
    // The query-major tiles' 16-bit copy of an fp8 cache (a plan serves both caches, so every sparse plan
    // with query-major tiles holds it; KV-major tiles read the fp8 pool unless the copy holds every block).
    if (s->f8_ready && s->rule != KvMajorRule::kAlways && s->num_tiles > 0 &&
        !knobs::fp8_qmajor_tiles("msa.plan_prefill"))
      plan_fp8_copy(*s, blocks / c.num_kv_heads);
  }
  if (s->rule == KvMajorRule::kNever) s->num_windows = 0;
  if (s->rule != KvMajorRule::kNever) s->fork = StreamFork(/*high_priority=*/true);
  if (s->rule != KvMajorRule::kNever) s->qm_tiles = DeviceBuffer(static_cast<size_t>(s->num_tiles) * sizeof(int32_t));
  s->counters = DeviceBuffer(static_cast<size_t>(2 + 2 * s->num_windows) * sizeof(int32_t));
  return s;
}

bool can_run(const PrefillState& s, const AttentionParams& p) {
  if (p.dtype != ScalarType::kBF16 && p.dtype != ScalarType::kF16) return false;
  // K/V in q's dtype, or fp8 e4m3 (widened in shared memory or into the plan's 16-bit copy: launch.h, fp8_copy.h).
  const bool f8 = p.kv_dtype == ScalarType::kF8E4M3;
  if (f8 ? !s.f8_ready : p.kv_dtype != p.dtype) return false;
  if (p.head_dim != kHeadDim || p.head_dim_v != kHeadDim) return false;
  if ((p.block_idx != nullptr) != (s.topk > 0)) return false;
  if (!(p.sm_scale > 0.f) || !std::isfinite(p.sm_scale)) return false;  // the max is taken on raw scores
  if (p.pages.num_pages < 1 || p.seqs.total_q >= (int64_t(1) << 30)) return false;
  // TMA: byte strides multiples of 16 and below 2^39; o is written in 4-byte pairs (query-major kernel) and
  // 16-byte octets (KV-major merge).
  const auto tma_stride = [](int64_t elems, int64_t elem_bytes) {
    return elems > 0 && elems < (int64_t(1) << 39) / elem_bytes && elems * elem_bytes % 16 == 0;
  };
  if (!tma_stride(p.q_stride_token, 2) || !tma_stride(p.q_stride_head, 2)) return false;
  if (p.o_stride_token % 8 != 0 || p.o_stride_head % 8 != 0) return false;
  const int64_t kv_bytes = f8 ? 1 : 2;
  for (const CacheParams* c : {&p.k, &p.v}) {
    if (c->dim != kHeadDim || c->page_size != s.page_blocks * kBlockKeys || c->num_heads != s.num_kv_heads)
      return false;
    if (!tma_stride(c->stride_token, kv_bytes) || !tma_stride(c->stride_head, kv_bytes) ||
        !tma_stride(c->stride_page, kv_bytes))
      return false;
  }
  return true;
}

void run_prefill(const PrefillState& s, const Plan& plan, const AttentionParams& p, cudaStream_t stream) {
  if (s.num_tiles == 0 || p.seqs.total_q == 0) return;
  const bool sparse = s.topk > 0;
  const bool bf16 = p.dtype == ScalarType::kBF16;
  const bool f8 = p.kv_dtype == ScalarType::kF8E4M3;
  const int32_t group = 1 << s.group_shift;
  // fp8 K/V with the copy: its flags start at 0 (the widen kernel clears them as it takes them), zeroed by the
  // plan's first eager run before the schedule kernel (a plain launch: no PDL edge is lost). Not at every run: a
  // memset node ahead of the schedule kernel delayed it by 12-16 us in graph replay (M3-TP1 / TP4 P-chunk).
  const bool copy = f8 && sparse && s.copy_pages > 0;
  const bool flagged = copy && !s.copy_every_block;
  if (flagged && !s.copy_flags_zeroed.load(std::memory_order_acquire)) {
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    MSA_CUDA_CHECK(cudaStreamIsCapturing(stream, &capture));
    MSA_CUDA_CHECK(cudaMemsetAsync(s.copy_flags.get(), 0, s.copy_flags.bytes(), stream));
    if (capture == cudaStreamCaptureStatusNone) s.copy_flags_zeroed.store(true, std::memory_order_release);
  }

  launch_tile_schedule(p.seqs, s.tile_tokens, s.num_kv_heads, ptr<int32_t>(s.tile_cum), ptr<int32_t>(s.blk_cum),
                       ptr<int32_t>(s.counters), 2 + 2 * s.num_windows, stream);

  QMajorParams qp{};
  encode_q_map(&qp.q_map, p, group, s.tile_tokens);
  encode_cache_map(&qp.k_map, p, p.k, "k_cache");
  encode_cache_map(&qp.v_map, p, p.v, "v_cache");
  qp.seqs = p.seqs;
  qp.pages = p.pages;
  qp.sched = schedule_of(s);
  qp.tile_counter = ptr<int32_t>(s.counters);
  qp.group_shift = s.group_shift;
  qp.page_blocks = s.page_blocks;
  qp.causal = s.causal;
  qp.scale_log2 = p.sm_scale * kLog2e;
  qp.o = p.o;
  qp.o_stride_token = p.o_stride_token;
  qp.o_stride_head = p.o_stride_head;
  qp.lse = p.lse;
  qp.lse_stride_token = p.lse_stride_token;
  qp.lse_stride_head = p.lse_stride_head;
  qp.v_scale = p.v_scale;

  if (sparse) {
    TileListParams lp = tile_list_params(s, p);
    if (s.qm_tiles.get() != nullptr) {
      lp.qm_tiles = ptr<int32_t>(s.qm_tiles);
      lp.qm_count = ptr<int32_t>(s.counters) + 1 + 2 * s.num_windows;
    }
    if (flagged) {
      lp.copy_flags = ptr<uint8_t>(s.copy_flags);
      lp.blk_cum = ptr<int32_t>(s.blk_cum);
      lp.copy_pages = s.copy_pages;
    }
    launch_tile_lists(lp, true, stream);
    qp.lists.entries = lp.entries;
    qp.lists.count = lp.count;
    qp.lists.kv_major = lp.kv_major;
    qp.lists.capacity = lp.capacity;
    qp.lists.qm_tiles = lp.qm_tiles;
    qp.lists.qm_count = lp.qm_count;
  }

  // With a KV-major path, the query-major kernel follows the lists on the caller's stream (PDL) and the
  // KV-major launches go to the side stream, where the first of them (a memset) follows the fork's event
  // wait. The query-major kernel on the side stream would have that event wait as its predecessor and no
  // PDL edge: M3-TP4 P-chunk `shared`, whose KV-major launches find nothing to do, ran 133.1 us that way
  // against 130.6-130.8 with the query-major path alone (docs/prefill.md).
  // With every block in the fp8 copy, the KV-major kernel reads the copy too (its 16-bit form, no widening per
  // work item), so the side stream forks after the widen kernel: its first launch waited for the widen kernel's
  // CTAs to leave the SMs all the same (M3-TP4 P-chunk `random`).
  const bool kv_path = sparse && s.rule != KvMajorRule::kNever;
  const bool kv_on_copy = copy && s.copy_every_block;
  if (kv_path && !kv_on_copy) s.fork.fork(stream);
  const int grid = std::min(s.sm_count, s.num_tiles);
  try {
    QMajorParams wq = qp;
    if (copy) {  // the blocks widened, then the 16-bit kernel on the copy (pages by the copy's flat table)
      const Fp8CopyParams cp = fp8_copy_params(s, p);
      launch_fp8_copy_widen(cp, bf16, s.sm_count, stream);
      if (kv_path && kv_on_copy) s.fork.fork(stream);
      wq.k_map = bf16 ? s.copy_k_map_bf16 : s.copy_k_map_f16;
      wq.v_map = bf16 ? s.copy_v_map_bf16 : s.copy_v_map_f16;
      wq.pages = PageTableParams{cp.copy_table, cp.copy_indptr, 0, s.copy_pages, s.copy_pages};
      wq.page_blocks = 1;
      bf16 ? launch_qmajor<true>(sparse, wq, grid, true, stream) : launch_qmajor<false>(sparse, wq, grid, true, stream);
    } else if (f8)
      bf16 ? launch_qmajor<true, true>(sparse, qp, grid, true, stream)
           : launch_qmajor<false, true>(sparse, qp, grid, true, stream);
    else
      bf16 ? launch_qmajor<true>(sparse, qp, grid, true, stream) : launch_qmajor<false>(sparse, qp, grid, true, stream);
    if (kv_path) run_kv_major(s, p, kv_on_copy ? wq : qp, bf16, f8 && !kv_on_copy, s.fork.side());
  } catch (...) {
    if (kv_path) s.fork.join_after_error(stream);
    throw;
  }
  if (kv_path) s.fork.join(stream);
}

}  // namespace msa::detail::cuda::prefill_sm90
