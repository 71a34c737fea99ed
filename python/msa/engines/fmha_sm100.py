"""msa.fmha_sm100 (this module, msa.engines.fmha_sm100): MiniMax's fmha_sm100 API served by msa, on any
sm_80+ GPU (Hopper included) and on msa's CPU reference backend. Needs torch.

    # from fmha_sm100 import fmha_sm100, fmha_sm100_plan, sparse_topk_select
    from msa.fmha_sm100 import fmha_sm100, fmha_sm100_plan, sparse_topk_select

fmha_sm100_plan, fmha_sm100 and sparse_topk_select take the argument names, defaults and layouts of
fmha_sm100 (python/fmha_sm100/api.py of MiniMax-AI/MSA) and return the same values.

The plan
--------
fmha_sm100_plan returns fmha_sm100's 5-tuple (has_mixed_prefill, split, batch_size, plan_info, None).
msa runs a batch that mixes decode and prefill requests in one plan, so the tuple is always
(False, 0, batch_size, plan_info, None). plan_info is a dict; these int32 tensors of it, on the plan's
device, are what every fmha_sm100 call reads:

    qo_segment_lens     [B]    query tokens per request
    qo_segment_offsets  [B+1]  their prefix sums (msa's qo_indptr), derived once at plan time
    kv_segment_lens     [B]    keys per request
    kv_segment_offsets  [B+1]  their prefix sums: the rows of each request in a non-paged K/V
    kv_page_indptr      [B+1]  request b's pages are kv_indices[kv_page_indptr[b] : kv_page_indptr[b+1]]
                               (paged plans; None otherwise, as in fmha_sm100)
    qo_offset           [B]    absolute position of each request's first query (masks causal plans)

Rewriting them in place (copy_, torch.cumsum(..., out=...)) takes effect on the next call, with no host
sync, also when that call is replayed from a CUDA graph, within these limits:

  * A decode-shaped plan (every qo_len <= 8) is an msa.plan_decode plan, built from limits only: key
    lengths may change freely up to plan_info["max_kv_len"] (the largest planned length, and at least
    DECODE_MAX_KV_LEN = 2**20 unless max_kv_len= sets the bound) and query lengths up to
    plan_info["max_qo_len"]. This is the CUDA-graph-safe decode that fmha_sm100 lacks.
    fmha_sm100_decode_plan builds one from the batch size alone, with no host lengths.
  * Any other plan is an msa.plan_prefill plan over the host lengths, which msa uses to balance the
    work: its lengths are fixed at plan time. Changed lengths need a new plan (CPU tensors raise
    ValueError; CUDA tensors must describe the planned lengths).

The tensors are filled on the current stream at plan time (an asynchronous copy from pinned memory).

Where msa differs from fmha_sm100
---------------------------------
  * kv_block_indexes rows may hold their blocks in any order and -1 anywhere (fmha_sm100 needs strictly
    ascending rows with a -1 tail and mis-masks others); check_input_valid=True scans them on the host
    and reports the first bad entry.
  * Any GQA ratio (up to 128 on the GPU), page size and kv_block_num; head_dim is 128, fmha_sm100's only one,
    unless head_dim= says otherwise. num_kv_heads=-1 plans Hkv = num_qo_heads (fmha_sm100 reads
    Hkv from k at run time).
  * page_table= (dense [B, max_pages] int32) is accepted by every plan, not only sparse prefill.
  * max_score is the raw q.k of the stored values (q_scale and k_scale are not applied to it).
  * sparse_topk_select takes any topk (1..64 on the GPU) and strided scores, and ranks as
    msa.select_topk does (NaN lowest, ties to the lower block index).
  * fp8 e4m3 K/V (use_fp8_kvcache=True, or float8_e4m3fn k and v) with k_scale / v_scale; a plan serves
    both caches, so use_fp8_kvcache only documents the caller's.
  * Not served by this drop-in (NotImplementedError): float8 q, max_score over an fp8 cache (msa.block_scores
    takes fp8 keys with per-token scales), o_scale, max_score together
    with sparse attention, kv_block_indexes with one row per query head when Hq != Hkv, and
    sparse_topk_select's 2-D (TRTLLM) block_table.
  * Accepted with no effect: split_prefill_decode, usable_SM_count, sparse_kernel_mode and stream (msa
    picks and schedules its kernels itself, and planning launches none).
"""
from __future__ import annotations

from typing import Optional, Union

from .._framework import require_torch

torch = require_torch("msa.fmha_sm100", "serves MiniMax's fmha_sm100 API on torch tensors")

from .. import torch_ops  # noqa: E402
from ..plan import plan_decode, plan_prefill  # noqa: E402

__all__ = ["DECODE_MAX_KV_LEN", "fmha_sm100", "fmha_sm100_decode_plan", "fmha_sm100_plan", "sparse_topk_select"]

BLOCK = 128  # keys per max_score tile and per selectable block (the contract's block)
DECODE_MAX_QO_LEN = 8  # fmha_sm100 routes qo_len <= 8 to msa.plan_decode (which takes up to 16)
# Default bound on the key length of decode-shaped plans: MiniMax-M3's context of 2**20 tokens.
DECODE_MAX_KV_LEN = 1 << 20

_LENGTH_KEYS = ("qo_segment_lens", "qo_segment_offsets", "kv_segment_lens", "kv_segment_offsets",
                "kv_page_indptr", "qo_offset")


def _host_ints(fn: str, name: str, x) -> list[int]:
    """A 1-D host list of ints from a tensor (read on the host: a CUDA tensor waits on the device, as in
    fmha_sm100), a numpy array or a sequence."""
    if isinstance(x, torch.Tensor):
        if x.dim() != 1:
            raise ValueError(f"{fn}: argument '{name}': expected a 1-D tensor [batch_size], got shape "
                             f"{list(x.shape)}")
        x = x.tolist()
    return [int(v) for v in x]


def _prefix_sums(values: list[int]) -> list[int]:
    out = [0]
    for v in values:
        out.append(out[-1] + v)
    return out


def _plan_device(device, *tensors) -> torch.device:
    """device= when given; else the CUDA device of a length tensor; else torch's current CUDA device
    (fmha_sm100's default); else the CPU."""
    if device is not None:
        d = device if isinstance(device, torch.device) else torch.device(device)
        if d.type == "cuda" and d.index is None:
            d = torch.device("cuda", torch.cuda.current_device())
        return d
    for t in tensors:
        if isinstance(t, torch.Tensor) and t.is_cuda:
            return t.device
    if torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _length_tensors(device: torch.device, qo: list[int], kv: list[int], qo_offset: list[int],
                    page_size: int) -> dict:
    """The plan's int32 length tensors: views of one buffer filled by a single host-to-device copy."""
    pieces = {
        "qo_segment_lens": qo,
        "qo_segment_offsets": _prefix_sums(qo),
        "kv_segment_lens": kv,
        "kv_segment_offsets": _prefix_sums(kv),
        "kv_page_indptr": _prefix_sums([-(-n // page_size) for n in kv]) if page_size > 0 else [],
        "qo_offset": qo_offset,
    }
    host = torch.tensor([v for key in _LENGTH_KEYS for v in pieces[key]], dtype=torch.int32)
    buf = host.pin_memory().to(device, non_blocking=True) if device.type == "cuda" else host
    views = torch.split(buf, [len(pieces[key]) for key in _LENGTH_KEYS])
    tensors = dict(zip(_LENGTH_KEYS, views))
    if page_size <= 0:
        tensors["kv_page_indptr"] = None
    return tensors


def _plan_info(msa_plan, device, qo, kv, qo_offset, *, max_qo_len, max_kv_len, num_qo_heads, num_kv_heads,
               page_size, kv_block_num, causal, output_maxscore) -> tuple:
    info = _length_tensors(device, qo, kv, qo_offset, page_size)
    # As fmha_sm100: score tiles of the longest planned sequence, rounded up to a multiple of 128 tiles.
    max_k_tiles = -1
    if output_maxscore:
        max_k_tiles = -(-max(-(-max(kv, default=0) // BLOCK), 1) // 128) * 128
    info.update(
        max_qo_len=max_qo_len,
        max_kv_len=max_kv_len,
        max_k_tiles=max_k_tiles,
        num_qo_heads=num_qo_heads,
        num_kv_heads=num_kv_heads,
        page_size=page_size,
        kv_block_num=kv_block_num,
        causal=causal,
        msa_plan=torch_ops.PlanHandle(msa_plan),
    )
    return (False, 0, len(qo), info, None)


def fmha_sm100_plan(
    qo_segment_lens: torch.Tensor,
    kv_segment_lens: torch.Tensor,
    num_qo_heads: int,
    num_kv_heads: int = -1,
    *,
    qo_offset: Optional[Union[int, torch.Tensor]] = None,
    split_prefill_decode: bool = True,
    num_kv_splits: int = -1,
    page_size: int = -1,
    output_maxscore: bool = False,
    kv_block_num: int = -1,
    usable_SM_count: int = -1,
    causal: bool = True,
    sparse_kernel_mode: str = "auto",
    use_fp8_kvcache: bool = False,
    device=None,
    stream=None,
    head_dim: int = 128,
    max_kv_len: Optional[int] = None,
):
    """Plans fmha_sm100 calls for a batch (fmha_sm100's fmha_sm100_plan).

    Args:
        qo_segment_lens, kv_segment_lens: [B] query and key tokens per request (tensors on any device,
            read on the host; lists are accepted too).
        num_qo_heads, num_kv_heads: Hq and Hkv (-1: Hkv = Hq).
        qo_offset: int or [B]: absolute position of each request's first query; default kv_len - qo_len.
        num_kv_splits: > 0 caps the KV splits per (request, KV head) (msa's max_splits); -1: msa's choice.
        page_size: tokens per KV page; -1: K/V are non-paged [total_kv, Hkv, D].
        output_maxscore: fmha_sm100 also returns the per-128-key-tile max of q.k ([Hq, max_k_tiles, T]).
        kv_block_num: top-k blocks per query token and KV head (sparse attention); -1: dense.
        causal: query i of request b sees keys j <= qo_offset[b] + i.
        device: where the plan runs (default: the lengths' CUDA device, else torch's current CUDA device,
            else the CPU).
        head_dim: D of q and k (msa extension; fmha_sm100 serves 128 only).
        max_kv_len: bound on the key lengths written in place into a decode-shaped plan (msa extension;
            default max(DECODE_MAX_KV_LEN, the planned lengths)).
        split_prefill_decode, usable_SM_count, sparse_kernel_mode, stream: accepted, no effect.

    Returns:
        (False, 0, batch_size, plan_info, None); see the module docstring for plan_info.
    """
    fn = "msa.fmha_sm100.fmha_sm100_plan"
    qo = _host_ints(fn, "qo_segment_lens", qo_segment_lens)
    kv = _host_ints(fn, "kv_segment_lens", kv_segment_lens)
    B = len(qo)
    if B == 0 or len(kv) != B:
        raise ValueError(f"{fn}: arguments 'qo_segment_lens' and 'kv_segment_lens': expected the same number "
                         f"(>= 1) of requests, got {B} and {len(kv)}")
    if qo_offset is None:
        offsets = [k - q for q, k in zip(qo, kv)]
    elif isinstance(qo_offset, int):
        offsets = [qo_offset] * B
    else:
        offsets = _host_ints(fn, "qo_offset", qo_offset)
        if len(offsets) != B:
            raise ValueError(f"{fn}: argument 'qo_offset': expected {B} entries (one per request), "
                             f"got {len(offsets)}")
    sparse = kv_block_num > 0
    if sparse and page_size <= 0:
        raise ValueError(f"{fn}: argument 'page_size': sparse attention (kv_block_num = {kv_block_num}) needs a "
                         f"paged K/V, got page_size = {page_size}")
    dev = _plan_device(device, qo_segment_lens, kv_segment_lens, qo_offset)
    hkv = num_kv_heads if num_kv_heads > 0 else num_qo_heads
    cfg = dict(num_qo_heads=num_qo_heads, num_kv_heads=hkv, head_dim=head_dim,
               page_size=page_size if page_size > 0 else 1, topk=kv_block_num if sparse else 0, causal=causal,
               device=dev, max_splits=max(num_kv_splits, 0))
    longest = max(kv)
    if max(qo) <= DECODE_MAX_QO_LEN:
        plan_qo = max(max(qo), 1)
        bound = max(longest, DECODE_MAX_KV_LEN if max_kv_len is None else max_kv_len, 1)
        msa_plan = plan_decode(B, plan_qo, bound, **cfg)
    else:
        plan_qo, bound = max(qo), longest
        msa_plan = plan_prefill(qo, kv, qo_offset=offsets, **cfg)
    return _plan_info(msa_plan, dev, qo, kv, offsets, max_qo_len=plan_qo, max_kv_len=bound,
                      num_qo_heads=num_qo_heads, num_kv_heads=hkv, page_size=page_size,
                      kv_block_num=kv_block_num if sparse else -1, causal=causal, output_maxscore=output_maxscore)


def fmha_sm100_decode_plan(
    batch_size: int,
    num_qo_heads: int,
    num_kv_heads: int = -1,
    *,
    page_size: int = -1,
    kv_block_num: int = -1,
    max_qo_len: int = 1,
    max_kv_len: int = DECODE_MAX_KV_LEN,
    causal: bool = True,
    num_kv_splits: int = -1,
    head_dim: int = 128,
    device=None,
):
    """A decode-shaped fmha_sm100 plan from the batch size and limits alone (msa extension): no host
    lengths are read, nothing waits on the device. Its lengths start empty (max_qo_len query tokens and
    no keys per request, offsets 0); write plan_info's tensors in place before each call, e.g.

        info = plan[3]
        info["kv_segment_lens"].copy_(seq_lens)
        torch.cumsum(seq_lens, 0, dtype=torch.int32, out=info["kv_segment_offsets"][1:])
        torch.cumsum((seq_lens + page_size - 1) // page_size, 0, dtype=torch.int32,
                     out=info["kv_page_indptr"][1:])
        info["qo_offset"].copy_(seq_lens - 1)            # causal plans: the query's position

    Keys per request stay at most max_kv_len and query tokens per request at most max_qo_len (1..8).
    """
    fn = "msa.fmha_sm100.fmha_sm100_decode_plan"
    if not 1 <= max_qo_len <= DECODE_MAX_QO_LEN:
        raise ValueError(f"{fn}: argument 'max_qo_len': expected 1..{DECODE_MAX_QO_LEN}, got {max_qo_len}")
    sparse = kv_block_num > 0
    if sparse and page_size <= 0:
        raise ValueError(f"{fn}: argument 'page_size': sparse attention (kv_block_num = {kv_block_num}) needs a "
                         f"paged K/V, got page_size = {page_size}")
    dev = _plan_device(device)
    hkv = num_kv_heads if num_kv_heads > 0 else num_qo_heads
    msa_plan = plan_decode(batch_size, max_qo_len, max_kv_len, num_qo_heads=num_qo_heads, num_kv_heads=hkv,
                           head_dim=head_dim, page_size=page_size if page_size > 0 else 1,
                           topk=kv_block_num if sparse else 0, causal=causal, device=dev,
                           max_splits=max(num_kv_splits, 0))
    return _plan_info(msa_plan, dev, [max_qo_len] * batch_size, [0] * batch_size, [0] * batch_size,
                      max_qo_len=max_qo_len, max_kv_len=max_kv_len, num_qo_heads=num_qo_heads, num_kv_heads=hkv,
                      page_size=page_size, kv_block_num=kv_block_num if sparse else -1, causal=causal,
                      output_maxscore=False)


def _cpu_blocks_past_end_as_empty(block_idx, qo_indptr, kv_lens):
    """block_idx [T, Hkv, topk] with its entries past their request's blocks set to -1, for CPU tensors.

    Serving engines leave such entries in their selections (every entry of a padded request, seq_len 0,
    may be garbage), and fmha_sm100 and msa's GPU kernels read them as empty slots. msa's CPU backend
    reads every block index on the host and refuses them (a caller error, docs/contract.md §2), so on CPU
    tensors the drop-ins clear them first: both backends give the same results, and the GPU path does no
    more work. Fixed shapes only, so torch.compile traces it."""
    if block_idx is None or block_idx.device.type != "cpu":
        return block_idx
    tokens = torch.arange(block_idx.shape[0], dtype=qo_indptr.dtype)
    request = torch.searchsorted(qo_indptr[1:].contiguous(), tokens, right=True)  # B: past every request
    blocks = (kv_lens.to(torch.int64) + BLOCK - 1) // BLOCK
    limit = torch.cat([blocks, blocks.new_zeros(1)])[request]
    return block_idx.masked_fill(block_idx >= limit.view(-1, 1, 1), -1)


def _plan_dict(fn: str, plan_info) -> dict:
    if not (isinstance(plan_info, tuple) and len(plan_info) == 5 and isinstance(plan_info[3], dict)
            and "msa_plan" in plan_info[3]):
        raise TypeError(f"{fn}: argument 'plan_info': expected the tuple returned by "
                        f"msa.fmha_sm100.fmha_sm100_plan, got {type(plan_info).__name__}")
    return plan_info[3]


def _unit(scale) -> float:
    return 1.0 if scale is None else float(scale)


def fmha_sm100(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    plan_info,
    kv_indices: Optional[torch.Tensor] = None,
    kv_block_indexes: Optional[torch.Tensor] = None,
    q_offset_override: Optional[Union[int, torch.Tensor]] = None,
    out: Optional[torch.Tensor] = None,
    max_score: Optional[torch.Tensor] = None,
    page_table: Optional[torch.Tensor] = None,
    *,
    sm_scale: Optional[float] = None,
    q_scale: Optional[float] = None,
    k_scale: Optional[float] = None,
    v_scale: Optional[float] = None,
    o_scale: Optional[float] = None,
    output_maxscore: bool = True,
    output_o: bool = True,
    check_input_valid: bool = False,
):
    """Runs a plan of fmha_sm100_plan (fmha_sm100's fmha_sm100). Launches only: no allocation beyond the
    outputs not passed, no host sync (unless check_input_valid), so it can be captured in a CUDA graph.

    Args:
        q: [T, Hq, D], bf16 / fp16 (fp32 on the CPU).
        k, v: paged [num_pages, Hkv, page_size, D] (any strides, innermost contiguous; sglang's slot-major
            pool is view(pages, page_size, Hkv, D).permute(0, 2, 1, 3)), or [total_kv, Hkv, D] for a
            non-paged plan.
        plan_info: the tuple from fmha_sm100_plan.
        kv_indices: int32 [n], the flat page table, rows at plan_info["kv_page_indptr"] (paged plans).
        kv_block_indexes: int32 [T, Hkv, kv_block_num], any strides (sglang's [Hkv, T, topk] .permute(1, 0, 2));
            the selected 128-key blocks, any order, -1 for empty slots.
        q_offset_override: int or [B] int32 tensor replacing plan_info["qo_offset"] for this call.
        out: [T, Hq, Dv] in q's dtype; allocated when None.
        max_score: fp32 [Hq, K, T] or [T, Hq, K] receiving the per-128-key-tile max of q.k over the visible
            keys (-inf where none), when the plan has output_maxscore; allocated [Hq, max_k_tiles, T] when None.
        page_table: int32 [B, max_pages], a dense page table used instead of kv_indices.
        sm_scale: logit scale (default D ** -0.5), multiplied by q_scale and k_scale; v_scale scales the output.
        output_maxscore, output_o: compute max_score / o (a plan without output_maxscore always computes o).
        check_input_valid: scan lengths, page table and block indexes on the host (synchronizes). Without it,
            entries of kv_block_indexes past their request's blocks are empty slots, as in fmha_sm100.

    Returns:
        (out, max_score); max_score is None unless the plan was built with output_maxscore=True.
    """
    fn = "msa.fmha_sm100.fmha_sm100"
    info = _plan_dict(fn, plan_info)
    if q.dtype.itemsize == 1:
        raise NotImplementedError(f"{fn}: argument 'q': msa takes bf16 / fp16 q (fp8 K/V are served), got {q.dtype}")
    if o_scale is not None and o_scale != 1.0:
        raise NotImplementedError(f"{fn}: argument 'o_scale': output quantization is not served by msa, got {o_scale}")
    scales = dict(sm_scale=sm_scale, q_scale=_unit(q_scale), k_scale=_unit(k_scale), v_scale=_unit(v_scale))
    qo_offset = info["qo_offset"]
    if isinstance(q_offset_override, int):
        qo_offset = torch.full_like(qo_offset, q_offset_override)
    elif q_offset_override is not None:
        qo_offset = q_offset_override
    if page_table is not None:
        table, page_indptr = page_table, None
    elif info["page_size"] > 0:
        if kv_indices is None:
            raise ValueError(f"{fn}: argument 'kv_indices' is required by a paged plan (page_size = "
                             f"{info['page_size']}), or pass page_table=")
        table, page_indptr = kv_indices, info["kv_page_indptr"]
    else:
        # Non-paged K/V [total_kv, Hkv, D]: pages of one token whose page p is row p, so request b's
        # rows kv_segment_offsets[b] + j are its logical pages j.
        k, v = k.unsqueeze(2), v.unsqueeze(2)
        table = torch.arange(k.shape[0], dtype=torch.int32, device=k.device)
        page_indptr = info["kv_segment_offsets"]
    if kv_block_indexes is not None and kv_block_indexes.dim() == 3 \
            and kv_block_indexes.shape[1] != info["num_kv_heads"] and kv_block_indexes.shape[1] == q.shape[1]:
        raise NotImplementedError(f"{fn}: argument 'kv_block_indexes': one block list per query head "
                                  f"(shape[1] = {q.shape[1]}) is not served; msa shares one list per KV head "
                                  f"(shape[1] = num_kv_heads = {info['num_kv_heads']})")
    want_scores = output_maxscore and info["max_k_tiles"] > 0
    if want_scores and k.dtype.itemsize == 1:
        raise NotImplementedError(f"{fn}: max_score over an fp8 cache is not served (k is {k.dtype}); plan without "
                                  f"output_maxscore or pass output_maxscore=False")
    if want_scores and kv_block_indexes is not None:
        raise NotImplementedError(f"{fn}: max_score with sparse attention is not served; plan without "
                                  f"output_maxscore or pass output_maxscore=False")
    seqs = dict(page_indptr=page_indptr, qo_offset=qo_offset, validate=check_input_valid)
    if not check_input_valid:
        kv_block_indexes = _cpu_blocks_past_end_as_empty(kv_block_indexes, info["qo_segment_offsets"],
                                                         info["kv_segment_lens"])
    o = None
    if output_o or not want_scores:
        o = torch_ops.attention(info["msa_plan"], q, k, v, table, info["qo_segment_offsets"],
                                info["kv_segment_lens"], block_idx=kv_block_indexes, out=out, **scales, **seqs)
    scores = None
    if want_scores:
        T, H = q.shape[0], q.shape[1]
        layout = "HKT"
        if max_score is None:
            max_score = q.new_empty((H, info["max_k_tiles"], T), dtype=torch.float32)
        elif max_score.dim() == 3 and max_score.shape[0] == H and max_score.shape[2] == T:
            layout = "HKT"
        elif max_score.dim() == 3 and max_score.shape[0] == T and max_score.shape[1] == H:
            layout = "THK"
        else:
            raise ValueError(f"{fn}: argument 'max_score': expected [num_qo_heads = {H}, max_k_tiles, total_q = {T}] "
                             f"or [total_q, num_qo_heads, max_k_tiles], got {list(max_score.shape)}")
        scores = torch_ops.block_scores(q, k, table, info["qo_segment_offsets"], info["kv_segment_lens"],
                                        layout=layout, causal=info["causal"], out=max_score, **seqs)
    return o, scores


def sparse_topk_select(
    max_score: torch.Tensor,
    topk: int,
    num_valid_pages: Optional[Union[int, torch.Tensor]] = None,
    output: Optional[torch.Tensor] = None,
    force_begin_blocks: int = 0,
    force_end_blocks: int = 0,
    max_score_layout: str = "HKT",
    block_table: Optional[torch.Tensor] = None,
    seq_lens: Optional[torch.Tensor] = None,
    block_size: int = 0,
    decode_query_len: int = 0,
) -> torch.Tensor:
    """Top-k 128-key tiles per (token, head) row of max_score (fmha_sm100's sparse_topk_select).

    The valid tiles of a row are [0, num_valid_pages) (all tiles when None); the first force_begin_blocks
    and the last force_end_blocks valid tiles are always kept, the rest by score. Rows are written
    ascending with -1 at the tail. Graph-safe: no host sync.

    Args:
        max_score: fp32 "HKT" [H, max_k_tiles, T] or "THK" [T, H, max_k_tiles] (max_score_layout), any strides.
        topk: tiles per row (1..64 on the GPU; fmha_sm100 serves 16 only).
        num_valid_pages: int in (0, max_k_tiles], or an int32 / int64 tensor [T] of per-token tile counts.
        output: int32 [T, H, topk], any strides; allocated when None.
        block_table: int32 [T, H, max_k_tiles]: each selected tile idx becomes block_table[t, h, idx]
            (-1 slots stay -1). The 2-D TRTLLM form is not served.
        seq_lens, block_size, decode_query_len: parameters of the 2-D block_table form only.

    Returns:
        output, int32 [T, H, topk].
    """
    fn = "msa.fmha_sm100.sparse_topk_select"
    layout = max_score_layout.upper()
    if layout not in ("HKT", "THK"):
        raise ValueError(f"{fn}: argument 'max_score_layout': expected 'HKT' or 'THK', got {max_score_layout!r}")
    if max_score.dim() != 3:
        raise ValueError(f"{fn}: argument 'max_score': expected 3 dimensions, got shape {list(max_score.shape)}")
    if layout == "HKT":
        H, max_k_tiles, T = max_score.shape
    else:
        T, H, max_k_tiles = max_score.shape
    if block_table is not None and block_table.dim() == 2:
        raise NotImplementedError(f"{fn}: argument 'block_table': the 2-D (TRTLLM flat) form is not served; "
                                  f"pass a 3-D [total_q, num_heads, max_k_tiles] table or none")
    if seq_lens is not None:
        raise ValueError(f"{fn}: argument 'seq_lens': only used with a 2-D block_table")
    device = max_score.device
    # Each token is its own request of num_valid_pages * 128 keys, non-causal: its valid blocks are
    # exactly [0, num_valid_pages), and force_end counts back from num_valid_pages, as in fmha_sm100.
    if isinstance(num_valid_pages, torch.Tensor):
        if tuple(num_valid_pages.shape) != (T,):
            raise ValueError(f"{fn}: argument 'num_valid_pages': expected an int or a tensor [total_q = {T}], "
                             f"got shape {list(num_valid_pages.shape)}")
        kv_lens = num_valid_pages.to(torch.int32) * BLOCK
    else:
        nvp = max_k_tiles if num_valid_pages is None else int(num_valid_pages)
        if num_valid_pages is not None and not 0 < nvp <= max_k_tiles:
            raise ValueError(f"{fn}: argument 'num_valid_pages': expected a value in (0, max_k_tiles = "
                             f"{max_k_tiles}], got {nvp}")
        kv_lens = torch.full((T,), nvp * BLOCK, dtype=torch.int32, device=device)
    token_indptr = torch.arange(T + 1, dtype=torch.int32, device=device)
    positions = torch.zeros(T, dtype=torch.int32, device=device)
    selected = torch_ops.select_topk(max_score, token_indptr, kv_lens, topk, qo_offset=positions, layout=layout,
                                     force_begin=force_begin_blocks, force_end=force_end_blocks, causal=False,
                                     out=output if block_table is None else None)
    if block_table is None:
        return selected
    gathered = torch.where(selected >= 0, block_table.gather(2, selected.clamp_min(0).long()), selected)
    if output is None:
        return gathered
    output.copy_(gathered)
    return output
