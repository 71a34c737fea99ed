// The run-time switches (src/core/knobs.h): defaults, accepted values, the errors on bad values, and
// docs/knobs.md against the table (names, values, defaults), with getenv in no other file of src.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "core/knobs.h"
#include "msa/error.h"

namespace msa_test {
namespace {

namespace knobs = msa::detail::knobs;
namespace fs = std::filesystem;

// Sets (or unsets) an environment variable for the scope and restores what was there.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    if (value != nullptr)
      setenv(name, value, 1);
    else
      unsetenv(name);
  }
  ~ScopedEnv() {
    if (old_)
      setenv(name_.c_str(), old_->c_str(), 1);
    else
      unsetenv(name_.c_str());
  }

 private:
  std::string name_;
  std::optional<std::string> old_;
};

// The message of the msa::Error(kValue) that fn throws ("" and a test failure when it throws none).
template <typename Fn>
std::string value_error(Fn fn) {
  try {
    fn();
  } catch (const msa::Error& e) {
    EXPECT_EQ(e.kind(), msa::ErrorKind::kValue) << e.what();
    return e.what();
  }
  ADD_FAILURE() << "no msa::Error";
  return "";
}

TEST(Knobs, DefaultsWhenUnsetOrEmpty) {
  for (const char* v : {static_cast<const char*>(nullptr), ""}) {
    ScopedEnv a("MSA_SM90_PREFILL", v), b("MSA_SM90_KV_WINDOW_TILES", v), c("MSA_PAGED_TOKEN_KERNEL", v),
        d("MSA_INDEXER_PREFILL", v), e("MSA_INDEXER_DECODE", v), f("MSA_PORTABLE_KV_STAGES", v),
        g("MSA_PAGED_TILE_SHAPE", v), h("MSA_SM90_FP8_QMAJOR", v);
    EXPECT_EQ(knobs::prefill_decomposition("f"), knobs::PrefillDecomposition::kAuto);
    EXPECT_FALSE(knobs::portable_one_kv_stage("f"));
    EXPECT_EQ(knobs::paged_tile_shape("f"), knobs::PagedTileShape::kAuto);
    EXPECT_EQ(knobs::kv_window_tiles("f"), 0);
    EXPECT_FALSE(knobs::fp8_qmajor_tiles("f"));
    EXPECT_TRUE(knobs::token_decode_kernel("f"));
    EXPECT_FALSE(knobs::indexer_portable_prefill("f"));
    EXPECT_FALSE(knobs::indexer_stream_decode("f"));
  }
}

TEST(Knobs, AcceptedValues) {
  {
    ScopedEnv e("MSA_SM90_PREFILL", "auto");
    EXPECT_EQ(knobs::prefill_decomposition("f"), knobs::PrefillDecomposition::kAuto);
  }
  {
    ScopedEnv e("MSA_SM90_PREFILL", "qmajor");
    EXPECT_EQ(knobs::prefill_decomposition("f"), knobs::PrefillDecomposition::kQMajor);
  }
  {
    ScopedEnv e("MSA_SM90_PREFILL", "kvmajor");
    EXPECT_EQ(knobs::prefill_decomposition("f"), knobs::PrefillDecomposition::kKvMajor);
  }
  {
    ScopedEnv e("MSA_PORTABLE_KV_STAGES", "1");
    EXPECT_TRUE(knobs::portable_one_kv_stage("f"));
  }
  {
    ScopedEnv e("MSA_PORTABLE_KV_STAGES", "auto");
    EXPECT_FALSE(knobs::portable_one_kv_stage("f"));
  }
  {
    ScopedEnv e("MSA_PAGED_TILE_SHAPE", "keys32");
    EXPECT_EQ(knobs::paged_tile_shape("f"), knobs::PagedTileShape::kKeys32);
  }
  {
    ScopedEnv e("MSA_PAGED_TILE_SHAPE", "warps8");
    EXPECT_EQ(knobs::paged_tile_shape("f"), knobs::PagedTileShape::kWarps8);
  }
  {
    ScopedEnv e("MSA_SM90_KV_WINDOW_TILES", "24");
    EXPECT_EQ(knobs::kv_window_tiles("f"), 24);
  }
  {
    ScopedEnv e("MSA_SM90_FP8_QMAJOR", "tiles");
    EXPECT_TRUE(knobs::fp8_qmajor_tiles("f"));
  }
  {
    ScopedEnv e("MSA_SM90_FP8_QMAJOR", "auto");
    EXPECT_FALSE(knobs::fp8_qmajor_tiles("f"));
  }
  {
    ScopedEnv e("MSA_PAGED_TOKEN_KERNEL", "0");
    EXPECT_FALSE(knobs::token_decode_kernel("f"));
  }
  {
    ScopedEnv e("MSA_PAGED_TOKEN_KERNEL", "1");
    EXPECT_TRUE(knobs::token_decode_kernel("f"));
  }
  {
    ScopedEnv e("MSA_INDEXER_PREFILL", "portable");
    EXPECT_TRUE(knobs::indexer_portable_prefill("f"));
  }
  {
    ScopedEnv e("MSA_INDEXER_DECODE", "stream");
    EXPECT_TRUE(knobs::indexer_stream_decode("f"));
  }
}

// A bad value names the entry point, the variable, what it accepts and what it got; read again when the
// variable changes (nothing is cached across calls).
TEST(Knobs, RefusesBadValues) {
  {
    ScopedEnv e("MSA_SM90_PREFILL", "kv-major");
    EXPECT_EQ(value_error([] { knobs::prefill_decomposition("msa.plan_prefill"); }),
              "msa.plan_prefill: environment variable MSA_SM90_PREFILL: expected auto, qmajor or kvmajor, "
              "got 'kv-major'");
  }
  for (const char* bad : {"0", "-4", "+4", " 4", "4 ", "12x", "x", " ", "99999999999999999999"}) {
    ScopedEnv e("MSA_SM90_KV_WINDOW_TILES", bad);
    EXPECT_EQ(value_error([] { knobs::kv_window_tiles("msa.plan_prefill"); }),
              std::string("msa.plan_prefill: environment variable MSA_SM90_KV_WINDOW_TILES: expected an integer > 0, "
                          "got '") + bad + "'");
  }
  {
    ScopedEnv e("MSA_SM90_FP8_QMAJOR", "kernel");
    EXPECT_EQ(value_error([] { knobs::fp8_qmajor_tiles("msa.plan_prefill"); }),
              "msa.plan_prefill: environment variable MSA_SM90_FP8_QMAJOR: expected auto or tiles, got 'kernel'");
  }
  {
    ScopedEnv e("MSA_PAGED_TOKEN_KERNEL", "off");
    EXPECT_EQ(value_error([] { knobs::token_decode_kernel("msa.plan_decode"); }),
              "msa.plan_decode: environment variable MSA_PAGED_TOKEN_KERNEL: expected 1 or 0, got 'off'");
  }
  {
    ScopedEnv e("MSA_INDEXER_PREFILL", "sm80");
    EXPECT_EQ(value_error([] { knobs::indexer_portable_prefill("msa.block_scores"); }),
              "msa.block_scores: environment variable MSA_INDEXER_PREFILL: expected auto or portable, got 'sm80'");
  }
  {
    ScopedEnv e("MSA_INDEXER_DECODE", "Stream");
    EXPECT_EQ(value_error([] { knobs::indexer_stream_decode("msa.block_scores"); }),
              "msa.block_scores: environment variable MSA_INDEXER_DECODE: expected auto or stream, got 'Stream'");
  }
  ScopedEnv e("MSA_SM90_PREFILL", "qmajor");
  EXPECT_EQ(knobs::prefill_decomposition("f"), knobs::PrefillDecomposition::kQMajor);
}

fs::path repo_root() { return fs::path(__FILE__).parent_path().parent_path().parent_path(); }

std::vector<std::string> read_lines(const fs::path& p) {
  std::ifstream in(p);
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

// The cells of a markdown table row "| a | b |" (trimmed; "\|" kept as "|").
std::vector<std::string> cells(const std::string& row) {
  std::vector<std::string> out;
  std::string cur;
  for (size_t i = 1; i < row.size(); ++i) {
    if (row[i] == '\\' && i + 1 < row.size() && row[i + 1] == '|') {
      cur += '|';
      ++i;
    } else if (row[i] == '|') {
      const size_t a = cur.find_first_not_of(' '), b = cur.find_last_not_of(' ');
      out.push_back(a == std::string::npos ? "" : cur.substr(a, b - a + 1));
      cur.clear();
    } else {
      cur += row[i];
    }
  }
  return out;
}

// docs/knobs.md's run-time table: one row per knob, in the table's order, | `NAME` | values | default | ... |
// with the values as `v1`, `v2` (or "an integer > 0") and the default as `v1` (or "unset").
TEST(Knobs, DocsListExactlyTheTable) {
  const fs::path doc = repo_root() / "docs" / "knobs.md";
  ASSERT_TRUE(fs::exists(doc)) << doc;
  std::vector<std::vector<std::string>> rows;
  for (const std::string& line : read_lines(doc))
    if (line.rfind("| `MSA_", 0) == 0) rows.push_back(cells(line));
  const auto table = knobs::table();
  ASSERT_EQ(rows.size(), table.size()) << "rows of docs/knobs.md naming a variable";
  for (size_t i = 0; i < table.size(); ++i) {
    const knobs::Knob& k = table[i];
    ASSERT_GE(rows[i].size(), 5u) << rows[i][0];
    EXPECT_EQ(rows[i][0], std::string("`") + k.name + "`");
    std::string values, dflt = "unset";
    if (k.choices[0] == nullptr) {
      values = "an integer > 0";
    } else {
      dflt = std::string("`") + k.choices[0] + "`";
      for (int c = 0; c < 3 && k.choices[c] != nullptr; ++c) values += (c ? ", `" : "`") + std::string(k.choices[c]) + "`";
    }
    EXPECT_EQ(rows[i][1], values) << k.name;
    EXPECT_EQ(rows[i][2], dflt) << k.name;
  }
}

// Build options of docs/knobs.md (rows | `-DNAME` | ...): each is a macro that src tests.
TEST(Knobs, DocsBuildOptionsExist) {
  std::set<std::string> documented;
  for (const std::string& line : read_lines(repo_root() / "docs" / "knobs.md"))
    if (line.rfind("| `-D", 0) == 0) documented.insert(cells(line)[0].substr(3, cells(line)[0].size() - 4));
  EXPECT_FALSE(documented.empty());
  std::set<std::string> tested;
  const std::regex ifdef(R"(#\s*if(?:def\s+|.*defined\()\s*(MSA_[A-Z0-9_]+_TRACE))");
  for (const auto& e : fs::recursive_directory_iterator(repo_root() / "src")) {
    if (!e.is_regular_file()) continue;
    for (const std::string& line : read_lines(e.path())) {
      std::smatch m;
      if (std::regex_search(line, m, ifdef)) tested.insert(m[1]);
    }
  }
  EXPECT_EQ(documented, tested);
}

// No file of src but the knob parser reads the environment.
TEST(Knobs, OnlyTheParserReadsTheEnvironment) {
  std::set<std::string> readers;
  for (const auto& e : fs::recursive_directory_iterator(repo_root() / "src")) {
    if (!e.is_regular_file()) continue;
    std::ifstream in(e.path());
    std::stringstream text;
    text << in.rdbuf();
    if (text.str().find("getenv") != std::string::npos)
      readers.insert(fs::relative(e.path(), repo_root()).generic_string());
  }
  EXPECT_EQ(readers, std::set<std::string>{"src/core/knobs.cpp"});
}

}  // namespace
}  // namespace msa_test
