"""msa's entry points as torch custom ops, so that torch.compile traces through them and CUDA graphs
capture them.

    import msa, msa.torch_ops as mt
    plan = mt.PlanHandle(msa.plan_decode(...))        # keep it alive as long as the plan is used
    o = mt.attention(plan, q, k_cache, v_cache, page_table, qo_indptr, kv_lens, block_idx=block_idx)

Ops (namespace `msa`, every one writes its outputs in place and returns nothing; fake implementations
let FakeTensor / torch.compile propagate through them):

    torch.ops.msa.attention(plan: int, q, k_cache, v_cache, page_table, qo_indptr, kv_lens, block_idx?,
                            qo_offset?, page_indptr?, out!, lse!?, sm_scale: float?, validate: bool,
                            q_scale: float = 1.0, k_scale: float = 1.0, v_scale: float = 1.0)
    torch.ops.msa.block_scores(q, k_index, k_scale?, page_table, page_indptr?, qo_indptr, kv_lens, qo_offset?,
                               out!, layout: str, causal: bool, validate: bool)
    torch.ops.msa.select_topk(scores, qo_indptr, kv_lens, topk: int, qo_offset?, layout: str, force_begin: int,
                              force_end: int, causal: bool, out!, validate: bool, finite_only: bool, block_map?,
                              out_scores!?)
    torch.ops.msa.merge_candidates(cand_scores, cand_ids, qo_indptr, kv_lens, qo_offset?, max_blocks: int,
                                   topk: int, force_begin: int, force_end: int, causal: bool, out!, validate: bool)
    torch.ops.msa.build_page_table(req_to_token, req_pool_indices, seq_lens, page_size: int, out!)
    torch.ops.msa.merge_states(v_parts, lse_parts, out!, lse_out!?)

An op's schema cannot hold an msa.Plan, so plans travel as int handles: PlanHandle(plan) registers a
plan and unregisters it when the PlanHandle is collected.

The functions of this module (attention, block_scores, ...) take the arguments of their msa namesakes
(docs/python_api.md) minus `stream` (always torch's current stream) and build_page_table's `validate`,
and allocate missing outputs with torch. They call the op while torch.compile traces and for tensor
subclasses (FakeTensor, functional tensors); for plain tensors in eager mode (CUDA-graph capture
included) they call msa directly, which skips the dispatcher's round trip into Python (~10 us per call
of host time).
"""
import itertools
import math
from typing import Optional

from ._framework import require_torch

torch = require_torch("msa.torch_ops", "registers msa's entry points as torch custom ops")

from . import ops as _msa  # noqa: E402
from ._args import real, topk_value  # noqa: E402
from .plan import Plan  # noqa: E402

_plans: dict[int, Plan] = {}
_handles = itertools.count(1)


class PlanHandle:
    """An msa.Plan registered for the torch ops, which name plans by int handle. The registration
    lasts as long as this object: keep it wherever the plan is kept (fmha_sm100 plans keep theirs)."""

    __slots__ = ("plan", "handle")

    def __init__(self, plan: Plan):
        if not isinstance(plan, Plan):
            raise TypeError(f"msa.torch_ops.PlanHandle: argument 'plan': expected an msa.Plan, "
                            f"got {type(plan).__name__}")
        self.plan = plan
        self.handle = next(_handles)
        _plans[self.handle] = plan

    def __del__(self):
        registry = _plans  # None once the module is torn down at interpreter exit
        if registry is not None:
            registry.pop(self.handle, None)

    def __repr__(self):
        return f"msa.torch_ops.PlanHandle({self.handle}, {self.plan!r})"


def _plan_object(fn: str, plan) -> Plan:
    if isinstance(plan, PlanHandle):
        return plan.plan
    if isinstance(plan, Plan):
        return plan
    if isinstance(plan, int) and not isinstance(plan, bool):
        found = _plans.get(plan)
        if found is None:
            raise ValueError(f"{fn}: argument 'plan': no live plan has handle {plan} (its PlanHandle was "
                             f"collected, or the handle never came from msa.torch_ops.PlanHandle)")
        return found
    raise TypeError(f"{fn}: argument 'plan': expected an msa.Plan, an msa.torch_ops.PlanHandle or its int "
                    f"handle, got {type(plan).__name__}")


def _plan_handle(fn: str, plan) -> int:
    if isinstance(plan, PlanHandle):
        return plan.handle
    if isinstance(plan, int) and not isinstance(plan, bool):
        return plan
    raise TypeError(f"{fn}: argument 'plan': when tracing (torch.compile, FakeTensor) pass an "
                    f"msa.torch_ops.PlanHandle or its int handle, got {type(plan).__name__}; wrap the plan "
                    f"outside the traced region and keep the PlanHandle alive")


# ---------------------------------------------------------------------------------------------------
# The ops. The real implementations call msa on torch's current stream; the fake ones return nothing,
# since every output is an argument whose shape the caller has already fixed.
# ---------------------------------------------------------------------------------------------------

@torch.library.custom_op("msa::attention", mutates_args=("out", "lse"))
def _attention_op(plan: int, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                  page_table: torch.Tensor, qo_indptr: torch.Tensor, kv_lens: torch.Tensor,
                  block_idx: Optional[torch.Tensor], qo_offset: Optional[torch.Tensor],
                  page_indptr: Optional[torch.Tensor], out: torch.Tensor, lse: Optional[torch.Tensor],
                  sm_scale: Optional[float], validate: bool, q_scale: float = 1.0, k_scale: float = 1.0,
                  v_scale: float = 1.0) -> None:
    _msa.attention(_plan_object("msa::attention", plan), q, k_cache, v_cache, page_table, qo_indptr, kv_lens,
                   block_idx=block_idx, qo_offset=qo_offset, page_indptr=page_indptr, out=out, lse=lse,
                   sm_scale=sm_scale, q_scale=q_scale, k_scale=k_scale, v_scale=v_scale, validate=validate)


@_attention_op.register_fake
def _(plan, q, k_cache, v_cache, page_table, qo_indptr, kv_lens, block_idx, qo_offset, page_indptr, out, lse,
      sm_scale, validate, q_scale=1.0, k_scale=1.0, v_scale=1.0):
    return None


@torch.library.custom_op("msa::block_scores", mutates_args=("out",))
def _block_scores_op(q: torch.Tensor, k_index: torch.Tensor, k_scale: Optional[torch.Tensor],
                     page_table: torch.Tensor, page_indptr: Optional[torch.Tensor], qo_indptr: torch.Tensor,
                     kv_lens: torch.Tensor, qo_offset: Optional[torch.Tensor], out: torch.Tensor, layout: str,
                     causal: bool, validate: bool) -> None:
    _msa.block_scores(q, k_index, page_table, qo_indptr, kv_lens, qo_offset=qo_offset, page_indptr=page_indptr,
                      k_scale=k_scale, layout=layout, causal=causal, out=out, validate=validate)


@_block_scores_op.register_fake
def _(q, k_index, k_scale, page_table, page_indptr, qo_indptr, kv_lens, qo_offset, out, layout, causal, validate):
    return None


@torch.library.custom_op("msa::select_topk", mutates_args=("out", "out_scores"))
def _select_topk_op(scores: torch.Tensor, qo_indptr: torch.Tensor, kv_lens: torch.Tensor, topk: int,
                    qo_offset: Optional[torch.Tensor], layout: str, force_begin: int, force_end: int, causal: bool,
                    out: torch.Tensor, validate: bool, finite_only: bool, block_map: Optional[torch.Tensor],
                    out_scores: Optional[torch.Tensor]) -> None:
    # No defaults: a call normalized by the dispatcher drops trailing default arguments, and the ADInplaceOrView
    # kernel then indexes the mutated out_scores past the arguments (torch 2.11).
    _msa.select_topk(scores, qo_indptr, kv_lens, topk, qo_offset=qo_offset, layout=layout, force_begin=force_begin,
                     force_end=force_end, causal=causal, finite_only=finite_only, block_map=block_map, out=out,
                     out_scores=out_scores, validate=validate)


@_select_topk_op.register_fake
def _(scores, qo_indptr, kv_lens, topk, qo_offset, layout, force_begin, force_end, causal, out, validate,
      finite_only, block_map, out_scores):
    return None


@torch.library.custom_op("msa::merge_candidates", mutates_args=("out",))
def _merge_candidates_op(cand_scores: torch.Tensor, cand_ids: torch.Tensor, qo_indptr: torch.Tensor,
                         kv_lens: torch.Tensor, qo_offset: Optional[torch.Tensor], max_blocks: int, topk: int,
                         force_begin: int, force_end: int, causal: bool, out: torch.Tensor, validate: bool) -> None:
    _msa.merge_candidates(cand_scores, cand_ids, qo_indptr, kv_lens, topk, max_blocks, qo_offset=qo_offset,
                          force_begin=force_begin, force_end=force_end, causal=causal, out=out, validate=validate)


@_merge_candidates_op.register_fake
def _(cand_scores, cand_ids, qo_indptr, kv_lens, qo_offset, max_blocks, topk, force_begin, force_end, causal, out,
      validate):
    return None


@torch.library.custom_op("msa::build_page_table", mutates_args=("out",))
def _build_page_table_op(req_to_token: torch.Tensor, req_pool_indices: torch.Tensor, seq_lens: torch.Tensor,
                         page_size: int, out: torch.Tensor) -> None:
    _msa.build_page_table(req_to_token, req_pool_indices, seq_lens, page_size, out=out)


@_build_page_table_op.register_fake
def _(req_to_token, req_pool_indices, seq_lens, page_size, out):
    return None


@torch.library.custom_op("msa::merge_states", mutates_args=("out", "lse_out"))
def _merge_states_op(v_parts: torch.Tensor, lse_parts: torch.Tensor, out: torch.Tensor,
                     lse_out: Optional[torch.Tensor]) -> None:
    _msa.merge_states(v_parts, lse_parts, out=out, lse_out=lse_out)


@_merge_states_op.register_fake
def _(v_parts, lse_parts, out, lse_out):
    return None


# ---------------------------------------------------------------------------------------------------
# The functions: msa's signatures, torch allocation, the op when tracing and msa directly otherwise.
# ---------------------------------------------------------------------------------------------------

def _direct(t: torch.Tensor) -> bool:
    """Whether a call on `t` may skip the op: eager mode and a plain tensor (not a FakeTensor, functional
    tensor or other subclass that a tracer must see)."""
    return not torch.compiler.is_compiling() and type(t) is torch.Tensor


def attention(plan, q, k_cache, v_cache, page_table, qo_indptr, kv_lens, *, block_idx=None, qo_offset=None,
              page_indptr=None, out=None, lse=None, return_lse=False, sm_scale=None, q_scale=1.0, k_scale=1.0,
              v_scale=1.0, validate=False):
    """msa.attention (docs/python_api.md) for torch tensors; plan: msa.Plan (eager only), PlanHandle or its
    int handle. out defaults to [q.shape[0], q.shape[1], v_cache.shape[-1]] in q's dtype."""
    fn = "msa.torch_ops.attention"
    if out is None:
        out = q.new_empty((q.shape[0], q.shape[1], v_cache.shape[-1]))
    if lse is None and return_lse:
        lse = q.new_empty((q.shape[0], q.shape[1]), dtype=torch.float32)
    if not _direct(q):
        torch.ops.msa.attention(_plan_handle(fn, plan), q, k_cache, v_cache, page_table, qo_indptr, kv_lens, block_idx,
                                qo_offset, page_indptr, out, lse, sm_scale, validate, real(fn, "q_scale", q_scale),
                                real(fn, "k_scale", k_scale), real(fn, "v_scale", v_scale))
    else:
        _msa.attention(_plan_object(fn, plan), q, k_cache, v_cache, page_table, qo_indptr,
                       kv_lens, block_idx=block_idx, qo_offset=qo_offset, page_indptr=page_indptr, out=out, lse=lse,
                       sm_scale=sm_scale, q_scale=q_scale, k_scale=k_scale, v_scale=v_scale, validate=validate)
    return (out, lse) if return_lse else out


def block_scores(q, k_index, page_table, qo_indptr, kv_lens, *, qo_offset=None, page_indptr=None, k_scale=None,
                 max_blocks=None, layout="HKT", causal=True, out=None, validate=False):
    """msa.block_scores for torch tensors. Under torch.compile, out or max_blocks is required (the default
    extent reads kv_lens on the host)."""
    fn = "msa.torch_ops.block_scores"
    if out is None:
        if max_blocks is None:
            if not _direct(q):
                raise ValueError(f"{fn}: pass max_blocks= or out= when tracing (the default extent "
                                 f"ceil(max(kv_lens) / 128) reads kv_lens on the host)")
            max_blocks = math.ceil(int(kv_lens.max()) / _msa.BLOCK) if kv_lens.numel() else 0
        T, H = q.shape[0], q.shape[1]
        shape = (H, max_blocks, T) if layout == "HKT" else (T, H, max_blocks)
        out = q.new_empty(shape, dtype=torch.float32)
    if not _direct(q):
        torch.ops.msa.block_scores(q, k_index, k_scale, page_table, page_indptr, qo_indptr, kv_lens, qo_offset, out,
                                   layout, causal, validate)
    else:
        _msa.block_scores(q, k_index, page_table, qo_indptr, kv_lens, qo_offset=qo_offset, page_indptr=page_indptr,
                          k_scale=k_scale, layout=layout, causal=causal, out=out, validate=validate)
    return out


def select_topk(scores, qo_indptr, kv_lens, topk, *, qo_offset=None, layout="HKT", force_begin=0, force_end=1,
                causal=True, finite_only=False, block_map=None, out=None, out_scores=None, return_scores=False,
                validate=False):
    """msa.select_topk for torch tensors."""
    topk = topk_value("msa.torch_ops.select_topk", topk)  # checked before the outputs are allocated
    if out is None or (out_scores is None and return_scores):
        T, H = (scores.shape[2], scores.shape[0]) if layout == "HKT" else (scores.shape[0], scores.shape[1])
        if out is None:
            out = scores.new_empty((T, H, topk), dtype=torch.int32)
        if out_scores is None and return_scores:
            out_scores = scores.new_empty((T, H, topk))
    if not _direct(scores):
        torch.ops.msa.select_topk(scores, qo_indptr, kv_lens, topk, qo_offset, layout, force_begin, force_end, causal,
                                  out, validate, finite_only, block_map, out_scores)
    else:
        _msa.select_topk(scores, qo_indptr, kv_lens, topk, qo_offset=qo_offset, layout=layout,
                         force_begin=force_begin, force_end=force_end, causal=causal, finite_only=finite_only,
                         block_map=block_map, out=out, out_scores=out_scores, validate=validate)
    return (out, out_scores) if return_scores else out


def merge_candidates(cand_scores, cand_ids, qo_indptr, kv_lens, topk, max_blocks, *, qo_offset=None, force_begin=0,
                     force_end=1, causal=True, out=None, validate=False):
    """msa.merge_candidates for torch tensors."""
    topk = topk_value("msa.torch_ops.merge_candidates", topk)  # checked before the output is allocated
    if out is None:
        out = cand_scores.new_empty((cand_scores.shape[1], cand_scores.shape[2], topk), dtype=torch.int32)
    if not _direct(cand_scores):
        torch.ops.msa.merge_candidates(cand_scores, cand_ids, qo_indptr, kv_lens, qo_offset, max_blocks, topk,
                                       force_begin, force_end, causal, out, validate)
    else:
        _msa.merge_candidates(cand_scores, cand_ids, qo_indptr, kv_lens, topk, max_blocks, qo_offset=qo_offset,
                              force_begin=force_begin, force_end=force_end, causal=causal, out=out,
                              validate=validate)
    return out


def build_page_table(req_to_token, req_pool_indices, seq_lens, page_size, *, max_pages=None, out=None):
    """msa.build_page_table for torch tensors (max_pages defaults to ceil(req_to_token.shape[1] / page_size))."""
    if out is None:
        if max_pages is None:
            max_pages = -(-req_to_token.shape[1] // page_size)
        out = req_to_token.new_empty((req_pool_indices.shape[0], max_pages), dtype=torch.int32)
    if not _direct(req_to_token):
        torch.ops.msa.build_page_table(req_to_token, req_pool_indices, seq_lens, page_size, out)
    else:
        _msa.build_page_table(req_to_token, req_pool_indices, seq_lens, page_size, out=out)
    return out


def merge_states(v_parts, lse_parts, *, out=None, lse_out=None, return_lse=False):
    """msa.merge_states for torch tensors."""
    if out is None:
        out = v_parts.new_empty(v_parts.shape[1:])
    if lse_out is None and return_lse:
        lse_out = lse_parts.new_empty(lse_parts.shape[1:])
    if not _direct(v_parts):
        torch.ops.msa.merge_states(v_parts, lse_parts, out, lse_out)
    else:
        _msa.merge_states(v_parts, lse_parts, out=out, lse_out=lse_out)
    return (out, lse_out) if return_lse else out
