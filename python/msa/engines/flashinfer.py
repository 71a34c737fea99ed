"""msa.flashinfer (this module, msa.engines.flashinfer): FlashInfer's MiniMax sparse-attention ops
(flashinfer.msa_ops, the SM90 surface that vLLM's MiniMax-M3 backend calls) served by msa, on any sm_80+ GPU
and on msa's CPU reference backend. Needs torch.

    # from flashinfer.msa_ops import (msa_proxy_score, msa_topk_select, msa_sparse_attention,
    #                                 msa_sparse_decode_attention)
    from msa.flashinfer import (msa_proxy_score, msa_topk_select, msa_sparse_attention,
                                msa_sparse_decode_attention, preload_sm90_programs)

The entry points take FlashInfer's argument names, defaults, shapes and dtypes and return the same values:

    msa_proxy_score        per-128-key-block max of the raw q.k, -inf where a block has no visible key,
                           float32 (Hq, max_k_tiles, total_q), or (1, ...) with reduce_heads  -> msa.block_scores
    msa_topk_select        (total_q, Hq, topk) int32, ascending, -1 tail; per-token num_valid_pages; forced
                           begin / end blocks; non-finite scores are never picked (forced blocks excepted)
                                                                                            -> msa.select_topk
    msa_sparse_attention   prefill over q2k_indices (Hkv, total_q, topk)                    -> msa.attention
    msa_sparse_decode_attention  decode and MTP: seqlen_q tokens per request, right-aligned at
                           seqused_k - seqlen_q + i                                         -> msa.attention
    preload_sm90_programs  accepted for compatibility; msa has no JIT programs to load (returns zeros)

Plans. A FlashInfer call carries no plan; msa builds one from the call's metadata:
  * Decode: a decode plan (msa.plan_decode) per (device, batch size, seqlen_q <= 16, max_pages, heads,
    head dims, topk, causal), cached by the module; its key lengths are bounded by page_table.shape[1] * 128
    (flat K/V: k.shape[0]), so no length is read on the host and the call is CUDA-graph capturable with
    seqused_k changing between replays. As with FlashInfer's SM90 decode, the first call of a geometry must
    run eagerly (it builds the plan; capturing it first raises RuntimeError).
  * Prefill (msa_sparse_attention, and decode with seqlen_q > 16): msa plans the work over the host lengths,
    so the call reads cu_seqlens_q, seqused_k / cu_seqlens_k and q_offset on the host once (one wait on the
    device) and is not capturable. vLLM runs prefill eagerly.
  * msa_proxy_score reads seqused_k (or cu_seqlens_k) on the host only when max_k_tiles and output are both
    missing (as FlashInfer does); msa_topk_select never does.

K/V. Paged: (num_pages, Hkv, 128, D) with page_table (batch, max_pages) and seqused_k; K and V may be the
halves of vLLM's interleaved pool (k = pool[..., :D], v = pool[..., D:]) or two separate pools, any strides
with the innermost dim contiguous. Flat: (total_k, Hkv, D) with cu_seqlens_k, read as pages of one token.

Where msa goes further than FlashInfer's SM90 surface (same calls):
  * bf16 K/V as well as fp8 e4m3 (fp8 is converted exactly in the kernels); separate K and V pools.
  * fp16 q (and fp32 on the CPU); fp8 q is converted to bf16 (exact) before the call.
  * Any topk in msa_topk_select (1..64 on the GPU) and the attentions (up to 8192 on the GPU); any GQA group (up to
    128 query heads per KV head on the GPU); attention head_dim 64, 128 or 256 (msa_proxy_score: 128 on the GPU).
  * causal=False; q_offset for decode; return_softmax_lse (natural log, -inf for rows that see no key)
    and lse_out; msa_proxy_score with several index heads, bf16 index keys in prefill, flat index keys.
  * k_global_scale multiplies the logits and v_global_scale the output, for K/V of any dtype (msa's k_scale /
    v_scale); softmax_scale defaults to head_dim ** -0.5.
  * q2k_indices rows may hold their blocks in any order and -1 anywhere; on CPU tensors entries past a
    request's blocks are cleared to -1 first (the GPU kernels read them as empty slots), and int64 indices and
    lengths are converted to int32.
Not served (NotImplementedError): packed NVFP4 K/V (uint8) and their k_scale / v_scale block-scale tensors,
return_temperature_lse. Accepted with no effect: max_seqlen_q, use_fp32_acc (msa accumulates in fp32),
partial_dtype, force_fused, workspace (msa picks its kernels and owns its workspaces).
"""
from __future__ import annotations

import threading
from typing import Iterable, Optional, Union

from .._framework import require_torch

torch = require_torch("msa.flashinfer", "serves FlashInfer's msa_ops API on torch tensors")

from .. import torch_ops  # noqa: E402
from ..plan import plan_decode, plan_prefill  # noqa: E402
from .fmha_sm100 import _cpu_blocks_past_end_as_empty  # noqa: E402

__all__ = [
    "msa_proxy_score",
    "msa_sparse_attention",
    "msa_sparse_decode_attention",
    "msa_topk_select",
    "preload_sm90_programs",
]

BLOCK = 128  # keys per proxy-score tile, per selectable block and per FlashInfer page
DECODE_MAX_SEQLEN_Q = 16  # msa.plan_decode's bound on query tokens per request
_PROGRAM_KINDS = ("sparse_decode", "proxy_decode", "proxy_prefill", "topk_select", "sparse_prefill")

_decode_plans: dict = {}
_decode_plans_lock = threading.Lock()
_constants: dict = {}  # msa_topk_select's per-shape device constants (_constant)
_MAX_CONSTANTS = 64


def _name(fn: str) -> str:
    return f"msa.flashinfer.{fn}"


def _int32(fn: str, name: str, t: torch.Tensor, ndim: int) -> torch.Tensor:
    """t as int32 (a no-op when it already is; int64 is converted on its device)."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{fn}: argument '{name}': expected a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"{fn}: argument '{name}': expected int32 (or int64), got {t.dtype}")
    if t.dim() != ndim:
        raise ValueError(f"{fn}: argument '{name}': expected a {ndim}-D tensor, got shape {tuple(t.shape)}")
    return t if t.dtype == torch.int32 else t.to(torch.int32)


def _compute_q(q: torch.Tensor) -> torch.Tensor:
    """fp8 q as bf16 (every e4m3 value is a bf16 value, so exact); other dtypes as given."""
    return q.to(torch.bfloat16) if q.dtype == torch.float8_e4m3fn else q


def _refuse_nvfp4(fn: str, k: torch.Tensor, k_scale, v_scale) -> None:
    if k.dtype == torch.uint8:
        raise NotImplementedError(f"{fn}: argument 'k': packed NVFP4 K/V (uint8) is not served by msa; "
                                  f"use bf16 or float8_e4m3fn caches")
    for name, s in (("k_scale", k_scale), ("v_scale", v_scale)):
        if s is not None:
            raise NotImplementedError(f"{fn}: argument '{name}': NVFP4 block scales are not served by msa; for "
                                      f"per-tensor fp8 scales pass k_global_scale / v_global_scale")


def _scale(fn: str, name: str, value) -> float:
    return 1.0 if value is None else float(value)


def _q_offset(fn: str, q_offset, batch: int, device) -> Optional[torch.Tensor]:
    """FlashInfer's q_offset (None, an int for every request, or a [batch] tensor) as msa's int32 [batch]."""
    if q_offset is None:
        return None
    if isinstance(q_offset, bool):
        raise TypeError(f"{fn}: argument 'q_offset': expected None, an int or an int32 tensor, got bool")
    if isinstance(q_offset, int):
        return torch.full((batch,), q_offset, dtype=torch.int32, device=device)
    t = _int32(fn, "q_offset", q_offset, 1)
    if t.shape[0] != batch:
        raise ValueError(f"{fn}: argument 'q_offset': expected {batch} entries (one per request), got {t.shape[0]}")
    return t


class _KV:
    """The K/V layout of a call in msa's terms: paged views, the page table and the per-request key lengths."""

    def __init__(self, fn: str, k: torch.Tensor, v: Optional[torch.Tensor], page_table, seqused_k, cu_seqlens_k):
        if page_table is not None:
            if seqused_k is None:
                raise ValueError(f"{fn}: argument 'seqused_k': required with page_table (paged K/V)")
            if k.dim() != 4 or k.shape[2] != BLOCK:
                raise ValueError(f"{fn}: argument 'k': paged K/V must be (num_pages, num_kv_heads, {BLOCK}, "
                                 f"head_dim), got {tuple(k.shape)}")
            self.page_table = _int32(fn, "page_table", page_table, 2)
            self.kv_lens = _int32(fn, "seqused_k", seqused_k, 1)
            if self.page_table.shape[0] != self.kv_lens.shape[0]:
                raise ValueError(f"{fn}: argument 'page_table': expected {self.kv_lens.shape[0]} rows (one per "
                                 f"request of seqused_k), got {self.page_table.shape[0]}")
            self.page_indptr = None
            self.k, self.v, self.page_size = k, v, BLOCK
            self.max_kv_len = self.page_table.shape[1] * BLOCK
        else:
            if cu_seqlens_k is None:
                raise ValueError(f"{fn}: argument 'cu_seqlens_k': required for flat K/V (without page_table)")
            if k.dim() != 3:
                raise ValueError(f"{fn}: argument 'k': flat K/V must be (total_k, num_kv_heads, head_dim), got "
                                 f"{tuple(k.shape)}")
            cu = _int32(fn, "cu_seqlens_k", cu_seqlens_k, 1)
            # Pages of one token: page p is key row p, request b's pages are cu[b] .. cu[b+1].
            self.page_indptr = cu
            self.page_table = torch.arange(k.shape[0], dtype=torch.int32, device=k.device)
            self.kv_lens = cu[1:] - cu[:-1]
            self.k, self.v = k.unsqueeze(2), (None if v is None else v.unsqueeze(2))
            self.page_size = 1
            self.max_kv_len = max(int(k.shape[0]), 1)
        self.batch = int(self.kv_lens.shape[0])
        self.num_kv_heads = int(k.shape[1])


def _check_q2k(fn: str, q2k_indices, num_kv_heads: int, total_q: int) -> torch.Tensor:
    idx = _int32(fn, "q2k_indices", q2k_indices, 3)
    if idx.shape[0] != num_kv_heads or idx.shape[1] != total_q or idx.shape[2] < 1:
        raise ValueError(f"{fn}: argument 'q2k_indices': expected (num_kv_heads = {num_kv_heads}, total_q = "
                         f"{total_q}, topk >= 1), got {tuple(idx.shape)}")
    return idx.permute(1, 0, 2)  # msa's [total_q, Hkv, topk], a view


def _check_qkv(fn: str, q, k, v) -> None:
    if q.dim() != 3:
        raise ValueError(f"{fn}: argument 'q': expected (total_q, num_qo_heads, head_dim), got {tuple(q.shape)}")
    if v.dtype != k.dtype:
        raise ValueError(f"{fn}: argument 'v': expected k's dtype {k.dtype}, got {v.dtype}")
    if k.dim() != v.dim() or k.shape[:-1] != v.shape[:-1]:
        raise ValueError(f"{fn}: argument 'v': expected k's shape but the last dim, got {tuple(v.shape)} for k "
                         f"{tuple(k.shape)}")
    if k.dim() >= 2 and (k.shape[1] < 1 or q.shape[1] % k.shape[1] != 0):
        raise ValueError(f"{fn}: argument 'k': num_kv_heads = {k.shape[1]} must divide num_qo_heads = "
                         f"{q.shape[1]}")


def _outputs(fn: str, q, v_dim: int, out, lse_out, return_lse: bool):
    total_q, hq = q.shape[0], q.shape[1]
    if out is None:
        out = torch.empty((total_q, hq, v_dim), dtype=q.dtype, device=q.device)
    elif tuple(out.shape) != (total_q, hq, v_dim):
        raise ValueError(f"{fn}: argument 'out': expected shape {(total_q, hq, v_dim)}, got {tuple(out.shape)}")
    if lse_out is None and return_lse:
        lse_out = torch.empty((total_q, hq), dtype=torch.float32, device=q.device)
    return out, lse_out


# ------------------------------------------------------------------------------------------- indexer


def msa_proxy_score(
    q: torch.Tensor,
    k: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: Optional[torch.Tensor] = None,
    *,
    page_table: Optional[torch.Tensor] = None,
    seqused_k: Optional[torch.Tensor] = None,
    causal: bool = True,
    max_seqlen_q: Optional[int] = None,
    max_k_tiles: Optional[int] = None,
    output: Optional[torch.Tensor] = None,
    reduce_heads: bool = False,
    q_offset=None,
    use_fp32_acc: bool = True,
) -> torch.Tensor:
    """MSA proxy pass: max_score[h, t, i], the max of the unscaled q.k over the visible keys of KV block t
    (128 keys) for query token i and query head h; -inf where a block has no visible key (past seqused_k, or
    above the causal limit). Query i of request b sits at q_offset[b] + i (default: right-aligned,
    seqlen_k - seqlen_q + i).

    q: (total_q, Hq, D) bf16 / fp16 (fp8 converted to bf16; fp32 on the CPU). k: paged (num_pages, Hk, 128, D)
    with page_table + seqused_k, or flat (total_k, Hk, D) with cu_seqlens_k; q's dtype or float8_e4m3fn
    (unscaled e4m3 values); Hk divides Hq (msa extension: FlashInfer's SM90 kernels take one index head).
    max_k_tiles: output columns, default ceil(max seqlen_k / 128) (read on the host when output is None too).
    output: float32 (Hq, max_k_tiles, total_q), or (1, max_k_tiles, total_q) with reduce_heads (the max over
    the query heads). max_seqlen_q and use_fp32_acc are accepted with no effect (msa accumulates in fp32).

    Returns the float32 scores, ready for msa_topk_select.
    """
    fn = _name("msa_proxy_score")
    if q.dim() != 3:
        raise ValueError(f"{fn}: argument 'q': expected (total_q, num_qo_heads, head_dim), got {tuple(q.shape)}")
    _refuse_nvfp4(fn, k, None, None)
    kv = _KV(fn, k, None, page_table, seqused_k, cu_seqlens_k)
    qo_indptr = _int32(fn, "cu_seqlens_q", cu_seqlens_q, 1)
    if qo_indptr.shape[0] != kv.batch + 1:
        raise ValueError(f"{fn}: argument 'cu_seqlens_q': expected batch_size + 1 = {kv.batch + 1} entries, got "
                         f"{qo_indptr.shape[0]}")
    total_q, hq = q.shape[0], q.shape[1]
    if output is not None:
        if output.dtype != torch.float32 or output.dim() != 3:
            raise ValueError(f"{fn}: argument 'output': expected a 3-D float32 tensor, got {output.dtype} "
                             f"{tuple(output.shape)}")
        tiles = output.shape[1]
    elif max_k_tiles is not None:
        tiles = int(max_k_tiles)
    else:
        tiles = -(-int(kv.kv_lens.max()) // BLOCK) if kv.batch else 0  # host read, as FlashInfer's default
    if max_k_tiles is not None and int(max_k_tiles) != tiles:
        raise ValueError(f"{fn}: argument 'max_k_tiles': expected output's {tiles} columns, got {max_k_tiles}")
    final = (1 if reduce_heads else hq, tiles, total_q)
    if output is not None and tuple(output.shape) != final:
        raise ValueError(f"{fn}: argument 'output': expected shape {final}, got {tuple(output.shape)}")
    per_head = output if output is not None and not reduce_heads else \
        torch.empty((hq, tiles, total_q), dtype=torch.float32, device=q.device)
    k_scale = None
    if k.dtype == torch.float8_e4m3fn:  # FlashInfer's fp8 index keys carry no scale: unit per-token scales
        k_scale = torch.ones((1, 1, 1), dtype=torch.float32, device=k.device).expand(kv.k.shape[:3])
    torch_ops.block_scores(_compute_q(q), kv.k, kv.page_table, qo_indptr, kv.kv_lens,
                           qo_offset=_q_offset(fn, q_offset, kv.batch, q.device), page_indptr=kv.page_indptr,
                           k_scale=k_scale, layout="HKT", causal=bool(causal), out=per_head)
    if not reduce_heads:
        return per_head
    if output is None:
        output = torch.empty(final, dtype=torch.float32, device=q.device)
    torch.amax(per_head, dim=0, keepdim=True, out=output)
    return output


def msa_topk_select(
    max_score: torch.Tensor,
    topk: int,
    num_valid_pages: Optional[Union[int, torch.Tensor]] = None,
    output: Optional[torch.Tensor] = None,
    force_begin_blocks: int = 0,
    force_end_blocks: int = 0,
) -> torch.Tensor:
    """The topk best KV blocks of every (query token, head): max_score (Hq, max_k_tiles, total_q) float32 ->
    (total_q, Hq, topk) int32, ascending, -1 at the tail.

    A token's extent is [0, num_valid_pages) (an int for every token, or an int32 (total_q,) tensor per token,
    clamped to [0, max_k_tiles]; default max_k_tiles). The first force_begin_blocks and the last
    force_end_blocks blocks of the extent are always selected; the others compete on score, and blocks whose
    score is not finite (-inf: no visible key; NaN) are never selected. Ties go to the lower block index.
    topk: any in 1..64 on the GPU (FlashInfer's SM90 kernels: 16). No host read, graph-capturable.
    """
    fn = _name("msa_topk_select")
    if not isinstance(max_score, torch.Tensor) or max_score.dtype != torch.float32 or max_score.dim() != 3:
        raise ValueError(f"{fn}: argument 'max_score': expected a float32 (num_qo_heads, max_k_tiles, total_q) "
                         f"tensor, got {getattr(max_score, 'dtype', type(max_score).__name__)} "
                         f"{tuple(getattr(max_score, 'shape', ()))}")
    topk = int(topk)
    fb, fe = int(force_begin_blocks), int(force_end_blocks)
    hq, tiles, total_q = (int(x) for x in max_score.shape)
    if topk < 1:
        raise ValueError(f"{fn}: argument 'topk': expected >= 1, got {topk}")
    if fb < 0 or fe < 0:
        raise ValueError(f"{fn}: arguments 'force_begin_blocks' / 'force_end_blocks': expected >= 0, got {fb}, {fe}")
    if fb + fe > topk:
        raise ValueError(f"{fn}: arguments 'force_begin_blocks' + 'force_end_blocks' ({fb} + {fe}) must be <= topk "
                         f"({topk})")
    dev = max_score.device
    if isinstance(num_valid_pages, torch.Tensor):
        if num_valid_pages.dtype != torch.int32 or num_valid_pages.dim() != 1 or num_valid_pages.numel() != total_q:
            raise ValueError(f"{fn}: argument 'num_valid_pages': expected a 1-D int32 tensor of total_q = {total_q} "
                             f"entries, got {num_valid_pages.dtype} {tuple(num_valid_pages.shape)}")
        if num_valid_pages.device != dev:
            raise ValueError(f"{fn}: argument 'num_valid_pages': expected max_score's device {dev}, got "
                             f"{num_valid_pages.device}")
        kv_lens = num_valid_pages.clamp(0, tiles).mul_(BLOCK)
    else:
        nvp = tiles if num_valid_pages is None else int(num_valid_pages)
        if not 0 < nvp <= tiles:
            raise ValueError(f"{fn}: argument 'num_valid_pages': expected 1..max_k_tiles = {tiles}, got {nvp}")
        if fb + fe > nvp:
            raise ValueError(f"{fn}: arguments 'force_begin_blocks' + 'force_end_blocks' ({fb} + {fe}) must be <= "
                             f"num_valid_pages ({nvp})")
        kv_lens = _constant(("kv_lens", dev, total_q, nvp),
                            lambda: torch.full((total_q,), nvp * BLOCK, dtype=torch.int32, device=dev), max_score)
    if output is None:
        output = torch.empty((total_q, hq, topk), dtype=torch.int32, device=dev)
    elif tuple(output.shape) != (total_q, hq, topk) or output.dtype != torch.int32:
        raise ValueError(f"{fn}: argument 'output': expected int32 of shape {(total_q, hq, topk)}, got "
                         f"{output.dtype} {tuple(output.shape)}")
    if total_q == 0:
        return output
    # Every token a non-causal request over its extent (its valid blocks are exactly [0, num_valid_pages), and
    # force_end counts back from there; offset 0, as an empty extent makes the default offset -1); finite_only
    # is FlashInfer's rule for non-finite scores.
    indptr = _constant(("indptr", dev, total_q),
                       lambda: torch.arange(total_q + 1, dtype=torch.int32, device=dev), max_score)
    zeros = _constant(("zeros", dev, total_q), lambda: torch.zeros(total_q, dtype=torch.int32, device=dev), max_score)
    torch_ops.select_topk(max_score, indptr, kv_lens, topk, qo_offset=zeros, layout="HKT", force_begin=fb,
                          force_end=fe, causal=False, finite_only=True, out=output)
    return output


def _constant(key, make, like: torch.Tensor) -> torch.Tensor:
    """A device tensor that depends on its key only (token indptr, uniform lengths), made once for eager calls
    on plain tensors. Under CUDA-graph capture a fresh one is made every time: it lives in the graph's memory
    pool as long as the graph, whereas a cached tensor may be evicted (and its memory reused) while a graph
    still reads it. Traced calls (torch.compile, FakeTensor `like`) make their own."""
    if not torch_ops._direct(like) or (like.is_cuda and torch.cuda.is_current_stream_capturing()):
        return make()
    t = _constants.get(key)
    if t is None:
        if len(_constants) >= _MAX_CONSTANTS:
            _constants.clear()
        t = _constants[key] = make()
    return t


# ----------------------------------------------------------------------------------------- attention


def msa_sparse_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    q2k_indices: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: Optional[torch.Tensor] = None,
    causal: bool = False,
    softmax_scale: Optional[float] = None,
    page_table: Optional[torch.Tensor] = None,
    seqused_k: Optional[torch.Tensor] = None,
    return_softmax_lse: bool = False,
    k_scale: Optional[torch.Tensor] = None,
    v_scale: Optional[torch.Tensor] = None,
    k_global_scale: Optional[float] = None,
    v_global_scale: Optional[float] = None,
    q_offset=None,
    return_temperature_lse: bool = False,
    lse_temperature_scale: float = 1.0,
    *,
    out: Optional[torch.Tensor] = None,
    lse_out: Optional[torch.Tensor] = None,
    workspace=None,
):
    """Sparse prefill: query i of request b attends to the keys of its selected blocks
    q2k_indices[:, i] (Hkv, total_q, topk) int32, -1 for empty slots; with causal, keys at positions
    <= q_offset[b] + i (default right-aligned: seqlen_k - seqlen_q + i).

    q: (total_q, Hq, D); k, v: paged (num_pages, Hkv, 128, D | Dv) with page_table (batch, max_pages) and
    seqused_k, or flat (total_k, Hkv, D) with cu_seqlens_k; bf16 / fp16 in q's dtype or float8_e4m3fn.
    Logits are q.k * softmax_scale (default D ** -0.5) * k_global_scale; the output is scaled by
    v_global_scale. Reads the lengths on the host once (msa plans the work over them).

    Returns out (total_q, Hq, Dv) in q's dtype (bf16 for fp8 q), and the natural-log LSE (total_q, Hq) when
    return_softmax_lse (into lse_out when given). out / lse_out / workspace are keyword-only; workspace is
    accepted with no effect.
    """
    fn = _name("msa_sparse_attention")
    _refuse_nvfp4(fn, k, k_scale, v_scale)
    if return_temperature_lse:
        raise NotImplementedError(f"{fn}: argument 'return_temperature_lse': the temperature LSE is not served "
                                  f"by msa")
    _check_qkv(fn, q, k, v)
    kv = _KV(fn, k, v, page_table, seqused_k, cu_seqlens_k)
    qc = _compute_q(q)
    qo_indptr = _int32(fn, "cu_seqlens_q", cu_seqlens_q, 1)
    if qo_indptr.shape[0] != kv.batch + 1:
        raise ValueError(f"{fn}: argument 'cu_seqlens_q': expected batch_size + 1 = {kv.batch + 1} entries, got "
                         f"{qo_indptr.shape[0]}")
    block_idx = _check_q2k(fn, q2k_indices, kv.num_kv_heads, q.shape[0])
    offset = _q_offset(fn, q_offset, kv.batch, q.device)
    # The one host read of the call: msa plans the prefill over the lengths.
    pieces = [qo_indptr, kv.kv_lens] + ([] if offset is None else [offset])
    host = torch.cat([p.to(device=q.device, dtype=torch.int64) for p in pieces]).tolist()
    B = kv.batch
    cu, kv_host = host[:B + 1], host[B + 1:2 * B + 1]
    plan = plan_prefill([cu[b + 1] - cu[b] for b in range(B)], kv_host,
                        qo_offset=None if offset is None else host[2 * B + 1:], num_qo_heads=q.shape[1],
                        num_kv_heads=kv.num_kv_heads, head_dim=q.shape[2], head_dim_v=v.shape[-1],
                        page_size=kv.page_size, topk=block_idx.shape[2], causal=bool(causal), device=q.device)
    return _attend(fn, plan, qc, kv, qo_indptr, block_idx, offset, softmax_scale, k_global_scale, v_global_scale,
                   out, lse_out, return_softmax_lse)


def _decode_plan(fn: str, q, kv: _KV, seqlen_q: int, topk: int, head_dim_v: int, causal: bool):
    """The cached decode plan of this geometry (built on the first, eager, call)."""
    key = (str(q.device), kv.batch, seqlen_q, kv.max_kv_len, q.shape[1], kv.num_kv_heads, q.shape[2], head_dim_v,
           kv.page_size, topk, causal)
    with _decode_plans_lock:
        plan = _decode_plans.get(key)
        if plan is None:
            if q.is_cuda and torch.cuda.is_current_stream_capturing():
                raise RuntimeError(f"{fn}: run the call eagerly once with this batch size, seqlen_q, page-table "
                                   f"width and head geometry before CUDA graph capture (its msa decode plan is "
                                   f"built then)")
            plan = plan_decode(kv.batch, seqlen_q, kv.max_kv_len, num_qo_heads=q.shape[1],
                               num_kv_heads=kv.num_kv_heads, head_dim=q.shape[2], head_dim_v=head_dim_v,
                               page_size=kv.page_size, topk=topk, causal=causal, device=q.device)
            _decode_plans[key] = plan
    return plan


def msa_sparse_decode_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    q2k_indices: torch.Tensor,
    *,
    page_table: Optional[torch.Tensor] = None,
    seqused_k: Optional[torch.Tensor] = None,
    cu_seqlens_k: Optional[torch.Tensor] = None,
    seqlen_q: int = 1,
    causal: bool = True,
    softmax_scale: Optional[float] = None,
    return_softmax_lse: bool = False,
    k_scale: Optional[torch.Tensor] = None,
    v_scale: Optional[torch.Tensor] = None,
    k_global_scale: Optional[float] = None,
    v_global_scale: Optional[float] = None,
    q_offset=None,
    partial_dtype: Optional[torch.dtype] = None,
    force_fused: Optional[bool] = None,
    out: Optional[torch.Tensor] = None,
    lse_out: Optional[torch.Tensor] = None,
    workspace=None,
):
    """Sparse decode (and MTP / speculative verification): every request has seqlen_q query tokens
    (q: (batch * seqlen_q, Hq, D)); token i of request b sits at seqused_k[b] - seqlen_q + i (right-aligned;
    q_offset overrides it) and attends to the keys of its selected blocks q2k_indices (Hkv, batch * seqlen_q,
    topk).

    k, v, scales, out and the LSE as for msa_sparse_attention. With seqlen_q <= 16 nothing is read on the host
    and the call is CUDA-graph capturable: a decode plan per geometry (batch, seqlen_q, page_table width,
    heads) is cached at the first call, which must be eager; seqused_k, page_table and q2k_indices may change
    freely between replays (keys per request up to page_table.shape[1] * 128). seqlen_q > 16 is planned as a
    prefill (reads the lengths on the host). partial_dtype, force_fused and workspace are accepted with no
    effect.
    """
    fn = _name("msa_sparse_decode_attention")
    _refuse_nvfp4(fn, k, k_scale, v_scale)
    _check_qkv(fn, q, k, v)
    seqlen_q = int(seqlen_q)
    total_q = q.shape[0]
    if seqlen_q <= 0 or total_q % seqlen_q != 0:
        raise ValueError(f"{fn}: argument 'seqlen_q': expected a positive divisor of q's {total_q} rows "
                         f"(batch_size * seqlen_q), got {seqlen_q}")
    kv = _KV(fn, k, v, page_table, seqused_k, cu_seqlens_k)
    if kv.batch * seqlen_q != total_q:
        raise ValueError(f"{fn}: argument 'seqused_k': expected batch_size = {total_q // seqlen_q} requests "
                         f"(q rows / seqlen_q), got {kv.batch}")
    block_idx = _check_q2k(fn, q2k_indices, kv.num_kv_heads, total_q)
    qo_indptr = torch.arange(0, total_q + 1, seqlen_q, dtype=torch.int32, device=q.device)
    offset = _q_offset(fn, q_offset, kv.batch, q.device)
    if seqlen_q > DECODE_MAX_SEQLEN_Q:
        return msa_sparse_attention(q, k, v, q2k_indices, qo_indptr, cu_seqlens_k, causal, softmax_scale,
                                    page_table, seqused_k, return_softmax_lse, None, None, k_global_scale,
                                    v_global_scale, q_offset, out=out, lse_out=lse_out)
    plan = _decode_plan(fn, q, kv, seqlen_q, block_idx.shape[2], v.shape[-1], bool(causal))
    return _attend(fn, plan, _compute_q(q), kv, qo_indptr, block_idx, offset, softmax_scale, k_global_scale,
                   v_global_scale, out, lse_out, return_softmax_lse)


def _attend(fn, plan, q, kv: _KV, qo_indptr, block_idx, offset, softmax_scale, k_global_scale, v_global_scale, out,
            lse_out, return_lse):
    out, lse_out = _outputs(fn, q, kv.v.shape[-1], out, lse_out, return_lse)
    block_idx = _cpu_blocks_past_end_as_empty(block_idx, qo_indptr, kv.kv_lens)
    torch_ops.attention(plan, q, kv.k, kv.v, kv.page_table, qo_indptr, kv.kv_lens, block_idx=block_idx,
                        qo_offset=offset, page_indptr=kv.page_indptr, out=out, lse=lse_out,
                        sm_scale=softmax_scale, k_scale=_scale(fn, "k_global_scale", k_global_scale),
                        v_scale=_scale(fn, "v_global_scale", v_global_scale))
    return (out, lse_out) if return_lse else out


def preload_sm90_programs(kinds: Optional[Iterable[str]] = None) -> dict:
    """FlashInfer builds and loads its Hopper programs here; msa's kernels are compiled ahead of time, so there
    is nothing to load: returns {kind: 0} for the kinds asked (default all: sparse_decode, proxy_decode,
    proxy_prefill, topk_select, sparse_prefill). Unknown kinds raise ValueError, a call under CUDA graph
    capture RuntimeError, as in FlashInfer. Decode plans are built by each geometry's first eager call."""
    fn = _name("preload_sm90_programs")
    names = _PROGRAM_KINDS if kinds is None else tuple(kinds)
    unknown = [k for k in names if k not in _PROGRAM_KINDS]
    if unknown:
        raise ValueError(f"{fn}: argument 'kinds': unknown kind(s) {unknown}; expected some of {_PROGRAM_KINDS}")
    if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
        raise RuntimeError(f"{fn}: must not run under CUDA graph capture")
    return {k: 0 for k in names}
