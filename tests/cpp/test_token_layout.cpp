// The single-token kernel's fp8 merge buffer (token_config.h): its chunk swizzle keeps every shared-memory phase
// of the loop's merge free of bank conflicts. A warp's 16-byte accesses are served in phases of 8 threads, its
// 8-byte accesses in phases of 16; a phase is conflict-free when its threads meet distinct banks (32 banks of 4
// bytes). Buffer addresses: warp w's row r, chunk position p at byte w * 8192 + r * 512 + 16 p (+ 8 for the second
// half of a chunk).
#include <gtest/gtest.h>

#include <set>
#include <vector>

#include "cuda/decode/token_config.h"

namespace {

using msa::detail::cuda::decode::kTokenHeadDim;
using msa::detail::cuda::decode::kTokenRows;
using msa::detail::cuda::decode::token_fp8_merge_chunk;

constexpr int kChunks = kTokenHeadDim / 4;  // 16-byte chunks of a row of floats

int chunk_byte(int warp, int row, int chunk) {
  return warp * kTokenRows * kTokenHeadDim * 4 + row * kTokenHeadDim * 4 + 16 * token_fp8_merge_chunk(row, chunk);
}

// Whether the threads' accesses of `bytes` each (16 or 8) at these addresses meet every bank at most once.
bool conflict_free(const std::vector<int>& addresses, int bytes) {
  std::set<int> banks;
  for (const int a : addresses)
    for (int b = 0; b < bytes / 4; ++b)
      if (!banks.insert((a / 4 + b) % 32).second) return false;
  return true;
}

TEST(TokenFp8MergeLayout, EveryRowIsAPermutationOfItsChunks) {
  for (int r = 0; r < kTokenRows; ++r) {
    std::set<int> at;
    for (int c = 0; c < kChunks; ++c) {
      const int p = token_fp8_merge_chunk(r, c);
      EXPECT_GE(p, 0);
      EXPECT_LT(p, kChunks);
      at.insert(p);
    }
    EXPECT_EQ(static_cast<int>(at.size()), kChunks) << "row " << r;
  }
}

// The loop's writes: lane (g = lane / 4, t = lane % 4) stores chunk 8t + 4h + q of row g + 8j as one float4, one
// instruction per (j, h, q); a phase is lanes 8k .. 8k + 7 (rows 2k, 2k + 1).
TEST(TokenFp8MergeLayout, WritePhasesAreConflictFree) {
  for (int warp = 0; warp < 4; ++warp)
    for (int j = 0; j < 2; ++j)
      for (int h = 0; h < 2; ++h)
        for (int q = 0; q < 4; ++q)
          for (int phase = 0; phase < 4; ++phase) {
            std::vector<int> at;
            for (int lane = 8 * phase; lane < 8 * phase + 8; ++lane)
              at.push_back(chunk_byte(warp, lane / 4 + 8 * j, 8 * (lane % 4) + 4 * h + q));
            EXPECT_TRUE(conflict_free(at, 16)) << "warp " << warp << " j " << j << " h " << h << " q " << q;
          }
}

// The row runs (token_fp8_row_run): thread i reads chunk 4c + k (c = i % 8) of row i / 8 of every warp's rows as
// one float4 per (warp, k); a phase is one row's 8 threads.
TEST(TokenFp8MergeLayout, RowRunPhasesAreConflictFree) {
  for (int w = 0; w < 4; ++w)
    for (int k = 0; k < 4; ++k)
      for (int row = 0; row < kTokenRows; ++row) {
        std::vector<int> at;
        for (int c = 0; c < 8; ++c) at.push_back(chunk_byte(w, row, 4 * c + k));
        EXPECT_TRUE(conflict_free(at, 16)) << "warp " << w << " k " << k << " row " << row;
      }
}

// The read-back into the register layout (token_fp8_merged_fragments): lane (g, t) of warp `warp` reads half t % 2
// of chunk 8 warp + 2n + t / 2 of row g + 8j of every warp's rows as one float2; a phase is lanes 16k .. 16k + 15.
TEST(TokenFp8MergeLayout, FragmentReadPhasesAreConflictFree) {
  for (int warp = 0; warp < 4; ++warp)
    for (int w = 0; w < 4; ++w)
      for (int n = 0; n < 4; ++n)
        for (int j = 0; j < 2; ++j)
          for (int phase = 0; phase < 2; ++phase) {
            std::vector<int> at;
            for (int lane = 16 * phase; lane < 16 * phase + 16; ++lane) {
              const int t = lane % 4;
              at.push_back(chunk_byte(w, lane / 4 + 8 * j, 8 * warp + 2 * n + t / 2) + 8 * (t % 2));
            }
            EXPECT_TRUE(conflict_free(at, 8)) << "warp " << warp << " of warp " << w << " n " << n << " j " << j;
          }
}

}  // namespace
