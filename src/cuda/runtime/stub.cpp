// The CUDA backend of a build without nvcc: every entry says so.
#include "core/backend.h"
#include "msa/error.h"

namespace msa::detail::cuda {

namespace {
[[noreturn]] void no_cuda() {
  MSA_FAIL(kNotImplemented, "msa: this build has no CUDA backend (rebuild with nvcc on the PATH)");
}
}  // namespace

bool available() { return false; }
bool compiled() { return false; }
int sm_count(int) { return 0; }
int smem_optin(int) { return 0; }
int compute_capability(int) { return 0; }
int current_compute_capability() { return 0; }
std::shared_ptr<PlanState> make_plan_state(const Plan&) { no_cuda(); }
void attention(const Plan&, const AttentionParams&, void*) { no_cuda(); }
void block_scores(const BlockScoresParams&, void*) { no_cuda(); }
void select_topk(const SelectTopkParams&, void*) { no_cuda(); }
void merge_candidates(const MergeCandidatesParams&, void*) { no_cuda(); }
void merge_states(const MergeParams&, void*) { no_cuda(); }
void build_page_table(const PageTableBuildParams&, void*) { no_cuda(); }
void write_cache(const WriteCacheParams&, void*) { no_cuda(); }
void copy_to_host(void*, const void*, size_t, void*) { no_cuda(); }

}  // namespace msa::detail::cuda
