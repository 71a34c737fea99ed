// The run-time switches (knobs.h): their table and their one parser. docs/knobs.md lists the same table
// (tests/cpp/test_knobs.cpp checks the names), and no other file of src reads the environment.
#include "core/knobs.h"

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <string>
#include <string_view>

#include "msa/error.h"

namespace msa::detail::knobs {

namespace {

constexpr Knob kTable[] = {
    {"MSA_SM90_PREFILL",
     {"auto", "qmajor", "kvmajor"},
     "How the Hopper prefill decomposes sparse tiles: auto picks per tile on the device (KV-major where the "
     "tile's block union is wide, kKvMajorUnionRatioX4), qmajor takes every tile query-major, kvmajor every tile "
     "KV-major (G >= 8; smaller groups stay query-major).",
     "Benchmarks time each decomposition (bench/prefill.py msa-qmajor / msa-kvmajor, bench/run_host.py); tests "
     "run their cases under each, since auto sends a small problem almost wholly one way."},
    {"MSA_PORTABLE_PREFILL",
     {"auto", "qmajor", "kvmajor"},
     "The portable prefill (sm_80+; on sm_90 where the Hopper kernels do not take the plan): auto sends sparse "
     "tiles whose block union is wide to its KV-major path and the rest to the paged kernel; qmajor every tile "
     "to the paged kernel; kvmajor every sparse tile KV-major (G >= 8, head dim 128). Other than auto, prefill "
     "plans take the portable family on sm_90 too, instead of the Hopper kernels.",
     "Tests check the portable prefill's paths on the H200 whatever the build holds; benchmarks time each "
     "decomposition of the portable prefill (what the A100, L40S and RTX GPUs run) in one process."},
    {"MSA_PORTABLE_KV_STAGES",
     {"auto", "1"},
     "The K/V stages of the portable KV-major prefill kernel: auto as the device's shared memory allows (2 on "
     "sm_80 / sm_90, 1 on the 99 KiB parts: sm_86, sm_89, sm_120); 1 one stage everywhere.",
     "Tests run the one-stage kernel, which the RTX and L40S parts run, on the H200."},
    {"MSA_PAGED_TILE_SHAPE",
     {"auto", "keys32", "warps8"},
     "The paged kernel's 128-row tiles at head dim <= 128 (the portable prefill's query-major tiles): auto 4 "
     "warps of 32 rows with 64-key stages where two CTAs of them fit an SM (H100 / H200), else with 32-key "
     "stages where two of those do (A100, head dim 128), else 8 warps of 16 rows (sm_86, sm_89, sm_120); keys32 "
     "the 32-key stages (head dim 128), warps8 the 8 warps, on every device.",
     "Tests run the tiles that the A100, L40S and RTX parts run on the H200."},
    {"MSA_SM90_FP8_QMAJOR",
     {"auto", "tiles"},
     "How the Hopper prefill's query-major tiles meet an fp8 K/V cache: auto widens each block they read once "
     "per run into the plan's 16-bit copy of the cache's blocks (sparse plans whose copy fits its 512 MiB "
     "budget) and runs the 16-bit kernel on it; tiles widens each fp8 tile in shared memory in the kernel, "
     "what dense plans and plans beyond the budget run.",
     "Tests check the in-kernel widening on problems small enough for the float64 reference, which otherwise "
     "take the copy; benchmarks compare the two in one process."},
    {"MSA_SM90_KV_WINDOW_TILES",
     {nullptr, nullptr, nullptr},
     "The most tiles of a KV-major window, of the Hopper prefill and of the portable one (unset: as many as "
     "the 2 GiB budget of partial outputs holds, 4096 tiles at top-16). Each window is one launch of the "
     "KV-major kernel and one of the merge.",
     "Tests run several windows (window offsets, counters and lists per window) on problems small enough for "
     "the float64 reference, which otherwise fit one window; benchmarks measured L2-sized windows with it."},
    {"MSA_PAGED_TOKEN_KERNEL",
     {"1", "0"},
     "0: the general paged decode kernel (cp.async + mma.sync, sm_80+) serves the decode plans that the "
     "single-token kernel would take (one query token per request, or MTP at G > 8; head dim 128, G <= 16, "
     "top-k <= 32; below sm_90 code only those it runs unsplit).",
     "The general kernel is what the L40S and RTX parts run for those plans (the A100 too where they do not fill "
     "it unsplit): tests check it on the H200, and "
     "benchmarks compare the two kernels in one process."},
    {"MSA_INDEXER_PREFILL",
     {"auto", "portable"},
     "portable: prefill-shaped block scores on the mma.sync kernel (sm_80+) instead of the sm_90a wgmma "
     "kernels. With fp8 index keys this is the exact path (keys converted to fp16, fp32 sums) instead of "
     "fp8 wgmma on queries quantized to e4m3 per row (~0.3 rms of score error on unit-variance data).",
     "The mma.sync kernel is what every GPU but sm_90 runs: tests check it with bf16 and fp8 keys on the "
     "H200, and bench/indexer.py times it (msa-sm80, msa-exact); fp8 users who want scores without the "
     "query's e4m3 rounding set it."},
    {"MSA_INDEXER_DECODE",
     {"auto", "stream"},
     "stream: decode-shaped block scores on the streaming kernel instead of the sm_90 TMA ring.",
     "The streaming kernel is what every GPU but sm_90 runs (and sm_90 for groups wider than the ring "
     "takes): tests check it on the H200, and bench/indexer.py --variants times it (msa[stream])."},
};

constexpr int find(std::string_view name) {
  for (int i = 0; i < static_cast<int>(std::size(kTable)); ++i)
    if (name == kTable[i].name) return i;
  return -1;
}

// The one parser. A choice knob: the index of the value among its choices (0, the default, when the
// variable is unset or empty). An integer knob: the value (0 when unset or empty).
int64_t read(int id, const char* fn) {
  const Knob& k = kTable[id];
  const char* v = std::getenv(k.name);
  if (v == nullptr || *v == 0) return 0;
  if (k.choices[0] == nullptr) {
    // Decimal digits only: strtoll alone also takes leading spaces and a sign.
    const bool digits = std::all_of(v, v + std::strlen(v), [](char c) { return c >= '0' && c <= '9'; });
    char* end = nullptr;
    errno = 0;
    const long long n = std::strtoll(v, &end, 10);
    MSA_CHECK(digits && end != v && *end == 0 && errno == 0 && n > 0, kValue, fn, ": environment variable ", k.name,
              ": expected an integer > 0, got '", v, "'");
    return n;
  }
  std::string expected;
  int n = 0;
  while (n < static_cast<int>(std::size(k.choices)) && k.choices[n] != nullptr) {
    if (std::strcmp(v, k.choices[n]) == 0) return n;
    ++n;
  }
  for (int i = 0; i < n; ++i) expected += std::string(i == 0 ? "" : i + 1 < n ? ", " : " or ") + k.choices[i];
  MSA_FAIL(kValue, fn, ": environment variable ", k.name, ": expected ", expected, ", got '", v, "'");
}

constexpr int kPrefill = find("MSA_SM90_PREFILL");
constexpr int kPortable = find("MSA_PORTABLE_PREFILL");
constexpr int kPortableStages = find("MSA_PORTABLE_KV_STAGES");
constexpr int kWindowTiles = find("MSA_SM90_KV_WINDOW_TILES");
constexpr int kFp8QMajor = find("MSA_SM90_FP8_QMAJOR");
constexpr int kTileShape = find("MSA_PAGED_TILE_SHAPE");
constexpr int kTokenKernel = find("MSA_PAGED_TOKEN_KERNEL");
constexpr int kIndexerPrefill = find("MSA_INDEXER_PREFILL");
constexpr int kIndexerDecode = find("MSA_INDEXER_DECODE");
static_assert(kPrefill >= 0 && kPortable >= 0 && kPortableStages >= 0 && kWindowTiles >= 0 && kFp8QMajor >= 0 && kTileShape >= 0 && kTokenKernel >= 0 && kIndexerPrefill >= 0 && kIndexerDecode >= 0,
              "every accessor's variable is in the table");

}  // namespace

std::span<const Knob> table() { return kTable; }

PrefillDecomposition prefill_decomposition(const char* fn) {
  return static_cast<PrefillDecomposition>(read(kPrefill, fn));  // choices in the enum's order
}

PortablePrefill portable_prefill(const char* fn) {
  return static_cast<PortablePrefill>(read(kPortable, fn));  // choices in the enum's order
}

bool portable_one_kv_stage(const char* fn) { return read(kPortableStages, fn) == 1; }

PagedTileShape paged_tile_shape(const char* fn) {
  return static_cast<PagedTileShape>(read(kTileShape, fn));  // choices in the enum's order
}

int64_t kv_window_tiles(const char* fn) { return read(kWindowTiles, fn); }

bool fp8_qmajor_tiles(const char* fn) { return read(kFp8QMajor, fn) == 1; }

bool token_decode_kernel(const char* fn) { return read(kTokenKernel, fn) == 0; }

bool indexer_portable_prefill(const char* fn) { return read(kIndexerPrefill, fn) == 1; }

bool indexer_stream_decode(const char* fn) { return read(kIndexerDecode, fn) == 1; }

}  // namespace msa::detail::knobs
