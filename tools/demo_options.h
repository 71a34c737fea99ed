// The options of `msa demo`, their defaults, and the MiniMax-M3 shape the demo runs.
#pragma once

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>

namespace msa::cli {

// MiniMax-M3 sparse attention per GPU at TP1 (spec/benchmarks.md "M3-TP1").
inline constexpr int kNumQoHeads = 64;
inline constexpr int kNumKvHeads = 4;
inline constexpr int kHeadDim = 128;
inline constexpr int kTopk = 16;
inline constexpr int kPageSize = 128;
inline constexpr int kBlockSize = 128;
// Pattern clustered: candidate blocks fixed per (128-token query block, KV head) that each token
// draws its top-k - 2 non-forced blocks from (spec/benchmarks.md).
inline constexpr int kClusterCandidates = 24;
// Pattern indexer: the lightning indexer of M3 picks the blocks. One index query head per KV head, one
// index-K head shared by them (spec/benchmarks.md "Indexer"), head dim 128; the own block is forced
// (the last valid block of a token's causal row).
inline constexpr int kIndexHeadDim = 128;
inline constexpr int kIndexKHeads = 1;
inline constexpr int kForceBegin = 0;
inline constexpr int kForceEnd = 1;

// The contract's tolerance against float64 (contract §3) for bf16 inputs.
inline constexpr double kMaxRelL2 = 1e-2;
inline constexpr double kMaxAbs = 2e-2;

// Default sizes. CPU: a chunk and a decode batch the reference finishes in seconds on 2 cores.
// CUDA: benchmarks.md's P-chunk (4096 new tokens on 28672 cached) and D-B64 (65536 tokens each).
struct DemoSizes {
  int64_t chunk = 0, prefix = 0, decode_batch = 0, decode_len = 0;
  int repeat = 0;
};
inline constexpr DemoSizes kCpuDefaults{256, 3840, 8, 8192, 1};
inline constexpr DemoSizes kCudaDefaults{4096, 28672, 64, 65536, 10};
inline constexpr int64_t kDefaultCheckRows = 512;

enum class BackendChoice { kAuto, kCpu, kCuda };
enum class Pattern { kRandom, kClustered, kShared, kIndexer };
// The K/V cache: bf16, or fp8 e4m3 with per-tensor scales.
enum class KvDtype { kBf16, kFp8 };

const char* pattern_name(Pattern p);

struct DemoOptions {
  bool help = false;
  BackendChoice backend = BackendChoice::kAuto;
  uint64_t seed = 0;
  std::optional<int64_t> chunk, prefix, decode_batch, decode_len;  // unset: the backend's default
  Pattern pattern = Pattern::kRandom;
  KvDtype kv_dtype = KvDtype::kBf16;
  int64_t check_rows = kDefaultCheckRows;
  bool dense = false;
  std::optional<int> repeat;
};

// A malformed command line: the message says which option and why; the tool exits with status 2.
class UsageError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// argv[0] is the first option (the word "demo" already consumed). Throws UsageError.
DemoOptions parse_demo_options(int argc, char** argv);
// The sizes of this run: the given ones, the backend's defaults for the rest. Throws UsageError
// when the combination does not fit the int32 lengths of the API.
DemoSizes resolve_sizes(const DemoOptions& o, bool cuda);
std::string demo_help();

}  // namespace msa::cli
