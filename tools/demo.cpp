#include "demo.h"

#include <chrono>
#include <cstdio>
#include <iostream>
#include <iterator>
#include <exception>
#include <new>
#include <string>
#include <vector>

#include "check_f64.h"
#include "demo_options.h"
#include "metrics.h"
#include "msa/msa.h"
#include "rng.h"
#include "runner.h"
#include "workload.h"

namespace msa::cli {

namespace {

enum : uint64_t { kTagPrefill = 101, kTagDecode = 102, kTagCheck = 103 };

template <typename... Args>
std::string format(const char* fmt, Args... args) {
  char buf[256];
  std::snprintf(buf, sizeof buf, fmt, args...);
  return buf;
}

std::string format_time(double ms) {
  if (ms >= 1000.0) return format("%.2f s", ms / 1000.0);
  if (ms >= 1.0) return format("%.2f ms", ms);
  return format("%.1f us", ms * 1000.0);
}

// Three significant digits and a decimal prefix: "1.23 TFLOP", "16.6 GFLOP", "270 MB".
std::string format_amount(double amount, const char* unit) {
  const char* prefix = "k";
  double v = amount / 1e3;
  if (amount >= 1e12) prefix = "T", v = amount / 1e12;
  else if (amount >= 1e9) prefix = "G", v = amount / 1e9;
  else if (amount >= 1e6) prefix = "M", v = amount / 1e6;
  return format(v < 10 ? "%.2f %s%s" : v < 100 ? "%.1f %s%s" : "%.0f %s%s", v, prefix, unit);
}

std::string format_rate(double per_second, const char* unit) { return format_amount(per_second, unit) + "/s"; }

std::string format_bytes(int64_t bytes) {
  const double b = static_cast<double>(bytes);
  return b >= (1 << 30) ? format("%.1f GiB", b / (1 << 30)) : format("%.1f MiB", b / (1 << 20));
}

// Progress on stderr, stamped with the seconds since the demo started.
class Progress {
 public:
  void operator()(const std::string& msg) const {
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
    std::fprintf(stderr, "msa demo [%6.1fs] %s\n", s, msg.c_str());
  }

 private:
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
};

// True for the CUDA backend. Throws UsageError when CUDA is asked for and cannot run.
bool choose_cuda(BackendChoice choice) {
#ifdef MSA_WITH_CUDA
  constexpr bool compiled = true;
#else
  constexpr bool compiled = false;
#endif
  if (choice == BackendChoice::kCpu) return false;
  if (choice == BackendChoice::kAuto) return compiled && cuda_available();
  if (!compiled)
    throw UsageError("option --backend cuda: this build of msa has no CUDA backend (configure with nvcc on the PATH)");
  if (!cuda_available())
    throw UsageError("option --backend cuda: no CUDA GPU of compute capability >= 8.0 is visible");
  return true;
}

struct PhaseRow {
  std::string phase, backend, shape, time, rate, max_abs, rel_l2, verdict;
};

constexpr const char* kRowFormat = "%-8s %-7s %-28s %-10s %-15s %-9s %-9s %s\n";

void print_row(const PhaseRow& r) {
  std::printf(kRowFormat, r.phase.c_str(), r.backend.c_str(), r.shape.c_str(), r.time.c_str(), r.rate.c_str(),
              r.max_abs.c_str(), r.rel_l2.c_str(), r.verdict.c_str());
  std::fflush(stdout);
}

struct PhaseJob {
  const char* name;
  WorkloadSpec spec;
  std::string shape;
};

// Builds, runs and checks one phase; the row it prints says pass or fail.
bool run_phase(const PhaseJob& job, bool cuda, const DemoOptions& opt, const DemoSizes& sizes,
               const Progress& progress) {
  PhaseRow row{job.name, cuda ? "cuda" : "cpu", job.shape, "-", "-", "-", "-", "-"};
  const std::string prefix = std::string(job.name) + ": ";
  try {
    progress(prefix + "building synthetic data (" + format_bytes(workload_bytes(job.spec)) + " on the host)");
    Workload w = make_workload(job.spec);
    progress(prefix + format("running on %s, %d timed run%s%s", row.backend.c_str(), sizes.repeat,
                             sizes.repeat == 1 ? "" : "s", cuda ? " after a warm-up" : ""));
#ifdef MSA_WITH_CUDA
    const RunResult r = cuda ? run_on_cuda(w, sizes.repeat) : run_on_cpu(w, sizes.repeat);
#else
    const RunResult r = run_on_cpu(w, sizes.repeat);
#endif
    progress(prefix + "plan: " + r.plan);
    // Pattern indexer: the blocks the layer's indexer chose, over which its attention ran. They must be in
    // place before the work is counted (and the attention checked): the attention's work is that of the
    // selected blocks, none before the layer has run.
    if (w.indexer) w.block_idx = r.block_idx;
    const double ms = r.median_ms();
    row.time = format_time(ms);
    const bool prefill = w.phase == Phase::kPrefill;
    const PhaseWork work = prefill ? effective_flops(w) : effective_bytes(w);
    const char* unit = prefill ? "FLOP" : "B";
    if (w.indexer)
      progress(prefix + "effective work of the layer (the rate counts both parts over the time of the whole call): " +
               format_amount(work.indexer, unit) + " indexer + " + format_amount(work.attention, unit) + " attention");
    if (ms > 0.0) row.rate = format_rate(work.total() / (ms * 1e-3), unit);
    const auto rows = sample_rows(w, opt.check_rows, stream_key(job.spec.seed, {kTagCheck}));
    int64_t bad_selections = 0;
    if (w.indexer) {  // the attention is checked over the blocks the layer's indexer chose
      progress(prefix + "checking the selections of those rows against float64 block scores");
      bad_selections = check_selections(w, rows);
    }
    progress(prefix + format("checking %lld (token, head) rows against float64", static_cast<long long>(rows.size())));
    const CheckResult c = check_rows(w, r.o.data(), rows);
    const bool pass = c.pass() && bad_selections == 0;
    row.max_abs = format("%.2e", c.max_abs);
    row.rel_l2 = format("%.2e", c.rel_l2);
    row.verdict = pass ? "pass" : "FAIL";
    if (c.nan_values > 0) row.verdict += format(" (%lld NaN/inf values)", static_cast<long long>(c.nan_values));
    if (bad_selections > 0)
      row.verdict += format(" (%lld selection rows wrong)", static_cast<long long>(bad_selections));
    print_row(row);
    return pass;
  } catch (const std::bad_alloc&) {
    row.verdict = "ERROR";
    print_row(row);
    std::fprintf(stderr, "msa demo: %s: out of host memory (%s needed); pass smaller sizes\n", job.name,
                 format_bytes(workload_bytes(job.spec)).c_str());
  } catch (const std::exception& e) {  // msa::Error from the library, CUDA failures from the runner
    row.verdict = "ERROR";
    print_row(row);
    std::fprintf(stderr, "msa demo: %s on %s: %s\n", job.name, row.backend.c_str(), e.what());
  }
  return false;
}

}  // namespace

int demo_main(int argc, char** argv) {
  DemoOptions opt;
  DemoSizes sizes;
  bool cuda = false;
  try {
    opt = parse_demo_options(argc, argv);
    if (opt.help) {
      std::cout << demo_help();
      return 0;
    }
    cuda = choose_cuda(opt.backend);
    sizes = resolve_sizes(opt, cuda);
  } catch (const UsageError& e) {
    std::fprintf(stderr, "msa demo: %s\nTry 'msa demo --help'.\n", e.what());
    return 2;
  }
  const Progress progress;

  std::string where = "cpu reference backend";
#ifdef MSA_WITH_CUDA
  if (cuda) where = cuda_device_name();
#endif
  std::printf("msa demo: MiniMax-M3 %s attention%s, Hq=%d Hkv=%d D=%d, page %d, block %d, bf16%s\n",
              opt.dense ? "dense paged" : format("sparse (top-k %d)", kTopk).c_str(),
              opt.pattern == Pattern::kIndexer ? " with its indexer (the whole layer)" : "", kNumQoHeads,
              kNumKvHeads, kHeadDim, kPageSize, kBlockSize,
              opt.kv_dtype == KvDtype::kFp8 ? " q, fp8 e4m3 K/V (per-tensor scales)" : "");
  std::printf("          on %s; pattern %s, seed %llu; time: median of %d run%s%s\n", where.c_str(),
              opt.dense ? "-" : pattern_name(opt.pattern), static_cast<unsigned long long>(opt.seed), sizes.repeat,
              sizes.repeat == 1 ? "" : "s", cuda ? " after a warm-up" : "");
  std::printf("          check: float64 on %lld sampled (token, head) rows per phase, pass when rel L2 < %.0e and "
              "max abs < %.0e\n\n",
              static_cast<long long>(opt.check_rows), kMaxRelL2, kMaxAbs);
  std::printf(kRowFormat, "phase", "backend", "shape", "time", "rate", "max abs", "rel L2", "check");
  std::fflush(stdout);

  const PhaseJob jobs[] = {
      {"prefill",
       {Phase::kPrefill, 1, sizes.chunk, sizes.prefix + sizes.chunk, opt.pattern, opt.dense, opt.kv_dtype,
        stream_key(opt.seed, {kTagPrefill})},
       format("chunk %lld on prefix %lld", static_cast<long long>(sizes.chunk), static_cast<long long>(sizes.prefix))},
      {"decode",
       {Phase::kDecode, sizes.decode_batch, 1, sizes.decode_len, opt.pattern, opt.dense, opt.kv_dtype,
        stream_key(opt.seed, {kTagDecode})},
       format("batch %lld x kv %lld", static_cast<long long>(sizes.decode_batch),
              static_cast<long long>(sizes.decode_len))},
  };
  int failed = 0;
  for (const PhaseJob& job : jobs) failed += run_phase(job, cuda, opt, sizes, progress) ? 0 : 1;
  if (failed == 0)
    std::printf("\nall checks passed\n");
  else
    std::printf("\n%d of %zu phases FAILED\n", failed, std::size(jobs));
  progress("done");
  return failed == 0 ? 0 : 1;
}

}  // namespace msa::cli
