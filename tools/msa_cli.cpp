// `msa`: the command-line tool of the msa library. Subcommands: demo.
#include <cstdio>
#include <cstring>
#include <string_view>

#include "demo.h"

#ifndef MSA_VERSION_STRING
#error "MSA_VERSION_STRING is set by CMakeLists.txt from the project version"
#endif

namespace {

void print_usage(std::FILE* f) {
  std::fprintf(f,
               "usage: msa <command> [options]\n"
               "       msa --help | --version\n"
               "\n"
               "msa: MiniMax-M3-style block-sparse attention (CUDA kernels and a CPU reference).\n"
               "\n"
               "commands:\n"
               "  demo    run one MiniMax-M3 sparse attention layer (a chunked-prefill step and a decode\n"
               "          batch) on synthetic data on the best backend present, check it against float64\n"
               "          and print the times (msa demo --help for its options)\n");
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    print_usage(stderr);
    return 2;
  }
  const std::string_view cmd = argv[1];
  if (cmd == "-h" || cmd == "--help" || cmd == "help") {
    print_usage(stdout);
    return 0;
  }
  if (cmd == "--version") {
#ifdef MSA_WITH_CUDA
    std::printf("msa %s (CUDA backend built in)\n", MSA_VERSION_STRING);
#else
    std::printf("msa %s (CPU reference backend only)\n", MSA_VERSION_STRING);
#endif
    return 0;
  }
  if (cmd == "demo") return msa::cli::demo_main(argc - 2, argv + 2);
  std::fprintf(stderr, "msa: unknown command '%s'\nTry 'msa --help'.\n", argv[1]);
  return 2;
}
