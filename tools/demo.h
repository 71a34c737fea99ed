// `msa demo`: one MiniMax-M3 sparse attention layer on synthetic data (a chunked-prefill step and a
// decode batch) on the best backend present, each checked against float64.
#pragma once

namespace msa::cli {

// argv[0] is the first option after "demo". Returns the exit status: 0 when every check passes,
// 1 when a check fails or a run raises an error, 2 for bad options.
int demo_main(int argc, char** argv);

}  // namespace msa::cli
