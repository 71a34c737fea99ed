// Plan time for the paged family: tile geometry, pipeline depth, split count and workspaces.
// Host only, never synchronizes: device facts come from cached attribute queries.
#include <algorithm>
#include <bit>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <utility>

#include "core/knobs.h"
#include "cuda/runtime/check.cuh"
#include "cuda/decode/config.cuh"
#include "cuda/decode/fp8_tile.cuh"
#include "cuda/decode/kernel_params.cuh"
#include "cuda/decode/kernel_table.h"
#include "cuda/decode/split_merge.cuh"
#include "cuda/decode/state.cuh"
#include "cuda/decode/token_config.h"
#include "cuda/plan_state.h"
#include "msa/error.h"

namespace msa::detail::cuda::decode {

namespace {

// Host view of one TileConfig instance. `stages` counts 16-bit stages; the fp8 instances of a plan run
// fp8_stages(stages) fp8 stages in about the same bytes (fp8_tile.cuh), and every figure below holds for both.
struct TileFacts {
  int keys, mtiles;     // the instance: keys per stage, 16-row m-tiles per warp (kernel_entry)
  int threads;
  int max_stages;
  int min_ctas_per_sm;  // the CTAs per SM the tile is shaped for (its __launch_bounds__)
  uint32_t (*smem_bytes)(int stages, int list_cap);
  uint32_t (*merge_bytes)(int stages, int list_cap);  // shared memory the fused merge may use
  bool (*part_fits)(int stages, int list_cap);        // a split's rows fit beside the epilogue
};
// The 16-bit and the fp8 layouts of `stages` 16-bit stages.
template <int D, int ROWS, int KEYS, int MT>
std::pair<SmemLayout, SmemLayout> layouts(int stages, int list_cap) {
  return {smem_layout<D, ROWS, KEYS, MT>(stages, list_cap),
          smem_layout<D, ROWS, KEYS, MT>(fp8_stages(stages), list_cap, true)};
}
template <int D, int ROWS, int KEYS = default_tile_keys(D), int MT = default_tile_mtiles(D, ROWS)>
TileFacts facts_of() {
  using C = TileConfig<D, ROWS, KEYS, MT>;
  return {KEYS, MT, C::kThreads, C::kMaxStages, C::kMinBlocksPerSm,
          [](int stages, int list_cap) {
            const auto [a, b] = layouts<D, ROWS, KEYS, MT>(stages, list_cap);
            return std::max(a.total, b.total);
          },
          [](int stages, int list_cap) {
            const auto [a, b] = layouts<D, ROWS, KEYS, MT>(stages, list_cap);
            return std::min(a.ring_off, b.ring_off);
          },
          [](int stages, int list_cap) {
            const auto [a, b] = layouts<D, ROWS, KEYS, MT>(stages, list_cap);
            return a.part_end <= a.ring_off && b.part_end <= b.ring_off;
          }};
}

// The kernel variants a plan serves: q in bf16 / fp16, the cache in q's dtype or fp8 e4m3. Plan-time
// figures (CTAs per SM, clusters that fit) are the least over them, so that one plan runs any of them.
struct KernelVariant {
  ScalarType dtype, kv_dtype;
};
constexpr KernelVariant kVariants[] = {{ScalarType::kBF16, ScalarType::kBF16},
                                       {ScalarType::kF16, ScalarType::kF16},
                                       {ScalarType::kBF16, ScalarType::kF8E4M3},
                                       {ScalarType::kF16, ScalarType::kF8E4M3}};

template <int D>
TileFacts facts_for_rows(int rows, bool one_mtile) {
  if (rows == 128 && one_mtile) return facts_of<D, 128, default_tile_keys(D), 1>();
  return rows == 16 ? facts_of<D, 16>() : (rows == 64 ? facts_of<D, 64>() : facts_of<D, 128>());
}
// The instances kernel_for_rows holds: the defaults (config.cuh), 128 rows at head dim <= 128 with one m-tile a
// warp (narrow = false, one_mtile = true), and at head dim 128 with 32-key stages (narrow = true).
TileFacts tile_facts(int head_dim, int rows, bool narrow, bool one_mtile) {
  if (narrow && rows == 128 && head_dim == 128) return facts_of<128, 128, 32, 2>();
  one_mtile = one_mtile && head_dim <= 128;
  return head_dim == 64    ? facts_for_rows<64>(rows, one_mtile)
         : head_dim == 128 ? facts_for_rows<128>(rows, one_mtile)
                           : facts_for_rows<256>(rows, false);
}

// Per-device facts and per-kernel attributes, cached: plan() for decode must stay within ~20 us.
struct DeviceCache {
  std::mutex mu;
  std::map<std::pair<int, const void*>, uint32_t> smem_limit_set;  // (device, kernel) -> bytes allowed
  std::map<std::tuple<int, const void*, uint32_t>, int> ctas_per_sm;
  std::map<std::tuple<int, const void*, uint32_t, int>, int> clusters;  // (device, kernel, smem, size) -> fit
};
DeviceCache& cache() {
  static DeviceCache c;
  return c;
}

// Raises the kernel's dynamic shared-memory cap to `bytes` (the current device is `device`) and
// returns how many of its CTAs fit on one SM.
int prepare_kernel(int device, const void* fn, int threads, uint32_t bytes) {
  auto& c = cache();
  std::lock_guard<std::mutex> lock(c.mu);
  uint32_t& set = c.smem_limit_set[{device, fn}];
  if (bytes > set) {
    MSA_CUDA_CHECK(cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)));
    set = bytes;
  }
  auto key = std::make_tuple(device, fn, bytes);
  auto it = c.ctas_per_sm.find(key);
  if (it != c.ctas_per_sm.end()) return it->second;
  int n = 0;
  MSA_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, fn, threads, bytes));
  c.ctas_per_sm[key] = n;
  return n;
}

// How many clusters of `size` CTAs (dims 1 x 1 x size) of the kernel fit on the device at once (0:
// none, or the device cannot launch such clusters). Sizes above 8 need the non-portable cluster
// attribute, which the H100 / H200 grant up to 16.
int clusters_that_fit(int device, const void* fn, int threads, uint32_t bytes, int size) {
  auto& c = cache();
  std::lock_guard<std::mutex> lock(c.mu);
  auto key = std::make_tuple(device, fn, bytes, size);
  auto it = c.clusters.find(key);
  if (it != c.clusters.end()) return it->second;
  if (size > 8 && cudaFuncSetAttribute(fn, cudaFuncAttributeNonPortableClusterSizeAllowed, 1) != cudaSuccess) {
    (void)cudaGetLastError();
    return c.clusters[key] = 0;
  }
  cudaLaunchAttribute attr{};
  attr.id = cudaLaunchAttributeClusterDimension;
  attr.val.clusterDim.x = 1;
  attr.val.clusterDim.y = 1;
  attr.val.clusterDim.z = static_cast<unsigned>(size);
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(1, 1, static_cast<unsigned>(size));
  cfg.blockDim = dim3(static_cast<unsigned>(threads));
  cfg.dynamicSmemBytes = bytes;
  cfg.attrs = &attr;
  cfg.numAttrs = 1;
  int n = 0;
  if (cudaOccupancyMaxActiveClusters(&n, fn, &cfg) != cudaSuccess) {
    (void)cudaGetLastError();
    n = 0;
  }
  return c.clusters[key] = n;
}

// Why this family cannot run the configuration ("" when it can).
std::string unsupported_reason(const char* fn, const AttentionConfig& c) {
  if (c.head_dim != 64 && c.head_dim != 128 && c.head_dim != 256)
    return detail::concat(fn, ": argument 'head_dim': the CUDA paged attention kernels support 64, 128 or 256, got ",
                          c.head_dim);
  if (c.dv() != c.head_dim)
    return detail::concat(fn, ": argument 'head_dim_v': the CUDA paged attention kernels need head_dim_v == head_dim (",
                          c.head_dim, "), got ", c.dv());
  if (c.group_size() > 128)
    return detail::concat(fn, ": arguments 'num_qo_heads'/'num_kv_heads': the CUDA paged attention kernels support at "
                          "most 128 query heads per KV head, got ", c.group_size());
  if (c.num_kv_heads > 65535)
    return detail::concat(fn, ": argument 'num_kv_heads': the CUDA paged attention kernels support at most 65535, got ",
                          c.num_kv_heads);
  return {};
}

int64_t ceil_div64(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Splits of a dense plan on the single-token kernel, the size of their clusters (0: none) and the CTA's shared memory
// ({}: the kernel does not take the plan). A CTA walks a contiguous range of at most kTokenMaxTopk blocks (its list
// is one block per lane of warp 0), so the plan needs at least ceil(blocks / 32) splits. Up to 16 splits form one
// cluster (push merge; the most whose clusters all fit at once). Where one CTA per SM gives an item more splits than
// that (few items at long context), the splits run without clusters: the fewest blocks per split that one wave of
// CTAs allows, 120.7 KB of shared memory each so that no two share an SM, every split's rows written to the
// workspace and merged by a second kernel (token_merge_kernel.cu). Measured on the H200, dense D-B1 (65536 tokens),
// bf16 / fp8 us, against clusters of 16, 8 or 4 merged again through the workspace by each rank's last CTA (same
// process): M3-TP1 (32 splits of 16 blocks against 28 in clusters of 4) 38.3 / 24.3 against 42.7 / 30.6, M3-TP4 (128
// splits of 4 blocks against 8 clusters of 16) 14.7 / 11.5 against 17.0 / 14.1.
//
// waves: the fp8 state of a plan whose splits do not fit one wave (make_fp8_dense_state): the fewest splits of at
// most 32 blocks, in as many waves as they take. Up to 16 splits form one cluster of a power of two at 112.7 KB (two
// CTAs per SM); more run without clusters, merged by the second kernel, at the ~104 KB of the kernel without the
// push merge (two CTAs per SM).
struct DenseSplits {
  int64_t splits = 0, cluster = 0;
  uint32_t smem = 0;
};
template <typename ClustersFit>
DenseSplits plan_token_dense_splits(int64_t items, const Plan& plan, const CudaPlanState& dev, const ClustersFit& fit,
                                    bool waves) {
  const SplitOptions& so = plan.split_options();
  if (dev.cc < 90 || so.fixed_split_blocks > 0) return {};
  const int64_t blocks = std::max<int64_t>(ceil_div64(plan.max_kv_len(), kBlock), 1);
  const int64_t need = ceil_div64(blocks, kTokenMaxTopk);
  int64_t target = std::min<int64_t>(dev.sm_count / std::max<int64_t>(items, 1), blocks);
  if (so.max_splits > 0) target = std::min<int64_t>(target, so.max_splits);
  DenseSplits best;
  if (target > kTokenMaxSplits) {
    const int64_t per = ceil_div64(blocks, target);  // blocks per split
    const int64_t n = ceil_div64(blocks, per);
    if (per <= kTokenMaxTopk && n <= kTokenMaxMergeParts) best = {n, 0, kTokenSmemPushBytes};
  } else {
    int64_t n = std::max<int64_t>(target, 1);
    while (n > 1 && fit(n, token_push_smem_bytes(static_cast<int>(n))) < items) --n;
    best = {n, n, n > 1 ? token_push_smem_bytes(static_cast<int>(n)) : kTokenSmemBytes};
  }
  if (waves && best.splits < need) {
    if (so.max_splits > 0 && so.max_splits < need) return {};
    if (need <= kTokenMaxSplits) {
      const int64_t n = std::bit_ceil(static_cast<uint64_t>(need));
      best = {n, n, token_push_smem_bytes(static_cast<int>(n))};
      if (fit(n, best.smem) < 1) return {};
    } else {
      if (need > kTokenMaxMergeParts) return {};
      best = {need, 0, kTokenSmemBytes};
    }
  }
  return best.splits >= need ? best : DenseSplits{};
}

// The single-token decode kernel (token_kernel.cuh) takes a decode plan of one query token per request, head dim 128,
// G <= 16, top-k <= 32 and pages of a multiple of 64 tokens, on sm_90 (its splits merge in a cluster, or a dense plan's
// many splits by token_merge_kernel.cu; below sm_90 code only plans it runs unsplit, where its ~104 KB of shared memory
// fit); and MTP plans of up to kTokenMaxQoLen tokens per request when the general kernel would also take one token per
// tile (G > 8: 16 rows per token), one CTA (or cluster) per token. Fills `st` and returns true when it does.
// MSA_PAGED_TOKEN_KERNEL=0 turns it off (core/knobs.h: the general kernel). dense_waves: a dense plan's splits may take
// several waves (plan_token_dense_splits).
bool plan_token_kernel(State& st, const Plan& plan, const CudaPlanState& dev, bool dense_waves = false) {
  const AttentionConfig& c = plan.config();
  if (!knobs::token_decode_kernel("msa.plan_decode")) return false;
  const int tq = std::max(plan.max_qo_len(), 1);
  if (tq > kTokenMaxQoLen || c.head_dim != kTokenHeadDim || c.dv() != kTokenHeadDim) return false;
  const bool dense = c.topk == 0;  // every block of the visible range (plan_token_dense_splits)
  if (c.group_size() < 1 || c.group_size() > kTokenRows || c.topk < 0 || c.topk > kTokenMaxTopk) return false;
  if (tq > 1 && 2 * c.group_size() <= kTokenRows) return false;  // the general kernel packs several tokens per tile
  if (static_cast<int64_t>(plan.batch_size()) * std::bit_ceil(static_cast<unsigned>(tq)) > INT32_MAX)
    return false;  // grid.x
  if (c.block_size != kBlock || c.page_size % kTokenTileKeys != 0 || c.num_kv_heads > 65535) return false;
  // Split merge: the push merge of token_kernel.cuh where its clusters fit (D-B1 10.24 -> 8.42 us against
  // the pull merge, same run), else the pull merge of split_merge.cuh (bitwise the same result). Push takes
  // token_push_smem_bytes(S) when the plan splits (its kernels' cap is raised to kTokenSmemPushBytes, the most
  // of any S). (Dense plans of more than 16 splits: plan_token_dense_splits.)
  int per_sm = INT32_MAX;
  for (const KernelVariant v : kVariants) {
    per_sm = std::min(per_sm, prepare_kernel(dev.device, token_kernel_entry(v.dtype, v.kv_dtype), kTokenThreads,
                                             kTokenSmemBytes));
    (void)prepare_kernel(dev.device, token_kernel_entry(v.dtype, v.kv_dtype, true), kTokenThreads, kTokenSmemPushBytes);
  }
  if (per_sm < 1) return false;
  // Clusters of n CTAs that fit the device at once, with the push merge's shared memory or the pull's.
  const auto clusters_fit = [&](int64_t n, bool with_push) {
    int fit = INT32_MAX;
    for (const KernelVariant v : kVariants) {
      const uint32_t smem = with_push ? token_push_smem_bytes(static_cast<int>(n)) : kTokenSmemBytes;
      fit = std::min(fit, clusters_that_fit(dev.device, token_kernel_entry(v.dtype, v.kv_dtype, with_push),
                                            kTokenThreads, smem, static_cast<int>(n)));
    }
    return fit;
  };
  // The push merge's shared memory (token_push_smem_bytes: 112.7 KB for a power-of-two split count,
  // up to 119.7 KB otherwise) may fit fewer clusters than the pull merge's ~104 KB. Push saves ~2 us
  // a call (D-B1 7.2 vs 9.2 us); a block more per CTA costs about 1-1.5 us. So a plan takes push with
  // the most splits whose clusters all fit when that adds at most one block per CTA to pull's split
  // count, else pull (H200, M3-TP4, push at 120.7 KB: D-B32 push at 2 splits 19.35 us, pull at 4
  // splits 17.41; D-B8 push at 8 splits 8.80 us, pull at 16 splits 11.58; with the receive rows sized
  // by S, D-B32 takes push at 4 splits: 14.8-15.1 us).
  bool push_fits = false;
  // Splits: fixed-size ranges when asked (batch-invariant; the kernel serves such a plan only when
  // top-k / F ranges always fit one cluster, so the choice does not depend on the batch or the
  // lengths), else one CTA per SM, in clusters that all fit the device at once. One CTA per SM, not
  // the two that fit: M3-TP1 D-B32 (128 items) ran 37.35 us unsplit against 38.94 us with 2 splits;
  // M3-TP4 D-B32 (32 items) 17.04 us with 4 splits, 19.17 with 2, 28.68 with 1; D-B1 10.23 us with
  // 16 and 10.33 with 8 (H200).
  const int64_t items = static_cast<int64_t>(plan.batch_size()) * tq * c.num_kv_heads;
  const int64_t n_max = std::min<int64_t>(c.topk, std::max<int64_t>(ceil_div64(plan.max_kv_len(), kBlock), 1));
  const SplitOptions& so = plan.split_options();
  // Below sm_90 code (sm_80 / 86 / 89, or such code on an H200) the kernel has no cluster merge: it serves only
  // plans it runs unsplit (more than half as many items as SMs: M3-TP1 D-B32 and up); the general kernel with its
  // workspace merge splits the others.
  if (dev.cc < 90 && so.fixed_split_blocks > 0) return false;
  int64_t splits = 1;
  uint32_t dense_smem = 0;  // a dense plan's shared memory per CTA
  bool merge_kernel = false;  // a dense plan's splits without clusters (token_merge_kernel.cu)
  if (dense) {
    const DenseSplits d = plan_token_dense_splits(items, plan, dev, [&](int64_t n, uint32_t smem) {
      int fit = INT32_MAX;
      for (const KernelVariant v : kVariants)
        fit = std::min(fit, clusters_that_fit(dev.device, token_kernel_entry(v.dtype, v.kv_dtype, true), kTokenThreads,
                                              smem, static_cast<int>(n)));
      return fit;
    }, dense_waves);
    if (d.splits == 0) return false;
    splits = d.splits;
    dense_smem = d.smem;
    merge_kernel = d.cluster == 0;
    push_fits = splits > 1 && !merge_kernel;
    if (merge_kernel) {
      for (const KernelVariant v : kVariants)
        if (prepare_kernel(dev.device, token_kernel_entry(v.dtype, v.kv_dtype), kTokenThreads, dense_smem) < 1)
          return false;
    }
  } else if (so.fixed_split_blocks > 0) {
    if (ceil_div64(c.topk, so.fixed_split_blocks) > kTokenMaxSplits) return false;
    splits = ceil_div64(n_max, so.fixed_split_blocks);
    if (so.max_splits > 0 && splits > so.max_splits) return false;
    if (splits > 1 && clusters_fit(splits, false) < 1) return false;
    push_fits = clusters_fit(splits, true) >= 1;
  } else {
    const int64_t slots = dev.sm_count;
    splits = items >= slots ? 1 : std::min(slots / items, n_max);
    if (so.max_splits > 0) splits = std::min<int64_t>(splits, so.max_splits);
    splits = std::clamp<int64_t>(splits, 1, kTokenMaxSplits);
    if (dev.cc < 90 && splits > 1) return false;
    const auto most_that_fit = [&](bool with_push) {
      for (const int64_t n : {splits, int64_t{16}, int64_t{8}, int64_t{4}, int64_t{2}})
        if (n > 1 && n <= splits && clusters_fit(n, with_push) >= items) return n;
      return int64_t{1};
    };
    const int64_t n_pull = most_that_fit(false);
    const int64_t n_push = most_that_fit(true);
    push_fits = n_push > 1 && ceil_div64(n_max, n_push) <= ceil_div64(n_max, n_pull) + 1;
    splits = push_fits ? n_push : n_pull;
  }
  st.token_kernel = true;
  st.head_dim = kTokenHeadDim;
  st.rows = kTokenRows;
  st.threads = kTokenThreads;
  st.group_pad = static_cast<int>(std::bit_ceil(static_cast<unsigned>(c.group_size())));
  st.tile_tokens = 1;
  st.tq_shift = std::bit_width(static_cast<unsigned>(tq) - 1u);  // CTAs per request: tq rounded up to a power of two
  st.tiles_per_req = 1 << st.tq_shift;
  st.num_tiles = static_cast<int64_t>(plan.batch_size()) << st.tq_shift;
  st.num_kv_heads = c.num_kv_heads;
  st.splits = static_cast<int>(splits);
  st.fixed_split_blocks = so.fixed_split_blocks > 0 ? so.fixed_split_blocks : 0;
  st.stages = kTokenStages;
  // The fp8 ring's depth (token_config.h): by the grid's waves, and on sm_90 for a CTA alone on its SM by its list's
  // length.
  const int64_t ctas = items * splits;
  const int64_t list = dense ? std::max<int64_t>(ceil_div64(plan.max_kv_len(), kBlock), 1) : n_max;
  const bool alone_long = dev.cc >= 90 && ctas <= dev.sm_count && ceil_div64(list, splits) >= kTokenFp8LongListBlocks;
  st.stages_fp8 = ctas > int64_t{kTokenFp8DeepWaves} * per_sm * dev.sm_count ? kTokenStagesFp8
                  : alone_long                                                ? kTokenStagesFp8AlonePerSm
                                                                              : kTokenStagesFp8Shallow;
  st.push_merge = push_fits && splits > 1;
  st.smem_bytes = dense_smem > 0   ? dense_smem
                  : st.push_merge ? token_push_smem_bytes(static_cast<int>(splits))
                                  : kTokenSmemBytes;
  st.spec_qo_len = tq;
  st.pdl = dev.cc >= 90;  // sm_80 code has no griddepcontrol.wait: its launches must not overlap the previous kernel
  st.prewait_prefetch = st.pdl;
  st.cluster_merge = splits > 1 && !merge_kernel;
  st.cluster_size = st.cluster_merge ? static_cast<int>(splits) : 0;
  st.merge_kernel = merge_kernel;
  if (merge_kernel) {  // per item and split, the split's rows and their lse
    const size_t rows_total = static_cast<size_t>(items) * splits * kTokenRows;
    st.part_o = DeviceBuffer(rows_total * kTokenHeadDim * sizeof(float));
    st.part_lse = DeviceBuffer(rows_total * sizeof(float));
  }
  return true;
}

}  // namespace

std::string describe(const State& s) {
  if (!s.unsupported.empty()) return "paged=unsupported";
  std::string out = s.token_kernel
                        ? "paged=token"
                        : "paged=general rows=" + std::to_string(s.rows) + " keys=" + std::to_string(s.keys) +
                              " warp_rows=" + std::to_string(16 * s.mtiles) +
                              " tile_tokens=" + std::to_string(s.tile_tokens);
  out += " splits=" + std::to_string(s.splits);
  if (s.fixed_split_blocks > 0) out += " fixed_split_blocks=" + std::to_string(s.fixed_split_blocks);
  const char* merge = s.splits <= 1              ? "none"
                      : s.merge_kernel            ? "kernel"
                      : s.push_merge              ? "push"
                      : !s.cluster_merge          ? "workspace"
                      : s.cluster_size < s.splits ? "cluster+workspace"
                                                  : "pull";
  return out + " merge=" + merge + " stages=" + std::to_string(s.stages) +
         " fp8_stages=" + std::to_string(s.stages_fp8);
}

std::shared_ptr<State> make_state(const Plan& plan, const CudaPlanState& dev) {
  const AttentionConfig& c = plan.config();
  const bool decode = plan.phase() == Phase::kDecode;
  const char* fn = decode ? "msa.plan_decode" : "msa.plan_prefill";
  auto st = std::make_shared<State>();
  if (std::string why = unsupported_reason(fn, c); !why.empty()) {
    if (!decode && dev.sm90_prefill) {  // the Hopper prefill serves it; run() reports if it falls back here
      st->unsupported = why;
      return st;
    }
    MSA_FAIL(kNotImplemented, why);
  }
  if (decode && plan_token_kernel(*st, plan, dev)) return st;
  const int D = c.head_dim;
  const int GP = static_cast<int>(std::bit_ceil(static_cast<unsigned>(c.group_size())));
  const int max_qo = std::max(plan.max_qo_len(), 1);

  // Rows: decode tiles are 16 rows whenever the padded group fits (M3, G=16: one token per tile,
  // MTP requests take one tile per token; G=4: 4 tokens per tile), so the 4 warps split every key
  // tile. A 64-row tile holding 4 MTP tokens loads a block shared by them once, but only the warp
  // of a token that selected the block computes on it: with the benchmark's random selections
  // that serialized the math and measured 227 us against 165 us for one token per tile (D-mtp,
  // H200). Groups above 16 take 64 / 128 rows (several tokens per tile when they fit); prefill
  // uses 128 rows (64 at G=1 so a tile keeps <= 64 tokens; at D=256, 64 or the padded group where
  // larger, to bound registers and shared memory).
  int rows;
  if (decode) {
    const int need = max_qo * GP;
    rows = GP <= 16 ? 16 : (need <= 64 ? 64 : 128);
  } else {
    rows = D == 256 ? std::max(GP, 64) : (GP == 1 ? 64 : 128);
  }
  int tile_tokens = std::min({rows / GP, kMaxTileTokens, max_qo});
  int list_cap = 0;
  if (c.topk > 0) {
    // The sort holds tile_tokens x topk entries; fewer tokens per tile when a row is very long.
    while (tile_tokens > 1 && static_cast<int64_t>(tile_tokens) * c.topk > kMaxListEntries) tile_tokens /= 2;
    MSA_CHECK(c.topk <= kMaxListEntries, kNotImplemented, fn,
              ": argument 'topk': the CUDA paged attention kernels support up to ", kMaxListEntries, ", got ", c.topk);
    list_cap = static_cast<int>(std::bit_ceil(static_cast<unsigned>(tile_tokens * c.topk)));
  }

  // CTAs per SM of an instance with `stages` stages: the least over the kernel variants.
  const int optin = smem_optin(dev.device);
  const auto ctas_per_sm = [&](const TileFacts& f, int stages) {
    int fit = INT32_MAX;
    for (const KernelVariant v : kVariants)
      fit = std::min(fit, prepare_kernel(dev.device, kernel_entry(v.dtype, v.kv_dtype, D, rows, f.keys, f.mtiles),
                                         f.threads, f.smem_bytes(stages, list_cap)));
    return fit;
  };
  const auto two_fit = [&](const TileFacts& f) {  // two CTAs a SM at 2 stages
    return f.smem_bytes(2, list_cap) <= static_cast<uint32_t>(optin) && ctas_per_sm(f, 2) >= 2;
  };
  // The 128-row tiles at D <= 128: 4 warps of 32 rows with 64-key stages where two of their CTAs fit an SM at 2
  // stages (H100 / H200: 5-14% faster than 8 warps of 16 rows there), else with 32-key stages where two of
  // those fit (A100; at D=128), else 8 warps of 16 rows (sm_86 / 89 / 120, 100 KB a SM: one CTA of 4 warps
  // would leave a scheduler one warp). MSA_PAGED_TILE_SHAPE picks one for the tests (docs/prefill_portable.md).
  TileFacts facts = tile_facts(D, rows, false, false);
  if (facts.mtiles == 2) {
    const TileFacts narrow = tile_facts(D, rows, true, false);  // the default again below D=128
    const TileFacts eight_warps = tile_facts(D, rows, false, true);
    switch (knobs::paged_tile_shape(fn)) {
      case knobs::PagedTileShape::kAuto:
        if (!two_fit(facts)) facts = narrow.keys < facts.keys && two_fit(narrow) ? narrow : eight_warps;
        break;
      case knobs::PagedTileShape::kKeys32: facts = narrow; break;
      case knobs::PagedTileShape::kWarps8: facts = eight_warps; break;
    }
  }
  st->head_dim = D;
  st->rows = rows;
  st->keys = facts.keys;
  st->mtiles = facts.mtiles;
  st->threads = facts.threads;
  st->group_pad = GP;
  st->tile_tokens = tile_tokens;
  st->list_cap = list_cap;
  st->num_kv_heads = c.num_kv_heads;
  if (decode) {
    st->tiles_per_req = static_cast<int>(ceil_div64(max_qo, tile_tokens));
    st->num_tiles = static_cast<int64_t>(plan.batch_size()) * st->tiles_per_req;
  } else {
    st->scan_tiles = true;
    int64_t tiles = 0;
    for (int32_t n : plan.qo_lens()) tiles += ceil_div64(std::max(n, 0), tile_tokens);
    st->num_tiles = std::max<int64_t>(tiles, 1);
  }
  MSA_CHECK(st->num_tiles <= INT32_MAX, kNotImplemented, fn, ": the batch needs ", st->num_tiles,
            " query tiles, more than one launch holds (2^31 - 1)");

  // Pipeline depth: the deepest that fits the device (3 stages of 32 KB at D=128: 2 CTAs per SM on
  // the H200), but no deeper than leaves room for the CTAs per SM the tile is shaped for (an A100 holds
  // two of the 32-key 128-row tiles at 2 stages, not at 3).
  int stages = facts.max_stages;
  while (stages > 2 && facts.smem_bytes(stages, list_cap) > static_cast<uint32_t>(optin)) --stages;
  if (facts.smem_bytes(stages, list_cap) <= static_cast<uint32_t>(optin)) {
    while (stages > 2 && ctas_per_sm(facts, stages) < facts.min_ctas_per_sm &&
           ctas_per_sm(facts, stages - 1) > ctas_per_sm(facts, stages))
      --stages;
  }
  const uint32_t smem = facts.smem_bytes(stages, list_cap);
  MSA_CHECK(smem <= static_cast<uint32_t>(optin), kNotImplemented, fn,
            ": the CUDA paged attention kernel for head_dim ", D, ", ", rows, " rows and topk ", c.topk, " needs ",
            smem, " bytes of shared memory; ", device_name(plan.device()), " allows ", optin);
  st->stages = stages;
  st->smem_bytes = smem;
  st->stages_fp8 = fp8_stages(stages);
  const int per_sm = ctas_per_sm(facts, stages);
  MSA_CHECK(per_sm >= 1, kNotImplemented, fn, ": the CUDA paged attention kernel for head_dim ", D, " and ", rows,
            " rows does not fit on ", device_name(plan.device()));

  // Splits. A work item is (tile, KV head); its block list has at most n_max entries.
  const int64_t items = st->num_tiles * c.num_kv_heads;
  const int64_t kv_blocks = std::max<int64_t>(ceil_div64(plan.max_kv_len(), kBlock), 1);
  const int64_t n_max =
      c.topk > 0 ? std::min<int64_t>(static_cast<int64_t>(tile_tokens) * c.topk, kv_blocks) : kv_blocks;
  const SplitOptions& so = plan.split_options();
  int64_t splits = 1;
  if (so.fixed_split_blocks > 0) {
    // Decode: split s covers list entries [s*F, (s+1)*F) whatever the batch, so a request's result
    // does not depend on the others (bitwise). Prefill tiles never split under F: one pass over
    // the whole list is batch-invariant by construction and needs no workspace of total_q rows.
    if (decode) {
      splits = ceil_div64(n_max, so.fixed_split_blocks);
      st->fixed_split_blocks = so.fixed_split_blocks;
    }
  } else {
    // Enough CTAs to fill every SM once (one wave of per_sm x SMs slots); splitting finer than a
    // wave only adds partials. B=32 at M3-TP1: 128 items, 264 slots -> 2 splits of 8 blocks.
    const int64_t slots = static_cast<int64_t>(per_sm) * dev.sm_count;
    splits = items >= slots ? 1 : std::min(slots / items, n_max);
  }
  if (so.max_splits > 0) splits = std::min<int64_t>(splits, so.max_splits);
  splits = std::clamp<int64_t>(splits, 1, kMaxSplits);
  // The fused merge stages one row of every split (and all lse values) in the stage memory.
  const uint32_t merge_room = facts.merge_bytes(stages, list_cap);
  while (splits > 1 && merge_min_bytes(static_cast<int>(splits), rows, D) > merge_room) --splits;
  if (!decode) {
    // Prefill partials span total_q rows: keep them under 256 MiB.
    const int64_t per_split = items * rows * (D + 1) * 4;
    while (splits > 1 && per_split * splits > (int64_t{256} << 20)) --splits;
  }
  // Sm_90: the splits of an item merge inside a thread-block cluster (split_merge.cuh) when its
  // shared memory holds a split's rows and the device can place such clusters. Without a fixed
  // split size the plan takes the largest split count (the one above, else 16, 8, 4, 2 below it)
  // whose clusters all fit the device at once, and prefers it to the workspace merge (H200: dense
  // D-B1 ran 70.5 us with 16 splits in clusters, 119 us with 64 through the workspace; D-B8 ran
  // 20.6 us with clusters of 4, 30.7 us with clusters of 8, which do not all fit in one wave).
  const auto clusters_fit = [&](int64_t n) {
    if (dev.cc < 90 || n < 2 || n > kMaxClusterSplits || !facts.part_fits(stages, list_cap)) return 0;
    int fit = INT32_MAX;
    for (const KernelVariant v : kVariants) {
      const void* fn = kernel_entry(v.dtype, v.kv_dtype, D, rows, facts.keys, facts.mtiles);
      fit = std::min(fit, clusters_that_fit(dev.device, fn, st->threads, smem, static_cast<int>(n)));
    }
    return fit;
  };
  if (st->fixed_split_blocks > 0) {
    st->cluster_merge = clusters_fit(splits) >= 1;
  } else if (splits > 1) {
    for (const int64_t n : {splits, int64_t{16}, int64_t{8}, int64_t{4}, int64_t{2}}) {
      if (n <= splits && clusters_fit(n) >= items) {
        splits = n;
        st->cluster_merge = true;
        break;
      }
    }
    // Two levels where clusters of 16 leave most of the wave idle (dense decode of few items at long context:
    // M3-TP4 dense D-B1 is one item, 16 CTAs on 132 SMs, 66 us for 33 MB): `parts` clusters of 16 per item,
    // each merging in distributed shared memory, their results merged through the workspace by the item's
    // last CTA (a merge of `parts` partials, not of every split: the workspace merge of 64 splits by one CTA
    // took 121 us at M3-TP1 dense D-B1, 256 splits 362 us at M3-TP4).
    const int64_t slots = static_cast<int64_t>(per_sm) * dev.sm_count;
    if (st->cluster_merge && splits == kMaxClusterSplits && items * kMaxClusterSplits * 2 <= slots) {
      // At least 4 blocks per CTA: the item's last CTA merges every part, one part more than the CTAs need.
      int64_t parts = std::min({slots / (items * kMaxClusterSplits), ceil_div64(n_max, 4 * kMaxClusterSplits),
                                int64_t{kMaxClusterSplits}});
      while (parts > 1 && (clusters_fit(kMaxClusterSplits) < items * parts ||
                           merge_min_bytes(static_cast<int>(parts), rows, D) > merge_room))
        --parts;
      if (parts > 1) splits = parts * kMaxClusterSplits;
    }
  }
  st->splits = static_cast<int>(splits);
  st->cluster_size = st->cluster_merge ? static_cast<int>(std::min<int64_t>(splits, kMaxClusterSplits)) : 0;
  st->spec_qo_len = decode && c.topk > 0 ? max_qo : 0;
  st->pdl = dev.cc >= 90;
  st->prewait_prefetch = decode && st->pdl;
  if (splits > 1 && (!st->cluster_merge || st->cluster_size < splits)) {
    const int64_t parts = st->cluster_merge ? splits / st->cluster_size : splits;
    const size_t rows_total = static_cast<size_t>(items) * parts * rows;
    st->part_o = DeviceBuffer(rows_total * D * sizeof(float));
    st->part_lse = DeviceBuffer(rows_total * sizeof(float));
    st->counters = DeviceBuffer(static_cast<size_t>(items) * sizeof(uint32_t));
  }
  return st;
}

// fp8 K/V of a dense decode plan the single-token kernel takes only in several waves (more requests than one wave
// of splits of <= 32 blocks holds): the general kernel widens each tile in its 4 warps, one CTA per 16-row tile,
// and reads fp8 at 0.41-0.66 of the copy ceiling, where the single-token kernel's fp8 loop streams it at 0.92-1.05
// (H200, D-B64-fp8 dense, 65536 tokens: M3-TP1 1582 -> 991 us, M3-TP4 635 -> 282 us, one cluster of 16 splits per
// item). A bf16 cache stays on the general kernel, which streams it at the copy rate (the same splits: M3-TP1 1946
// -> 1906 us, M3-TP4 494 -> 515 us).
std::shared_ptr<State> make_fp8_dense_state(const Plan& plan, const CudaPlanState& dev, const State& paged) {
  if (plan.phase() != Phase::kDecode || plan.config().topk != 0 || paged.token_kernel || !paged.unsupported.empty())
    return nullptr;
  auto st = std::make_shared<State>();
  return plan_token_kernel(*st, plan, dev, /*dense_waves=*/true) ? st : nullptr;
}

}  // namespace msa::detail::cuda::decode
