// What a CUDA plan owns: the device facts it was built for and one state per kernel family.
#pragma once

#include <memory>
#include <string>

#include "core/backend.h"

namespace msa::detail::cuda {

namespace decode {
struct State;  // src/cuda/decode/: decode (sm_80+ general kernel, sm_90 token kernel) and the portable prefill
}
namespace prefill_sm90 {
struct PrefillState;  // src/cuda/prefill_sm90/: Hopper prefill (TMA + wgmma, sm_90a)
}
namespace prefill_portable {
struct PortableState;  // src/cuda/prefill_portable/: the KV-major path of the portable prefill (sm_80+)
}

struct CudaPlanState : PlanState {
  int device = 0;
  int sm_count = 0;
  int cc = 0;  // compute capability the kernels run as (compute_capability(): below the device's for older code)
  std::shared_ptr<decode::State> paged;
  // fp8 K/V of dense decode plans that `paged` runs on the general kernel: the single-token kernel in several
  // waves (decode/plan.cu, make_fp8_dense_state); null otherwise.
  std::shared_ptr<decode::State> paged_fp8;
  std::shared_ptr<prefill_sm90::PrefillState> sm90_prefill;  // null when the Hopper kernels do not apply
  // Prefill plans the Hopper kernels do not take: the KV-major path beside the paged kernel; null when the
  // plan has none (dense, G < 8, ...): the paged kernel serves the whole plan.
  std::shared_ptr<prefill_portable::PortableState> portable_prefill;
  std::string describe() const override;
};

// Kernel-family entry points (each defined in its folder).
namespace decode {
std::shared_ptr<State> make_state(const Plan& plan, const CudaPlanState& dev);
std::shared_ptr<State> make_fp8_dense_state(const Plan& plan, const CudaPlanState& dev, const State& paged);
// skip_items: prefill items the KV-major path computes (KernelParams::skip_items); null: none.
void run(const State& s, const Plan& plan, const AttentionParams& p, cudaStream_t stream,
         const int32_t* skip_items = nullptr);
std::string describe(const State& s);  // "paged=token splits=.. merge=.." / "paged=general rows=.. .."
}  // namespace decode
namespace prefill_sm90 {
// Null when this plan is not served by the Hopper prefill kernels (arch, head dim, dtype...).
std::shared_ptr<PrefillState> make_prefill_state(const Plan& plan, const CudaPlanState& dev);
// False when these particular params fall back to the paged family (e.g. an unsupported dtype).
bool can_run(const PrefillState& s, const AttentionParams& p);
void run_prefill(const PrefillState& s, const Plan& plan, const AttentionParams& p, cudaStream_t stream);
std::string describe(const PrefillState& s);  // "sm90=prefill kvmajor=never|always|wide-union .."
}  // namespace prefill_sm90
namespace prefill_portable {
// Null when the plan has no KV-major path on this device (arch, head dim, group, top-k, the paged
// state's tiles...). `paged` is the plan's paged state (its tiles are the ones the path takes over).
std::shared_ptr<PortableState> make_portable_state(const Plan& plan, const CudaPlanState& dev,
                                                   const decode::State& paged);
// False when these particular params run on the paged kernel alone (e.g. unaligned strides).
bool can_run(const PortableState& s, const AttentionParams& p);
// The whole prefill: the tile lists, the paged kernel on the query-major tiles, the KV-major chain.
void run_prefill(const PortableState& s, const decode::State& paged, const Plan& plan, const AttentionParams& p,
                 cudaStream_t stream);
std::string describe(const PortableState& s);  // "portable=prefill kvmajor=always|wide-union tiles=.. windows=.. .."
}  // namespace prefill_portable

}  // namespace msa::detail::cuda
