"""The run-time entry points: attention, the indexer's two steps, the KV-cache writer, and utilities.

Every function takes DLPack tensors of any framework (numpy, torch, cupy, jax, ...): CPU tensors run the
reference backend, CUDA tensors the GPU kernels. Outputs that are not passed are allocated with the
framework and on the device of the first tensor argument (numpy and torch only). `stream=None` launches
on torch's current stream of the tensors' device for torch CUDA tensors, else on stream 0.
"""
from __future__ import annotations

import contextlib
import math
import re

import numpy as np

from . import _C
from ._args import integer, real, sm_scale_value, topk_value
from ._framework import cpu_ints, host_max, new_output, resolve_stream, torch_of

BLOCK = 128  # tokens per selectable block (the contract's fixed block size)
_LAYOUTS = ("HKT", "THK")
_MAX_ROW_BLOCKS = 1 << 24  # kMaxRequestBlocks (core/params.h): the blocks of the longest int32 kv_len


def _dim(x, i: int) -> int:
    """x.shape[i], or 0 when x has too few dimensions (the C++ checks then report the rank)."""
    shape = getattr(x, "shape", ())
    return int(shape[i]) if len(shape) > i else 0


def _layout(fn: str, layout, name: str = "layout") -> str:
    if layout not in _LAYOUTS:
        raise ValueError(f"{fn}: argument '{name}': expected 'HKT' ([num_heads, max_blocks, total_q]) or 'THK' "
                         f"([total_q, num_heads, max_blocks]), got {layout!r}")
    return layout


def attention(plan, q, k_cache, v_cache, page_table, qo_indptr, kv_lens, *, block_idx=None, qo_offset=None,
              page_indptr=None, out=None, lse=None, return_lse=False, sm_scale=None, q_scale=1.0, k_scale=1.0,
              v_scale=1.0, validate=False, stream=None):
    """Paged attention with the plan's configuration: sparse when plan.topk > 0, dense otherwise.

    A plan serves one run at a time: two calls with one plan in flight at once (on two streams, or from two
    threads) share its workspaces and give wrong results; give each stream its own plan (plan.clone()).
    On the CPU the lengths, the page table's entries and the block indexes are always checked (they are
    host-readable there); validate=True asks for the same on CUDA tensors.

    Args:
        plan: msa.Plan from plan_prefill or plan_decode, on the tensors' device.
        q: [total_q, Hq, D], bf16 / fp16 (fp32 also on the CPU).
        k_cache, v_cache: [num_pages, Hkv, page_size, D | Dv], any strides with the innermost dim contiguous
            (sglang's slot-major pool [slots, Hkv, D] is view(pages, page_size, Hkv, D).permute(0, 2, 1, 3);
            K and V may be the two halves of one [pages, Hkv, page_size, 2D] pool). Both in q's dtype, or both
            float8_e4m3fn with k_scale / v_scale.
        page_table: int32, dense [B, max_pages], or flat [n] together with page_indptr [B+1].
        qo_indptr: int32 [B+1], cumulative query tokens per request.
        kv_lens: int32 [B], keys per request.
        block_idx: int32 [total_q, Hkv, topk], any strides (a [Hkv, total_q, topk] tensor .permute(1, 0, 2));
            the selected 128-token blocks of each token and KV head, -1 for empty slots, any order.
            Required for sparse plans, refused for dense ones.
        qo_offset: int32 [B], absolute position of each request's first query; default kv_len - qo_len.
        page_indptr: int32 [B+1] for the flat page_table form.
        out: [total_q, Hq, Dv] in q's dtype; allocated when None.
        lse: fp32 [total_q, Hq], natural-log sum of exp of the scaled logits (-inf for rows that see no key);
            written when given, allocated when None and return_lse.
        return_lse: return (o, lse) instead of o.
        sm_scale: logit scale; None means head_dim ** -0.5.
        q_scale, k_scale, v_scale: per-tensor dequantization scales (finite, > 0), for K/V of any dtype: the
            logits are (q . k) * sm_scale * q_scale * k_scale and the output is softmax @ V * v_scale (an fp8 key's
            value is its e4m3 value times k_scale). Both backends fold q_scale and k_scale into sm_scale.
        validate: CUDA tensors: also read the lengths, the page table and the block indexes on the host and
            report the first bad entry (synchronizes). CPU tensors are always checked so.
        stream: CUDA stream (None: torch's current stream for torch CUDA tensors, else 0).

    Returns:
        o, or (o, lse) when return_lse.
    """
    fn = "msa.attention"
    if not isinstance(plan, _C.Plan):
        raise TypeError(f"{fn}: argument 'plan': expected an msa.Plan from plan_prefill or plan_decode, "
                        f"got {type(plan).__name__}")
    scale = sm_scale_value(fn, sm_scale)
    total_q = _dim(q, 0)
    if out is None:
        out = new_output(fn, "out", q, "q", (total_q, plan.num_qo_heads, plan.head_dim_v), "like")
    if lse is None and return_lse:
        lse = new_output(fn, "lse", q, "q", (total_q, plan.num_qo_heads), "float32")
    _C.attention(plan, q, k_cache, v_cache, page_table, page_indptr, qo_indptr, kv_lens, qo_offset, block_idx,
                 out, lse, scale, bool(validate), resolve_stream(fn, stream, q), real(fn, "q_scale", q_scale),
                 real(fn, "k_scale", k_scale), real(fn, "v_scale", v_scale))
    return (out, lse) if return_lse else out


def block_scores(q, k_index, page_table, qo_indptr, kv_lens, *, qo_offset=None, page_indptr=None, k_scale=None,
                 max_blocks=None, layout="HKT", causal=True, out=None, validate=False, stream=None):
    """Indexer step 1: per query token and index head, the max of the raw q.k over the visible keys of
    each 128-key block (causal, keys < kv_len); -inf where a block has no visible key.

    Args:
        q: [T, H, D], bf16 / fp16 (fp32 also on the CPU).
        k_index: [num_pages, Hk, page_size, D] in q's dtype, or float8_e4m3fn with k_scale; H % Hk == 0.
        page_table, page_indptr, qo_indptr, kv_lens, qo_offset: as for msa.attention.
        k_scale: fp32 [num_pages, Hk, page_size], per-token scales of an fp8 k_index.
        max_blocks: block extent of the output; default ceil(max(kv_lens) / 128), which reads kv_lens on the
            host (pass max_blocks or out for CUDA kv_lens). With out given, out's extent (must match if both).
        layout: "HKT" (scores [H, max_blocks, T]) or "THK" (scores [T, H, max_blocks]).
        causal: keys after the query's position are invisible.
        out: fp32 scores in `layout`; allocated when None.
        validate: CUDA tensors: also check the lengths (against the output's block extent too) and the page
            table on the host (synchronizes). CPU tensors are always checked so.
        stream: as for msa.attention.

    Returns:
        scores, fp32 in `layout`.
    """
    fn = "msa.block_scores"
    _layout(fn, layout)
    if out is None:
        if max_blocks is None:  # a negative length is reported by the C++ checks, by its name
            max_blocks = math.ceil(max(host_max(fn, "kv_lens", kv_lens, "max_blocks= or out="), 0) / BLOCK)
        nb = integer(fn, "max_blocks", max_blocks)
        if not 0 <= nb <= _MAX_ROW_BLOCKS:  # checked before the output is allocated
            raise ValueError(f"{fn}: argument 'max_blocks': expected 0..{_MAX_ROW_BLOCKS} (ceil(2^31 / 128)), "
                             f"got {nb}")
        T, H = _dim(q, 0), _dim(q, 1)
        out = new_output(fn, "out", q, "q", (H, nb, T) if layout == "HKT" else (T, H, nb), "float32")
    elif max_blocks is not None:
        have = _dim(out, 1 if layout == "HKT" else 2)
        if integer(fn, "max_blocks", max_blocks) != have:
            raise ValueError(f"{fn}: argument 'max_blocks': expected the block extent of out ({have}) or None, "
                             f"got {max_blocks}")
    _C.block_scores(q, k_index, k_scale, page_table, page_indptr, qo_indptr, kv_lens, qo_offset, out, layout,
                    bool(causal), bool(validate), resolve_stream(fn, stream, q))
    return out


def select_topk(scores, qo_indptr, kv_lens, topk, *, qo_offset=None, layout="HKT", force_begin=0, force_end=1,
                causal=True, finite_only=False, block_map=None, out=None, out_scores=None, return_scores=False,
                validate=False, stream=None):
    """Indexer step 2: per (token, head) row of scores, the topk best causally valid blocks.

    The valid blocks of a query at position p are [0, p // 128] (all when not causal) within
    [0, ceil(kv_len / 128)); the first force_begin and the last force_end valid blocks are always kept;
    NaN scores rank lowest; ties go to the lower block index. Rows are written ascending with -1 at the
    tail (fewer valid blocks than topk).

    Args:
        scores: fp32 in `layout` ("HKT": [H, max_blocks, T], "THK": [T, H, max_blocks]), e.g. from block_scores.
        qo_indptr, kv_lens, qo_offset: as for msa.attention.
        topk: slots per row (1..64 on the GPU).
        force_begin, force_end: valid blocks always selected at the start and the end (M3: 0 and 1).
        causal: restrict to blocks up to the query's own block.
        finite_only: blocks of non-finite score (NaN, -inf, +inf) are never chosen by score (forced blocks still
            are); a row with fewer finite candidates than topk - forced gets -1 slots after them.
        block_map: int32 [batch_size, >= max_blocks], any strides: a selected block blk of a token of request b
            is written as block_map[b, blk] (e.g. a shard's local block -> its global id); rows stay in the
            order of blk, -1 slots stay -1.
        out: int32 [T, H, topk], any strides; allocated when None.
        out_scores: fp32 [T, H, topk], any strides: the score of each written entry (forced blocks too), NaN at
            the -1 slots; allocated when None and return_scores.
        return_scores: also return out_scores.
        validate: check the lengths against the scores on the host (synchronizes for CUDA tensors).
        stream: as for msa.attention.

    Returns:
        block_idx, int32 [T, H, topk]; (block_idx, out_scores) with return_scores.
    """
    fn = "msa.select_topk"
    _layout(fn, layout)
    topk = topk_value(fn, topk)
    if out is None or (out_scores is None and return_scores):
        T, H = (_dim(scores, 2), _dim(scores, 0)) if layout == "HKT" else (_dim(scores, 0), _dim(scores, 1))
        if out is None:
            out = new_output(fn, "out", scores, "scores", (T, H, max(topk, 0)), "int32")
        if out_scores is None and return_scores:
            out_scores = new_output(fn, "out_scores", scores, "scores", (T, H, max(topk, 0)), "float32")
    _C.select_topk(scores, qo_indptr, kv_lens, topk, qo_offset, layout, integer(fn, "force_begin", force_begin),
                   integer(fn, "force_end", force_end), bool(causal), out, bool(validate),
                   resolve_stream(fn, stream, scores), bool(finite_only), block_map, out_scores)
    return (out, out_scores) if return_scores else out


def merge_candidates(cand_scores, cand_ids, qo_indptr, kv_lens, topk, max_blocks, *, qo_offset=None, force_begin=0,
                     force_end=1, causal=True, out=None, validate=False, stream=None):
    """The global selection from N ranks' candidate lists (the indexer over sharded keys, docs/sharding.md).

    Exactly msa.select_topk with the same arguments over THK score rows of max_blocks blocks that hold each
    candidate's score at its block id and NaN at every other block (a block proposed twice keeps the higher
    score, NaN lowest): one kernel, no such score tensor in memory.

    Args:
        cand_scores: fp32 [N, T, H, k], any strides: the ranks' candidate scores (e.g. select_topk's out_scores).
        cand_ids: int32 [N, T, H, k], any strides: their global block ids; < 0 or >= max_blocks: no candidate.
        qo_indptr, kv_lens, qo_offset: as for msa.attention.
        topk, force_begin, force_end, causal: as for msa.select_topk.
        max_blocks: blocks per row (>= ceil(max kv_len / 128); 32768 at most on the GPU).
        out: int32 [T, H, topk], any strides; allocated when None.
        validate: check the lengths on the host (synchronizes for CUDA tensors).
        stream: as for msa.attention.

    Returns:
        block_idx, int32 [T, H, topk], ascending with -1 at the tail.
    """
    fn = "msa.merge_candidates"
    topk = topk_value(fn, topk)
    if out is None:
        out = new_output(fn, "out", cand_scores, "cand_scores", (_dim(cand_scores, 1), _dim(cand_scores, 2),
                                                                max(topk, 0)), "int32")
    _C.merge_candidates(cand_scores, cand_ids, qo_indptr, kv_lens, qo_offset, integer(fn, "max_blocks", max_blocks),
                        topk, integer(fn, "force_begin", force_begin), integer(fn, "force_end", force_end),
                        bool(causal), out, bool(validate), resolve_stream(fn, stream, cand_scores))
    return out


def merge_states(v_parts, lse_parts, *, out=None, lse_out=None, return_lse=False, stream=None):
    """Merges S partial attention states over disjoint key sets by their LSEs.

    o = sum_s exp(lse_s - lse) * v_s with lse = log(sum_s exp(lse_s)); a part with lse = -inf contributes
    nothing, and a row whose parts are all -inf gives o = 0, lse = -inf.

    Args:
        v_parts: [S, T, H, D], fp32 / bf16 / fp16, innermost dim contiguous.
        lse_parts: fp32 [S, T, H], natural log.
        out: [T, H, D] (fp32 / bf16 / fp16); allocated in v_parts' dtype when None.
        lse_out: fp32 [T, H]; written when given, allocated when None and return_lse.
        return_lse: return (o, lse) instead of o.
        stream: as for msa.attention.

    Returns:
        o, or (o, lse) when return_lse.
    """
    fn = "msa.merge_states"
    T, H, D = _dim(v_parts, 1), _dim(v_parts, 2), _dim(v_parts, 3)
    if out is None:
        out = new_output(fn, "out", v_parts, "v_parts", (T, H, D), "like")
    if lse_out is None and return_lse:
        lse_out = new_output(fn, "lse_out", v_parts, "v_parts", (T, H), "float32")
    _C.merge_states(v_parts, lse_parts, out, lse_out, resolve_stream(fn, stream, v_parts))
    return (out, lse_out) if return_lse else out


def build_page_table(req_to_token, req_pool_indices, seq_lens, page_size, *, max_pages=None, out=None,
                     validate=False, stream=None):
    """Dense page table from a serving engine's token-to-slot map (sglang's req_to_token).

    out[b, p] = req_to_token[req_pool_indices[b], p * page_size] // page_size for
    p < ceil(seq_lens[b] / page_size), and -1 for the rest of the row.

    Args:
        req_to_token: int32 [pool_size, max_context].
        req_pool_indices: int32 / int64 [B], the row of req_to_token of each request.
        seq_lens: int32 / int64 [B], tokens per request.
        page_size: tokens per page.
        max_pages: row width of the output; default ceil(max_context / page_size), enough for any length
            and independent of the lengths (no host read, stable shape across steps).
        out: int32 [B, max_pages] with contiguous rows; allocated when None.
        validate: CUDA tensors: also read req_pool_indices and seq_lens on the host and report the first entry
            outside req_to_token or past out's width (synchronizes). CPU tensors are always checked so.
        stream: as for msa.attention.

    Returns:
        page_table, int32 [B, max_pages].
    """
    fn = "msa.build_page_table"
    page_size = integer(fn, "page_size", page_size)
    if out is None:
        if max_pages is None:
            max_pages = -(-_dim(req_to_token, 1) // page_size) if page_size > 0 else 0
        width = integer(fn, "max_pages", max_pages)
        if width < 0:
            raise ValueError(f"{fn}: argument 'max_pages': expected >= 0, got {width}")
        out = new_output(fn, "out", req_to_token, "req_to_token", (_dim(req_pool_indices, 0), width), "int32")
    _C.build_page_table(req_to_token, req_pool_indices, seq_lens, page_size, out, bool(validate),
                        resolve_stream(fn, stream, req_to_token))
    return out


@contextlib.contextmanager
def _layer_step(fn: str, step: str, **renamed):
    """Errors of one of sparse_attention_layer's steps, worded for its caller: "<step>: argument 'x'" becomes
    "<fn> (<step> step): argument '<the layer's name for x>'"."""
    try:
        yield
    except (ValueError, TypeError, NotImplementedError) as e:
        msg = str(e)
        if not msg.startswith(step + ": "):
            raise
        msg = msg[len(step) + 2:]
        for inner, outer in renamed.items():
            msg = msg.replace(f"argument '{inner}'", f"argument '{outer}'")
        # The step's own names left in the text (e.g. "the dtype of q", "out holds"), translated once at the end.
        legend = [f"{inner} is {outer}" for inner, outer in renamed.items() if re.search(rf"\b{inner}\b", msg)]
        suffix = f" (in the {step[4:]} step, {', '.join(legend)})" if legend else ""
        raise type(e)(f"{fn} ({step[4:]} step): {msg}{suffix}") from None


def sparse_attention_layer(plan, q, k_cache, v_cache, q_index, k_index, page_table, qo_indptr, kv_lens, *,
                           k_index_scale=None, qo_offset=None, page_indptr=None, force_begin=0, force_end=1,
                           scores=None, score_layout="THK", block_idx=None, out=None, lse=None, return_lse=False,
                           return_block_idx=False, sm_scale=None, q_scale=1.0, k_scale=1.0, v_scale=1.0,
                           validate=False, stream=None):
    """One MiniMax-M3 sparse layer: block_scores -> select_topk -> sparse attention, sharing the plan.

    The index queries have one head per KV head (q_index [T, Hkv, Di]); the index-K cache shares the page
    table of k_cache / v_cache. The selection keeps plan.topk blocks per (token, KV head), the first
    force_begin and the last force_end valid ones always (M3: force_end=1, the token's own block).

    Args:
        plan: a sparse msa.Plan (topk > 0); its max_kv_len sizes the score workspace, so decode plans need no
            host read of the lengths and the call can be captured in a CUDA graph.
        q, k_cache, v_cache, page_table, qo_indptr, kv_lens, qo_offset, page_indptr, sm_scale, q_scale, k_scale,
            v_scale, out, lse, return_lse, validate, stream: as for msa.attention (k_scale / v_scale are the
            attention's per-tensor scales; the index keys' per-token scales are k_index_scale; validate runs each
            step's host checks of its values on CUDA tensors, CPU tensors being always checked).
        q_index, k_index, k_index_scale: as q, k_index and k_scale of msa.block_scores.
        scores: fp32 workspace in score_layout with max_blocks >= ceil(plan.max_kv_len / 128); allocated when None.
        block_idx: int32 [T, Hkv, topk] workspace for the selection (any strides); allocated when None.
        return_block_idx: also return the selection.

    Returns:
        o, then lse when return_lse, then block_idx when return_block_idx (a tuple when more than o).
    """
    fn = "msa.sparse_attention_layer"
    if not isinstance(plan, _C.Plan):
        raise TypeError(f"{fn}: argument 'plan': expected an msa.Plan, got {type(plan).__name__}")
    if q is None or k_cache is None or v_cache is None:  # the attention step's own, refused before the indexer runs
        name = "q" if q is None else "k_cache" if k_cache is None else "v_cache"
        raise ValueError(f"{fn}: argument '{name}' is required")
    if plan.topk <= 0:
        raise ValueError(f"{fn}: argument 'plan': expected a sparse plan (topk > 0), got topk = {plan.topk}")
    if _dim(q_index, 1) != plan.num_kv_heads:
        raise ValueError(f"{fn}: argument 'q_index': expected [total_q, num_kv_heads = {plan.num_kv_heads}, D] "
                         f"(one index head per KV head), got shape {tuple(getattr(q_index, 'shape', ()))}")
    if k_index is not None and (len(getattr(k_index, "shape", ())) != 4 or _dim(k_index, 2) != plan.page_size):
        # k_index shares the page table with the KV cache: its pages must hold the plan's page_size tokens.
        raise ValueError(f"{fn}: argument 'k_index': expected [num_pages, num_k_heads, page_size = "
                         f"{plan.page_size}, D] (pages of the KV cache's page table), got shape "
                         f"{tuple(getattr(k_index, 'shape', ()))}")
    _layout(fn, score_layout, "score_layout")
    if plan.phase == "decode" and plan.device == "cpu":
        # The lengths against the plan's bound before the indexer steps (as msa::sparse_attention_layer does),
        # whose messages would speak of a scores workspace too small for them.
        lens = cpu_ints(kv_lens)
        over = np.flatnonzero(lens > plan.max_kv_len) if lens is not None and lens.ndim == 1 else ()
        if len(over):
            b = int(over[0])
            raise ValueError(f"{fn}: argument 'kv_lens': request {b} has kv_len = {int(lens[b])}, more than the "
                             f"plan's max_kv_len = {plan.max_kv_len} (the bound given to plan_decode)")
    max_blocks = math.ceil(plan.max_kv_len / BLOCK)
    if stream is not None:  # checked once here; None is resolved by each call (torch's current stream)
        stream = resolve_stream(fn, stream, q)
    with _layer_step(fn, "msa.block_scores", q="q_index", k_scale="k_index_scale", out="scores",
                     layout="score_layout"):
        scores = block_scores(q_index, k_index, page_table, qo_indptr, kv_lens, qo_offset=qo_offset,
                              page_indptr=page_indptr, k_scale=k_index_scale,
                              max_blocks=None if scores is not None else max_blocks, layout=score_layout,
                              causal=plan.causal, out=scores, validate=validate, stream=stream)
    with _layer_step(fn, "msa.select_topk", out="block_idx", layout="score_layout", topk="plan.topk"):
        block_idx = select_topk(scores, qo_indptr, kv_lens, plan.topk, qo_offset=qo_offset, layout=score_layout,
                                force_begin=force_begin, force_end=force_end, causal=plan.causal, out=block_idx,
                                validate=validate, stream=stream)
    res = attention(plan, q, k_cache, v_cache, page_table, qo_indptr, kv_lens, block_idx=block_idx,
                    qo_offset=qo_offset, page_indptr=page_indptr, out=out, lse=lse, return_lse=return_lse,
                    sm_scale=sm_scale, q_scale=q_scale, k_scale=k_scale, v_scale=v_scale, validate=validate,
                    stream=stream)
    if not return_block_idx:
        return res
    return (*res, block_idx) if return_lse else (res, block_idx)


def write_cache(src, cache, slot_ids, *, scale=None, slot_scale=None, validate=False, stream=None):
    """Writes the rows of new tokens into a paged cache at their slots, converting to the cache's dtype
    (the K, V and index-K writes of every engine step; contract §7).

    Row (i, h) of src goes to page slot_ids[i] // page_size, offset slot_ids[i] % page_size, head h; a
    negative slot id skips its row (padding). A cache of src's dtype gets a plain copy. A float8_e4m3fn cache
    gets e4m3(satfinite(src / scale)): fp32 division, rounded to nearest even, saturating at +-448 (infinities
    too), NaN stored as 0x7f; a stored value means its e4m3 value times the scale. With slot_scale (the fp8
    index keys' per-token k_scale of msa.block_scores), each row's scale is amax(|finite elements|) / 448, or 1
    where that is 0, and is written to slot_scale beside the row.

    Graph-safe on CUDA: no allocation and no host read of the slot ids, so a captured call writes wherever the
    ids say at replay. A slot id >= num_pages * page_size is refused on the CPU and with validate=True, skipped
    by the GPU kernel (never written out of bounds). Duplicate slot ids are a caller error: the CPU keeps the
    last row; which row a GPU slot keeps (and, with slot_scale, whether row and scale come from one writer) is
    unspecified.

    Args:
        src: [n, H, D], bf16 / fp16 (fp32 also on the CPU), innermost dim contiguous.
        cache: [num_pages, H, page_size, D] in src's dtype or float8_e4m3fn, any strides with the innermost dim
            contiguous: sglang's slot-major pool [slots, H, D] is view(pages, page_size, H, D).permute(0, 2, 1, 3),
            and the K and V halves of an interleaved [pages, H, page_size, 2D] pool are [..., :D] and [..., D:].
        slot_ids: int32 / int64 [n] on the cache's device.
        scale: the per-tensor scale of an fp8 cache, a host number > 0 (used as float32); None means 1.
            Only for fp8 caches, and not together with slot_scale.
        slot_scale: fp32 [num_pages, H, page_size] (any strides), written with per-row scales; fp8 caches only.
        validate: CUDA tensors: read the slot ids on the host and report the first one past the cache
            (synchronizes). CPU slot ids are always checked.
        stream: as for msa.attention.
    """
    fn = "msa.write_cache"
    if scale is None:
        value = 1.0
    else:
        torch = torch_of(scale)
        if torch is not None and scale.device.type != "cpu":
            raise TypeError(f"{fn}: argument 'scale': expected a host number, got a tensor on {scale.device} "
                            f"(reading it would synchronize; pass float(scale) once, outside graph capture)")
        value = real(fn, "scale", scale)
        if not (math.isfinite(value) and value > 0.0):
            raise ValueError(f"{fn}: argument 'scale': expected a finite number > 0, got {value}")
    _C.write_cache(src, cache, slot_ids, value, slot_scale, bool(validate), resolve_stream(fn, stream, src))
