// The top-k block selections of the demo (spec/benchmarks.md "Selection patterns"): every row holds
// the query's own block; the other slots follow the pattern among earlier blocks; rows come
// shuffled, with -1 in the slots left over when fewer blocks than top-k are valid.
#pragma once

#include <cstdint>

#include "demo_options.h"

namespace msa::cli {

// Fills row[0, topk) for a query at absolute position `pos` (its own block is pos / block_size).
// row_key seeds the draws of this (token, KV head); block_key those shared by every token of the
// (request, 128-token query block, KV head): the candidates of clustered, the selection of shared.
// Keys rather than one running generator: a row does not depend on the order rows are made in.
void select_blocks(Pattern pattern, int64_t pos, int block_size, int topk, uint64_t row_key, uint64_t block_key,
                   int32_t* row);

}  // namespace msa::cli
