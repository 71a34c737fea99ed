// Run-time switches: the environment variables that make the CUDA backend take a path its own rules
// would not take for the call (a decomposition, or the kernel another GPU runs). All of them are in the
// one table of knobs.cpp, and docs/knobs.md lists the same table; nothing else in src reads the
// environment. An accessor reads its variable when it is called: when a plan is made (attention), or at
// each call (the indexer, which has no plan), so that a test or a benchmark may change it between plans
// of one process. A value outside the accepted ones throws msa::Error(kValue) naming the entry point
// `fn`, the variable, the accepted values and the value found; unset or empty is the default.
#pragma once

#include <cstdint>
#include <span>

namespace msa::detail::knobs {

struct Knob {
  const char* name;
  const char* choices[3];  // the accepted values, the default first; all null: an integer > 0 (default: unset)
  const char* selects;     // what the values select
  const char* why;         // who needs a value other than the default
};

// Every switch, in the order of docs/knobs.md.
std::span<const Knob> table();

// MSA_SM90_PREFILL: how the Hopper prefill decomposes sparse tiles.
enum class PrefillDecomposition { kAuto, kQMajor, kKvMajor };
PrefillDecomposition prefill_decomposition(const char* fn);

// MSA_PORTABLE_PREFILL: the portable prefill's decomposition; other than auto, prefill plans take the
// portable family on sm_90 too.
enum class PortablePrefill { kAuto, kQMajor, kKvMajor };
PortablePrefill portable_prefill(const char* fn);

// MSA_PORTABLE_KV_STAGES=1: the portable KV-major kernel with one K/V stage on every device.
bool portable_one_kv_stage(const char* fn);

// MSA_PAGED_TILE_SHAPE: the paged kernel's 128-row tiles at head dim <= 128 (config.cuh): as the device allows,
// 4 warps of 32 rows with 32-key stages (head dim 128), or 8 warps of 16 rows.
enum class PagedTileShape { kAuto, kKeys32, kWarps8 };
PagedTileShape paged_tile_shape(const char* fn);

// MSA_SM90_KV_WINDOW_TILES: the most tiles of a KV-major window; 0 when unset (no cap).
int64_t kv_window_tiles(const char* fn);

// MSA_SM90_FP8_QMAJOR=tiles: the Hopper query-major kernel widens each fp8 tile itself, with no 16-bit copy.
bool fp8_qmajor_tiles(const char* fn);

// MSA_PAGED_TOKEN_KERNEL: false with 0 (the general paged kernel serves every decode plan).
bool token_decode_kernel(const char* fn);

// MSA_INDEXER_PREFILL=portable: prefill-shaped block scores on the mma.sync kernel on sm_90 too.
bool indexer_portable_prefill(const char* fn);

// MSA_INDEXER_DECODE=stream: decode-shaped block scores on the streaming kernel on sm_90 too.
bool indexer_stream_decode(const char* fn);

}  // namespace msa::detail::knobs
