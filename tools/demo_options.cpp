#include "demo_options.h"

#include <charconv>
#include <limits>
#include <sstream>
#include <string_view>
#include <type_traits>

namespace msa::cli {

namespace {

constexpr int64_t kMaxLen = std::numeric_limits<int32_t>::max();  // lengths are int32 in the API

template <typename Int>
Int parse_int(std::string_view opt, std::string_view text, Int lo, Int hi) {
  Int v{};
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (text.empty() || ec != std::errc() || end != text.data() + text.size()) {
    std::ostringstream os;  // out of Int's range reads as a range error, a non-number as what it is
    if (ec == std::errc::result_out_of_range || (std::is_unsigned_v<Int> && !text.empty() && text.front() == '-'))
      os << "option " << opt << ": expected " << lo << ".." << hi << ", got " << text;
    else
      os << "option " << opt << ": expected an integer, got '" << text << "'";
    throw UsageError(os.str());
  }
  if (v < lo || v > hi) {
    std::ostringstream os;
    os << "option " << opt << ": expected " << lo << ".." << hi << ", got " << v;
    throw UsageError(os.str());
  }
  return v;
}

BackendChoice parse_backend(std::string_view text) {
  if (text == "auto") return BackendChoice::kAuto;
  if (text == "cpu") return BackendChoice::kCpu;
  if (text == "cuda") return BackendChoice::kCuda;
  throw UsageError("option --backend: expected auto, cpu or cuda, got '" + std::string(text) + "'");
}

Pattern parse_pattern(std::string_view text) {
  if (text == "random") return Pattern::kRandom;
  if (text == "clustered") return Pattern::kClustered;
  if (text == "shared") return Pattern::kShared;
  if (text == "indexer") return Pattern::kIndexer;
  throw UsageError("option --pattern: expected random, clustered, shared or indexer, got '" + std::string(text) +
                   "'");
}

KvDtype parse_kv_dtype(std::string_view text) {
  if (text == "bf16") return KvDtype::kBf16;
  if (text == "fp8") return KvDtype::kFp8;
  throw UsageError("option --kv-dtype: expected bf16 or fp8, got '" + std::string(text) + "'");
}

}  // namespace

const char* pattern_name(Pattern p) {
  switch (p) {
    case Pattern::kRandom: return "random";
    case Pattern::kClustered: return "clustered";
    case Pattern::kShared: return "shared";
    case Pattern::kIndexer: return "indexer";
  }
  return "?";
}

DemoOptions parse_demo_options(int argc, char** argv) {
  DemoOptions o;
  for (int i = 0; i < argc; ++i) {
    std::string_view arg = argv[i];
    if (arg == "-h" || arg == "--help") {
      o.help = true;
      continue;
    }
    if (arg == "--dense") {
      o.dense = true;
      continue;
    }
    if (arg.starts_with("--dense=")) throw UsageError("option --dense takes no value");
    if (!arg.starts_with("--")) throw UsageError("unexpected argument '" + std::string(arg) + "'");
    // "--name value" or "--name=value".
    std::string_view name = arg, value;
    bool have_value = false;
    if (const auto eq = arg.find('='); eq != std::string_view::npos) {
      name = arg.substr(0, eq);
      value = arg.substr(eq + 1);
      have_value = true;
    }
    const bool takes_value = name == "--backend" || name == "--seed" || name == "--chunk" || name == "--prefix" ||
                             name == "--decode-batch" || name == "--decode-len" || name == "--pattern" ||
                             name == "--check-rows" || name == "--repeat" || name == "--kv-dtype";
    if (!takes_value) throw UsageError("unknown option '" + std::string(name) + "'");
    if (!have_value) {
      if (i + 1 >= argc) throw UsageError("option " + std::string(name) + ": missing value");
      value = argv[++i];
    }
    if (name == "--backend") o.backend = parse_backend(value);
    else if (name == "--seed") o.seed = parse_int<uint64_t>(name, value, 0, std::numeric_limits<uint64_t>::max());
    else if (name == "--chunk") o.chunk = parse_int<int64_t>(name, value, 1, kMaxLen);
    else if (name == "--prefix") o.prefix = parse_int<int64_t>(name, value, 0, kMaxLen);
    // 65536 requests: far beyond any serving batch, and keeps B * Hq rows within int32 everywhere.
    else if (name == "--decode-batch") o.decode_batch = parse_int<int64_t>(name, value, 1, 65536);
    else if (name == "--decode-len") o.decode_len = parse_int<int64_t>(name, value, 1, kMaxLen);
    else if (name == "--pattern") o.pattern = parse_pattern(value);
    else if (name == "--kv-dtype") o.kv_dtype = parse_kv_dtype(value);
    else if (name == "--check-rows") o.check_rows = parse_int<int64_t>(name, value, 1, kMaxLen);
    else if (name == "--repeat") o.repeat = parse_int<int>(name, value, 1, 100000);
  }
  if (o.dense && o.pattern == Pattern::kIndexer)
    throw UsageError("options --dense and --pattern indexer: dense attention selects no blocks; pass one of them");
  return o;
}

DemoSizes resolve_sizes(const DemoOptions& o, bool cuda) {
  const DemoSizes& d = cuda ? kCudaDefaults : kCpuDefaults;
  DemoSizes s;
  s.chunk = o.chunk.value_or(d.chunk);
  s.prefix = o.prefix.value_or(d.prefix);
  s.decode_batch = o.decode_batch.value_or(d.decode_batch);
  s.decode_len = o.decode_len.value_or(d.decode_len);
  s.repeat = o.repeat.value_or(d.repeat);
  if (s.prefix + s.chunk > kMaxLen) {
    std::ostringstream os;
    os << "options --prefix + --chunk: expected at most " << kMaxLen << " tokens (int32 lengths), got "
       << s.prefix + s.chunk;
    throw UsageError(os.str());
  }
  return s;
}

std::string demo_help() {
  std::ostringstream os;
  os << "usage: msa demo [options]\n"
        "\n"
        "Runs one MiniMax-M3 sparse attention layer (Hq=" << kNumQoHeads << ", Hkv=" << kNumKvHeads
     << ", D=" << kHeadDim << ", top-k " << kTopk << ", page " << kPageSize << ", block " << kBlockSize
     << ", bf16 q)\n"
        "on synthetic data: one chunked-prefill step (a chunk of new tokens on a cached prefix) and one\n"
        "decode batch. Each output is checked on a sample of (token, head) rows against a float64\n"
        "computation done in this tool; the tolerance is the contract's: relative L2 error < "
     << kMaxRelL2 << "\nand max abs error < " << kMaxAbs
     << ".\n"
        "\n"
        "options (sizes default per backend: cpu / cuda):\n"
        "  --backend auto|cpu|cuda   where to run (default auto: cuda when msa was built with it and a\n"
        "                            GPU of compute capability >= 8.0 is visible, else cpu)\n"
        "  --seed N                  seed of the data and the selections (default 0)\n"
        "  --chunk N                 new tokens in the prefill chunk (default "
     << kCpuDefaults.chunk << " / " << kCudaDefaults.chunk
     << ")\n"
        "  --prefix N                cached tokens before the chunk (default "
     << kCpuDefaults.prefix << " / " << kCudaDefaults.prefix
     << ")\n"
        "  --decode-batch N          requests in the decode batch, one new token each (default "
     << kCpuDefaults.decode_batch << " / " << kCudaDefaults.decode_batch
     << ")\n"
        "  --decode-len N            keys per decode request, the new token included (default "
     << kCpuDefaults.decode_len << " / " << kCudaDefaults.decode_len
     << ")\n"
        "  --pattern random|clustered|shared|indexer\n"
        "                            block selection, the own block always in (default random):\n"
        "                            random = "
     << kTopk - 1
     << " earlier blocks drawn per token; clustered = block 0\n"
        "                            and "
     << kTopk - 2 << " of " << kClusterCandidates
     << " candidates fixed per 128-token query block;\n"
        "                            shared = one selection per query block; indexer = the whole\n"
        "                            layer is run and timed: block scores of index queries (one head\n"
        "                            per KV head, D=" << kIndexHeadDim << ") over an index-K cache, top-k with the own\n"
        "                            block forced, then the attention (msa::sparse_attention_layer);\n"
        "                            its selections are checked against float64 scores too\n"
        "  --check-rows N            (token, head) rows checked per phase (default "
     << kDefaultCheckRows
     << ")\n"
        "  --kv-dtype bf16|fp8       the K/V cache (default bf16); fp8 = e4m3 quantized from the random\n"
        "                            data with one scale per tensor (amax / 448), checked against\n"
        "                            float64 over the dequantized cache (both backends)\n"
        "  --dense                   dense paged causal attention instead of top-k blocks\n"
        "  --repeat N                timed runs, median reported (default "
     << kCpuDefaults.repeat << " / " << kCudaDefaults.repeat
     << "); cuda runs one untimed\n"
        "                            warm-up first\n"
        "  -h, --help                show this help\n"
        "\n"
        "Exit status: 0 when every check passes, 1 when a check fails or a run raises an error,\n"
        "2 for bad options.\n";
  return os.str();
}

}  // namespace msa::cli
