// The attention entry of the CUDA backend: builds a plan's per-family state and routes each run
// to the Hopper prefill kernels when they apply; else a prefill with a KV-major path to the portable
// prefill (its KV-major kernel beside the paged kernel); else to the paged (sm_80+) family.
#include <string>

#include "core/knobs.h"
#include "cuda/decode/state.cuh"
#include "cuda/runtime/device_buffer.cuh"
#include "cuda/plan_state.h"
#include "msa/error.h"

namespace msa::detail::cuda {

std::shared_ptr<PlanState> make_plan_state(const Plan& plan) {
  auto s = std::make_shared<CudaPlanState>();
  s->device = plan.device().id;
  DeviceGuard guard(s->device);
  s->sm_count = sm_count(s->device);
  s->cc = compute_capability(s->device);
  MSA_CHECK(s->cc >= 80, kNotImplemented, "msa.plan: device ", device_name(plan.device()),
            " has compute capability ", s->cc / 10, ".", s->cc % 10, "; msa's kernels need 8.0 or newer");
  const bool prefill = plan.phase() == Phase::kPrefill;
  // MSA_PORTABLE_PREFILL (core/knobs.h) other than auto sends prefill plans to the portable family on
  // sm_90 too.
  const auto portable = prefill ? knobs::portable_prefill("msa.plan_prefill") : knobs::PortablePrefill::kAuto;
  if (prefill && s->cc == 90 && portable == knobs::PortablePrefill::kAuto)
    s->sm90_prefill = prefill_sm90::make_prefill_state(plan, *s);
  s->paged = decode::make_state(plan, *s);
  s->paged_fp8 = decode::make_fp8_dense_state(plan, *s, *s->paged);
  if (prefill && !s->sm90_prefill && portable != knobs::PortablePrefill::kQMajor)
    s->portable_prefill = prefill_portable::make_portable_state(plan, *s, *s->paged);
  return s;
}

std::string CudaPlanState::describe() const {
  // The Hopper prefill kernels first when they apply (a run with parameters they do not take falls
  // back to the paged family, listed after them).
  std::string out = "device=" + std::to_string(device) + " sm=" + std::to_string(cc);
  if (sm90_prefill) out += " " + prefill_sm90::describe(*sm90_prefill);
  if (portable_prefill) out += " " + prefill_portable::describe(*portable_prefill);
  if (paged) out += " " + decode::describe(*paged);
  if (paged_fp8)  // the state fp8 K/V take instead (decode/plan.cu, make_fp8_dense_state)
    out += " fp8_paged=token fp8_splits=" + std::to_string(paged_fp8->splits) +
           " fp8_cluster=" + std::to_string(paged_fp8->cluster_size);
  return out;
}

void attention(const Plan& plan, const AttentionParams& p, void* stream) {
  MSA_CHECK(plan.state() != nullptr, kValue, "msa.attention: argument 'plan': built for the CPU, given CUDA tensors");
  const auto& s = static_cast<const CudaPlanState&>(*plan.state());
  DeviceGuard guard(s.device);
  auto st = static_cast<cudaStream_t>(stream);
  if (s.sm90_prefill && prefill_sm90::can_run(*s.sm90_prefill, p)) {
    prefill_sm90::run_prefill(*s.sm90_prefill, plan, p, st);
    return;
  }
  if (s.portable_prefill && prefill_portable::can_run(*s.portable_prefill, p)) {
    prefill_portable::run_prefill(*s.portable_prefill, *s.paged, plan, p, st);
    return;
  }
  decode::run(p.kv_dtype == ScalarType::kF8E4M3 && s.paged_fp8 ? *s.paged_fp8 : *s.paged, plan, p, st);
}

}  // namespace msa::detail::cuda
