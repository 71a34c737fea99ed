"""msa.sglang (this module, msa.engines.sglang): the functions of sglang's MiniMax-M3 MSA module
(python/sglang/srt/layers/attention/minimax_sparse_ops/msa.py), with the same names and signatures,
served by msa on any sm_80+ GPU (Hopper included) instead of fmha_sm100 (Blackwell only):

    # from sglang.srt.layers.attention.minimax_sparse_ops.msa import (...)
    from msa.sglang import (MSAUnavailableError, msa_available, msa_sparse_prefill_main,
                            build_msa_decode_meta, build_msa_decode_cg_plan, update_msa_decode_cg_meta,
                            msa_sparse_decode_main)

Tensors are sglang's: q [T, Hq, D]; k_cache / v_cache the slot-major pool [max_slots, Hkv, D], read as
pages of block_size_k slots through a strided view (no copy); topk_idx [Hkv, T, topk] from the indexer,
read through a permuted view (no copy), rows in any order with -1 anywhere; req_to_token
[max_reqs, max_context] token slots; slot_ids [B] its rows of the batch; seq_lens [B] keys per request.

Decode is CUDA-graph safe, which fmha_sm100's is not: build_msa_decode_cg_plan depends on the batch size
only; update_msa_decode_cg_meta rewrites the plan's lengths and the page table in place with device ops
(no host sync; run it outside the graph, between replays); msa_sparse_decode_main only launches.
The page table lives in kv_indices_buf as B rows of max_pages = kv_indices_buf.numel() // B entries
(sglang sizes it batch_size * ceil(context_len / block_size_k)); the plan's kv_page_indptr points at
the rows. Decode key lengths must stay within the plan's max_kv_len, DECODE_MAX_KV_LEN = 2**20 tokens
(MiniMax-M3's context) unless build_msa_decode_cg_plan(max_kv_len=) says otherwise;
update_msa_decode_cg_meta refuses page-table rows that could hold longer requests.

Prefill reads the batch's lengths on the host once per call: msa plans the work over them.
K/V pools may be fp8 e4m3 (is_fp8=True, with k_scale / v_scale): the kernels convert their tiles exactly.
fp8 q raises MSAUnavailableError, on which sglang falls back to its Triton path.
"""
from __future__ import annotations

import functools
from typing import Optional

from .._framework import require_torch

torch = require_torch("msa.sglang", "serves sglang's MiniMax-M3 MSA functions on torch tensors")

from .. import torch_ops  # noqa: E402
from .._C import cuda_available  # noqa: E402
from ..plan import plan_prefill  # noqa: E402
from .fmha_sm100 import (DECODE_MAX_KV_LEN, _cpu_blocks_past_end_as_empty, _plan_dict, fmha_sm100,  # noqa: E402
                         fmha_sm100_decode_plan)

__all__ = [
    "MSAUnavailableError",
    "build_msa_decode_cg_plan",
    "build_msa_decode_meta",
    "build_page_table",
    "msa_available",
    "msa_sparse_decode_main",
    "msa_sparse_prefill_main",
    "update_msa_decode_cg_meta",
]

_SERVED_DTYPES = (torch.bfloat16, torch.float16)
_BLOCK = 128  # tokens per selectable block (and per page, as sglang pairs them)


class MSAUnavailableError(RuntimeError):
    """msa cannot serve this call (fp8 q, K/V of another dtype than q's or fp8, block_size_k other than 128);
    sglang's callers fall back to the Triton path on it."""


@functools.lru_cache(maxsize=1)
def msa_available() -> bool:
    """True when msa was built with its CUDA kernels and they run on the current GPU at compute capability
    >= 8.0 (msa.cuda_available)."""
    return torch.cuda.is_available() and cuda_available()


def _check_dtypes(fn: str, q, k_cache, v_cache) -> None:
    kv_ok = k_cache.dtype == v_cache.dtype and k_cache.dtype in (q.dtype, torch.float8_e4m3fn)
    if q.dtype not in _SERVED_DTYPES or not kv_ok:
        raise MSAUnavailableError(f"{fn}: msa serves bf16 or fp16 q with k_cache and v_cache both of q's dtype or "
                                  f"both float8_e4m3fn, got {q.dtype}, {k_cache.dtype} and {v_cache.dtype}")


def _check_block_size(fn: str, block_size_k: int) -> None:
    # sglang's topk_idx counts blocks of block_size_k tokens; msa's blocks are the contract's 128.
    if block_size_k != _BLOCK:
        raise MSAUnavailableError(f"{fn}: argument 'block_size_k': msa selects blocks of {_BLOCK} tokens, "
                                  f"got {block_size_k}")


def _paged(fn: str, cache: torch.Tensor, page_size: int) -> torch.Tensor:
    """The slot-major pool [max_slots, Hkv, D] as pages [max_slots / page_size, Hkv, page_size, D] (a view)."""
    _check_block_size(fn, page_size)
    max_slots, num_heads, dim = cache.shape
    if max_slots % page_size != 0:
        raise ValueError(f"{fn}: max_slots={max_slots} not divisible by page_size={page_size}")
    return cache.view(max_slots // page_size, page_size, num_heads, dim).permute(0, 2, 1, 3)


def _unit(scale) -> float:
    return 1.0 if scale is None else float(scale)


def build_page_table(req_to_token: torch.Tensor, slot_ids: torch.Tensor, seq_lens: torch.Tensor, page_size: int,
                     *, max_pages: Optional[int] = None, out: Optional[torch.Tensor] = None) -> torch.Tensor:
    """The requests' physical pages, int32 [B, max_pages]: row b holds req_to_token[slot_ids[b], p * page_size]
    // page_size for its pages p < ceil(seq_lens[b] / page_size) and -1 after them. One GPU kernel, no host
    sync (sglang's _build_page_table packs the rows and reads their total with .item()). max_pages
    defaults to ceil(req_to_token.shape[1] / page_size)."""
    return torch_ops.build_page_table(req_to_token, slot_ids, seq_lens, page_size, max_pages=max_pages, out=out)


def msa_sparse_prefill_main(
    q: torch.Tensor,  # [total_q, num_q_heads, head_dim]
    k_cache: torch.Tensor,  # [max_slots, num_kv_heads, head_dim] (slot-major)
    v_cache: torch.Tensor,  # [max_slots, num_kv_heads, head_dim]
    topk_idx: torch.Tensor,  # [num_kv_heads, total_q, topk], -1 for empty slots
    req_to_token: torch.Tensor,  # [max_reqs, max_context]
    slot_ids: torch.Tensor,  # [batch]
    cu_seqlens: torch.Tensor,  # [batch + 1] cumulative query lengths
    seq_lens: torch.Tensor,  # [batch] keys per request (prefix + chunk)
    prefix_lens: torch.Tensor,  # [batch] cached prefix per request: the chunk's first position
    block_size_k: int,  # page size == sparse block size (128 for M3)
    sm_scale: Optional[float] = None,
    q_scale: Optional[float] = None,
    k_scale: Optional[float] = None,
    v_scale: Optional[float] = None,
) -> torch.Tensor:
    """Causal sparse attention of a prefill (or extend) batch over the blocks of topk_idx. Reads the
    lengths on the host once (one wait on the device). The logit scale is sm_scale (default D ** -0.5)
    * q_scale * k_scale; v_scale scales the output. Returns o [total_q, num_q_heads, head_dim] in q's dtype."""
    fn = "msa.sglang.msa_sparse_prefill_main"
    _check_dtypes(fn, q, k_cache, v_cache)
    P = block_size_k
    k_paged, v_paged = _paged(fn, k_cache, P), _paged(fn, v_cache, P)
    B = seq_lens.shape[0]
    lengths = torch.cat([cu_seqlens.reshape(-1).to(torch.int64), seq_lens.to(torch.int64),
                         prefix_lens.to(torch.int64)]).tolist()
    cu, kv, prefix = lengths[:B + 1], lengths[B + 1:2 * B + 1], lengths[2 * B + 1:]
    plan = plan_prefill([cu[b + 1] - cu[b] for b in range(B)], kv, qo_offset=prefix, num_qo_heads=q.shape[1],
                        num_kv_heads=k_cache.shape[1], head_dim=q.shape[2], head_dim_v=v_cache.shape[2],
                        page_size=P, topk=topk_idx.shape[-1], causal=True, device=q.device)
    page_table = build_page_table(req_to_token, slot_ids, seq_lens, P, max_pages=max(-(-max(kv) // P), 1))
    scale = (q.shape[2] ** -0.5 if sm_scale is None else sm_scale) * _unit(q_scale) * _unit(k_scale)
    qo_indptr, kv_lens = cu_seqlens.to(torch.int32), seq_lens.to(torch.int32)
    block_idx = _cpu_blocks_past_end_as_empty(topk_idx.permute(1, 0, 2).to(torch.int32), qo_indptr, kv_lens)
    # v_scale goes to the kernel, which folds it into each row's normalization (o rounded once to q's dtype)
    return torch_ops.attention(plan, q, k_paged, v_paged, page_table, qo_indptr, kv_lens, block_idx=block_idx,
                               qo_offset=prefix_lens.to(torch.int32), sm_scale=scale, v_scale=_unit(v_scale))


def build_msa_decode_meta(
    k_cache: torch.Tensor,  # [max_slots, num_kv_heads, head_dim]
    req_to_token: torch.Tensor,
    slot_ids: torch.Tensor,  # [batch]
    seq_lens: torch.Tensor,  # [batch] cached keys per request
    num_q_heads: int,
    block_size_k: int,
    topk: int,
    is_fp8: bool = False,
):
    """(kv_indices, plan) for msa_sparse_decode_main, shared by the layers of one decode step: a decode
    plan bounded by req_to_token's context and the page table of the batch. No host sync."""
    fn = "msa.sglang.build_msa_decode_meta"
    max_slots, num_kv_heads, head_dim = k_cache.shape
    P = block_size_k
    if max_slots % P != 0:
        raise ValueError(f"{fn}: max_slots={max_slots} not divisible by page_size={P}")
    B = slot_ids.shape[0]
    max_pages = max(-(-req_to_token.shape[1] // P), 1)
    plan = build_msa_decode_cg_plan(num_q_heads, num_kv_heads, P, topk, B, device=seq_lens.device, is_fp8=is_fp8,
                                    max_kv_len=max_pages * P, head_dim=head_dim)
    kv_indices = torch.empty(B * max_pages, dtype=torch.int32, device=seq_lens.device)
    update_msa_decode_cg_meta(plan, kv_indices, req_to_token, slot_ids, seq_lens, P, topk, num_q_heads, num_kv_heads)
    return kv_indices, plan


def build_msa_decode_cg_plan(
    num_q_heads: int,
    num_kv_heads: int,
    block_size_k: int,
    topk: int,
    batch_size: int,
    device: Optional[torch.device] = None,
    is_fp8: bool = False,
    max_kv_len: int = DECODE_MAX_KV_LEN,
    head_dim: int = 128,
):
    """The persistent decode plan of one batch size (one query token per request): a CUDA graph that
    captures msa_sparse_decode_main with it replays correctly after every update_msa_decode_cg_meta.
    max_kv_len (msa extension) bounds the key lengths of every later step; head_dim (msa extension) is
    the D of q and k."""
    fn = "msa.sglang.build_msa_decode_cg_plan"
    _check_block_size(fn, block_size_k)  # is_fp8: accepted, a plan serves bf16 and fp8 pools alike
    return fmha_sm100_decode_plan(batch_size, num_q_heads, num_kv_heads, page_size=block_size_k, kv_block_num=topk,
                                  max_qo_len=1, max_kv_len=max_kv_len, causal=False, head_dim=head_dim,
                                  device=device)


def update_msa_decode_cg_meta(
    plan,
    kv_indices_buf: torch.Tensor,  # persistent page-table buffer [batch * max_pages]
    req_to_token: torch.Tensor,
    slot_ids: torch.Tensor,  # [batch]
    seq_lens: torch.Tensor,  # [batch] cached keys per request
    block_size_k: int,
    topk: int,
    num_q_heads: int,
    num_kv_heads: int,
):
    """Rewrites the plan's lengths and the page table in kv_indices_buf in place, with device ops only
    (no host sync): a graph captured with this plan and buffer reads the new values on replay.

    kv_indices_buf holds B rows of max_pages = numel // B pages; the plan's kv_page_indptr is set to
    b * max_pages. Padded requests (seq_len 0) see no key and return o = 0."""
    fn = "msa.sglang.update_msa_decode_cg_meta"
    info = _plan_dict(fn, plan)
    P = block_size_k
    B = seq_lens.shape[0]
    if B != plan[2]:  # 0 requests too: a plan has at least one (plan_decode refuses batch 0)
        raise ValueError(f"{fn}: argument 'seq_lens': expected the plan's batch size {plan[2]}, got {B} requests")
    max_pages = kv_indices_buf.numel() // B
    if max_pages == 0 or max_pages * P > info["max_kv_len"]:
        raise ValueError(f"{fn}: argument 'kv_indices_buf': expected 1..{info['max_kv_len'] // P} pages per request "
                         f"(the plan's max_kv_len = {info['max_kv_len']} keys), got {max_pages} "
                         f"({kv_indices_buf.numel()} entries for {B} requests); build the plan with a larger "
                         f"max_kv_len")
    build_page_table(req_to_token, slot_ids, seq_lens, P, out=kv_indices_buf[:B * max_pages].view(B, max_pages))
    info["kv_segment_lens"].copy_(seq_lens)
    torch.cumsum(seq_lens, 0, dtype=torch.int32, out=info["kv_segment_offsets"][1:])
    torch.arange(0, (B + 1) * max_pages, max_pages, dtype=torch.int32, out=info["kv_page_indptr"])
    info["qo_offset"].copy_(seq_lens - 1).clamp_min_(0)
    info["decode_page_rows"] = (kv_indices_buf, B, max_pages)


def _dense_page_rows(info: dict, kv_indices: torch.Tensor) -> Optional[torch.Tensor]:
    """kv_indices as the [B, max_pages] table update_msa_decode_cg_meta wrote into it (the rows its
    kv_page_indptr = b * max_pages points at), or None for any other buffer. The kernels read the two forms
    alike, but only the dense one names a request's page row before the PDL wait, so its lines are
    prefetched into the L2 with the index row's (docs/decode.md)."""
    rows = info.get("decode_page_rows")
    if rows is None or kv_indices is not rows[0]:  # identity, not data_ptr: torch.compile traces this
        return None
    B, max_pages = rows[1], rows[2]
    return kv_indices[:B * max_pages].view(B, max_pages)


def msa_sparse_decode_main(
    q: torch.Tensor,  # [batch, num_q_heads, head_dim] (one query token per request)
    k_cache: torch.Tensor,  # [max_slots, num_kv_heads, head_dim] (slot-major)
    v_cache: torch.Tensor,  # [max_slots, num_kv_heads, head_dim]
    topk_idx: torch.Tensor,  # [num_kv_heads, batch, topk], -1 for empty slots
    req_to_token: torch.Tensor,  # [max_reqs, max_context]
    slot_ids: torch.Tensor,  # [batch]
    seq_lens: torch.Tensor,  # [batch] cached keys per request
    block_size_k: int,  # page size == sparse block size (128 for M3)
    sm_scale: Optional[float] = None,
    kv_indices: Optional[torch.Tensor] = None,  # page table of update_msa_decode_cg_meta / build_msa_decode_meta
    plan=None,  # plan of build_msa_decode_cg_plan / build_msa_decode_meta
    q_scale: Optional[float] = None,
    k_scale: Optional[float] = None,
    v_scale: Optional[float] = None,
) -> torch.Tensor:
    """Sparse decode: each request's query sits at position seq_len - 1 and attends to the keys of its
    topk_idx blocks. With kv_indices and plan given it only launches (capturable in a CUDA graph);
    without them it builds both first (build_msa_decode_meta). Returns o [batch, num_q_heads, head_dim].

    kv_indices is read as update_msa_decode_cg_meta wrote it: B rows of max_pages entries (the dense form,
    whose page row the kernels prefetch before their PDL wait). A table packed another way, with
    plan_info["kv_page_indptr"] rewritten by the caller, goes to fmha_sm100(kv_indices=...) instead."""
    fn = "msa.sglang.msa_sparse_decode_main"
    _check_dtypes(fn, q, k_cache, v_cache)
    P = block_size_k
    k_paged, v_paged = _paged(fn, k_cache, P), _paged(fn, v_cache, P)
    if kv_indices is None or plan is None:
        kv_indices, plan = build_msa_decode_meta(k_cache, req_to_token, slot_ids, seq_lens, q.shape[1], P,
                                                 topk_idx.shape[-1])
    o, _ = fmha_sm100(q, k_paged, v_paged, plan, kv_indices=kv_indices,
                      kv_block_indexes=topk_idx.permute(1, 0, 2).to(torch.int32), sm_scale=sm_scale,
                      q_scale=q_scale, k_scale=k_scale, v_scale=v_scale,
                      page_table=_dense_page_rows(_plan_dict(fn, plan), kv_indices))
    return o
