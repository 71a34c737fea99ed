// The two backends behind the dispatch point. src/core/dispatch.cpp validates every call, turns
// TensorViews into the plain params of params.h and calls exactly one of these namespaces,
// chosen by the device of the tensors.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "core/params.h"
#include "msa/plan.h"

namespace msa::detail {

// Backend-owned plan state (work lists, workspaces). The CPU backend needs none.
struct PlanState {
  virtual ~PlanState() = default;
  virtual std::string describe() const = 0;  // Plan::describe() past "backend=..."
};

namespace reference {  // src/reference/: the contract, plainly written, threaded over (token, head)
void attention(const AttentionParams& p);
void block_scores(const BlockScoresParams& p);
void select_topk(const SelectTopkParams& p);
void merge_candidates(const MergeCandidatesParams& p);
void merge_states(const MergeParams& p);
void build_page_table(const PageTableBuildParams& p);
void write_cache(const WriteCacheParams& p);
}  // namespace reference

namespace cuda {  // src/cuda/: defined when built with CUDA, otherwise stubs (runtime/stub.cpp) that answer the
                  // queries with false / 0 and throw kNotImplemented from the rest
bool available();                // the kernels run on the current device at compute capability >= 8.0
bool compiled();                 // this build has the CUDA backend
int sm_count(int device);
int smem_optin(int device);      // shared memory a CTA may opt into, bytes
// The compute capability the kernels run as (major * 10 + minor): the device's, or the older arch of this
// binary's code for it (sm_80 PTX on an H200: 80); 0 where none of its code runs there.
int compute_capability(int device);
int current_compute_capability();  // of the current device
// Workspaces and work lists for a plan on a CUDA device; never synchronizes.
std::shared_ptr<PlanState> make_plan_state(const Plan& plan);
void attention(const Plan& plan, const AttentionParams& p, void* stream);
void block_scores(const BlockScoresParams& p, void* stream);
void select_topk(const SelectTopkParams& p, void* stream);
void merge_candidates(const MergeCandidatesParams& p, void* stream);
void merge_states(const MergeParams& p, void* stream);
void build_page_table(const PageTableBuildParams& p, void* stream);
void write_cache(const WriteCacheParams& p, void* stream);
// Deep validation helper: synchronous copy of device memory to the host.
void copy_to_host(void* dst, const void* src, size_t bytes, void* stream);
}  // namespace cuda

}  // namespace msa::detail
