"""Sequence-sharded indexer and sparse attention over a group of ranks (docs/sharding.md).

Each rank owns some 128-token blocks of every request: their index keys and (for context parallelism) their
K/V pages. A rank scores only its own blocks, for all index heads, and keeps its best `topk` per (token, head)
as candidates (score, global block id). The union of the ranks' candidates contains the global top-k, so the
merge, msa.select_topk over the candidates' scores with every other block left out, gives the single-device
selection exactly: same scores (the same kernel over the same keys), same order (score, then lower block index),
same causal validity and forced blocks. For context parallelism each rank then attends its own selected blocks
and the partial (o, lse) of all ranks are merged by LSE (msa.merge_states).

    shard = Shard.round_robin(rank, world, batch_size, max_blocks, device)   # or contiguous / from_owner
    step = DecodeStep(shard, local_page_table, qo_indptr, kv_lens, q.shape[0])  # once per forward step
    block_idx = sharded_indexer(group, step, q_index, local_k_index, topk)   # tensor parallel: the indexer
    o = sharded_layer(group, step, plan, q, k_cache, v_cache, q_index, k_index, topk)  # context parallel

The exchanges are torch.distributed collectives (all_gather_into_tensor). The emulate_* functions run the same
steps for N ranks in one process (tests, CPU). A DecodeStep and the decode calls read nothing on the host and
keep fixed shapes: they can be captured in a CUDA graph (with NCCL collectives inside the capture).

A rank's local view of a request: its owned blocks in ascending global order, local block j = global block
shard.owned[b, j]; its local page table row maps local logical pages (page_size divides 128) to its pool.
"""
from __future__ import annotations

from ._framework import require_torch

torch = require_torch("msa.distributed", "shards the indexer and sparse attention over torch.distributed ranks")

from . import ops as _msa  # noqa: E402
from .plan import plan_decode as _plan_decode, plan_prefill as _plan_prefill  # noqa: E402

BLOCK = _msa.BLOCK


# ---------------------------------------------------------------------------------------------------
# Ownership
# ---------------------------------------------------------------------------------------------------

class Shard:
    """Which blocks of every request one rank owns.

    owned:    int32 [B, local_blocks]: global id of the rank's local block j, ascending, -1 past the last.
    local_of: int32 [B, max_blocks + 1]: local id of a global block, -1 where another rank owns it (and in the
              last column, where empty candidates are sent).
    before:   int32 [B, max_blocks + 1]: how many of the rank's blocks lie below a global block.
    """

    def __init__(self, owned, max_blocks: int, rank: int = 0, world_size: int = 1):
        owned = owned.to(torch.int32)
        B, nl = owned.shape
        self.rank, self.world_size, self.max_blocks = rank, world_size, int(max_blocks)
        self.owned = owned
        dev = owned.device
        local_of = torch.full((B, self.max_blocks + 1), -1, dtype=torch.int32, device=dev)
        cols = torch.where(owned >= 0, owned, self.max_blocks).long()
        local_of.scatter_(1, cols, torch.arange(nl, dtype=torch.int32, device=dev).expand(B, nl).contiguous())
        local_of[:, self.max_blocks] = -1
        self.local_of = local_of
        mine = (local_of >= 0).to(torch.int32)
        self.before = torch.cumsum(mine, 1, dtype=torch.int32) - mine

    @property
    def batch_size(self) -> int:
        return self.owned.shape[0]

    @property
    def local_blocks(self) -> int:
        return self.owned.shape[1]

    @classmethod
    def round_robin(cls, rank: int, world_size: int, batch_size: int, max_blocks: int, device="cpu"):
        """Block g belongs to rank g % world_size: balanced at every length, no host read, the same for every
        request (decode appends rotate over the ranks)."""
        nl = -(-max_blocks // world_size)
        g = torch.arange(nl, dtype=torch.int32, device=device) * world_size + rank
        g = torch.where(g < max_blocks, g, -1)
        return cls(g.expand(batch_size, nl).contiguous(), max_blocks, rank, world_size)

    @classmethod
    def contiguous(cls, rank: int, bounds, max_blocks: int, device="cpu"):
        """Rank r owns blocks [bounds[b, r], bounds[b, r + 1]) of request b (bounds: [B, world_size + 1],
        non-decreasing; uneven shards allowed)."""
        bounds = torch.as_tensor(bounds, dtype=torch.int64, device=device)
        world = bounds.shape[1] - 1
        b0, b1 = bounds[:, rank:rank + 1], bounds[:, rank + 1:rank + 2]
        nl = max(int((bounds[:, 1:] - bounds[:, :-1]).max()) if bounds.numel() else 0, 1)
        g = b0 + torch.arange(nl, device=device)
        return cls(torch.where(g < b1, g, -1), max_blocks, rank, world)

    @classmethod
    def from_owner(cls, owner, rank: int, world_size: int):
        """owner: int [B, max_blocks], the rank of every block."""
        owner = torch.as_tensor(owner)
        B, nb = owner.shape
        mine = owner == rank
        nl = max(int(mine.sum(1).max()) if B else 0, 1)
        owned = torch.full((B, nl), -1, dtype=torch.int32, device=owner.device)
        for b in range(B):
            ids = torch.nonzero(mine[b]).flatten().to(torch.int32)
            owned[b, :ids.numel()] = ids
        return cls(owned, nb, rank, world_size)


def shard_page_table(page_table, shard: Shard, page_size: int):
    """The rank's local page table [B, local_blocks * 128 / page_size] from a global dense one: the pages
    of its blocks in order, -1 past them. For engines that keep one logical-to-physical map of a pool that
    every rank addresses (and for emulated ranks); an engine with a pool per rank keeps the local table."""
    if BLOCK % page_size:
        raise ValueError(f"msa.distributed.shard_page_table: argument 'page_size': expected a divisor of "
                         f"{BLOCK}, got {page_size}")
    ppb = BLOCK // page_size
    B, nl = shard.owned.shape
    cols = (shard.owned.long().unsqueeze(2) * ppb + torch.arange(ppb, device=shard.owned.device)).view(B, nl * ppb)
    ok = (shard.owned >= 0).repeat_interleave(ppb, 1) & (cols < page_table.shape[1])
    out = torch.gather(page_table, 1, torch.where(ok, cols, 0))
    return torch.where(ok, out, -1).to(torch.int32)


def _visible(shard: Shard, req, x):
    """Local keys below global key count x (int64 [n]) of request req: a prefix of the local keys, since
    the owned blocks are ascending."""
    stride = shard.max_blocks + 1
    fb = torch.clamp(torch.div(x, BLOCK, rounding_mode="floor"), 0, shard.max_blocks)
    flat = req * stride + fb
    before = shard.before.reshape(-1)[flat].long()
    partial = torch.where(shard.local_of.reshape(-1)[flat] >= 0, x - fb * BLOCK, 0)
    return before * BLOCK + partial


def _token_places(qo_indptr, kv_lens, qo_offset, T, causal):
    """Per token: its request, and the global keys it sees (a count: keys [0, x))."""
    dev = qo_indptr.device
    B = kv_lens.shape[0]
    t = torch.arange(T, device=dev, dtype=torch.int64)
    ind = qo_indptr.long()
    req = torch.clamp(torch.searchsorted(ind[1:], t, right=True), max=max(B - 1, 0))
    kv = kv_lens.long()[req]
    live = t < ind[B]
    off = qo_offset.long()[req] if qo_offset is not None else kv - (ind[req + 1] - ind[req])
    pos = off + t - ind[req]
    x = torch.minimum(kv, pos + 1) if causal else kv
    return req, torch.where(live, torch.clamp(x, min=0), 0)


# ---------------------------------------------------------------------------------------------------
# Per-step views of a rank's blocks
# ---------------------------------------------------------------------------------------------------

class DecodeStep:
    """A rank's view of a decode step: every query token is a request of its own over the rank's keys that it
    sees (a prefix of the local keys), non-causal. Device ops only, fixed shapes ([T] tokens from q's rows):
    built inside a CUDA-graph capture it replays for new lengths. Shared by every layer of the step."""

    def __init__(self, shard: Shard, local_page_table, qo_indptr, kv_lens, num_tokens: int, *, qo_offset=None,
                 causal=True):
        T = int(num_tokens)  # q's rows, fixed for a captured graph; rows past qo_indptr[B] see nothing
        self.shard, self.causal, self.num_tokens = shard, bool(causal), T
        self.qo_indptr, self.kv_lens, self.qo_offset = qo_indptr, kv_lens, qo_offset
        dev = shard.owned.device
        self.req, x = _token_places(qo_indptr, kv_lens, qo_offset, T, causal)
        self.local_kv = _visible(shard, self.req, x).to(torch.int32)        # [T] local keys seen
        self.table = local_page_table[self.req].contiguous()                  # [T, local pages]
        self.owned = shard.owned.index_select(0, self.req)                    # [T, local blocks]: global ids
        self.indptr = torch.arange(T + 1, dtype=torch.int32, device=dev)
        self.zeros = torch.zeros(T, dtype=torch.int32, device=dev)

    def plan(self, *, num_qo_heads, num_kv_heads, head_dim=128, head_dim_v=0, page_size=128, topk=16, **kw):
        """The decode plan of local_attention: T one-token requests over at most the rank's blocks."""
        return _plan_decode(self.num_tokens, 1, self.shard.local_blocks * BLOCK, num_qo_heads=num_qo_heads,
                                num_kv_heads=num_kv_heads, head_dim=head_dim, head_dim_v=head_dim_v,
                                page_size=page_size, topk=topk, causal=False, device=self.shard.owned.device, **kw)

    def _groups(self):
        return [(None, self.table, self.indptr, self.local_kv, self.zeros, False, self.owned)]


class PrefillStep:
    """A rank's view of a prefill step (host lengths, as msa.plan_prefill reads them). The tokens of a request
    fall in runs: tokens before the rank's first block see none of its keys; a run whose visible local keys grow
    by one per token (inside an owned block) is a causal sub-request with a local offset; a run that sees a fixed
    count (tokens past an owned block) is a non-causal sub-request. The two groups run as two batches of the
    same kernels (contiguous shards: at most one of each per request; round-robin: one per block of the chunk).

    qo_lens, kv_lens, qo_offset: host sequences; qo_indptr etc. are rebuilt from them on the shard's device.
    """

    def __init__(self, shard: Shard, local_page_table, qo_lens, kv_lens, *, qo_offset=None, causal=True):
        import numpy as np
        self.shard, self.causal = shard, bool(causal)
        dev = shard.owned.device
        ql = np.asarray(qo_lens, np.int64)
        kl = np.asarray(kv_lens, np.int64)
        off = np.asarray(qo_offset, np.int64) if qo_offset is not None else kl - ql
        self.qo_lens, self.kv_lens_host, self.qo_offset_host = ql, kl, off
        B = len(ql)
        indptr = np.concatenate([[0], np.cumsum(ql)])
        self.num_tokens = T = int(indptr[-1])
        self.qo_indptr = torch.tensor(indptr, dtype=torch.int32, device=dev)
        self.kv_lens = torch.tensor(kl, dtype=torch.int32, device=dev)
        self.qo_offset = torch.tensor(off, dtype=torch.int32, device=dev)
        req = np.repeat(np.arange(B), ql)
        pos = off[req] + np.arange(T) - indptr[req]
        x = np.minimum(kl[req], pos + 1) if causal else kl[req]
        x = np.maximum(x, 0)
        c = _visible(shard, torch.as_tensor(req, device=dev), torch.as_tensor(x, device=dev)).cpu().numpy()
        groups = {True: [], False: []}  # causal -> [(request, first token, count, local kv, local offset)]
        for b in range(B):
            i, end = int(indptr[b]), int(indptr[b + 1])
            while i < end:
                if c[i] == 0:
                    i += 1
                    continue
                j = i + 1
                if j < end and c[j] == c[i]:
                    while j < end and c[j] == c[i]:
                        j += 1
                    groups[False].append((b, i, j - i, int(c[i]), 0))
                else:
                    while j < end and c[j] == c[j - 1] + 1:
                        j += 1
                    groups[True].append((b, i, j - i, int(c[j - 1]), int(c[i]) - 1))
                i = j
        self.segments = groups
        self._tables = {}
        for flag, segs in groups.items():
            if not segs:
                continue
            reqs = torch.tensor([s[0] for s in segs], dtype=torch.int64, device=dev)
            rows = torch.tensor(np.concatenate([np.arange(s[1], s[1] + s[2]) for s in segs]), device=dev)
            lens = [s[2] for s in segs]
            self._tables[flag] = (rows, local_page_table[reqs].contiguous(),
                                  torch.tensor(np.concatenate([[0], np.cumsum(lens)]), dtype=torch.int32, device=dev),
                                  torch.tensor([s[3] for s in segs], dtype=torch.int32, device=dev),
                                  torch.tensor([s[4] for s in segs], dtype=torch.int32, device=dev), flag,
                                  shard.owned.index_select(0, reqs))

    def plans(self, *, num_qo_heads, num_kv_heads, head_dim=128, head_dim_v=0, page_size=128, topk=16, **kw):
        """The prefill plans of local_attention, one per group ({causal: plan}; a group without tokens has none)."""
        out = {}
        for flag, segs in self.segments.items():
            if segs:
                out[flag] = _plan_prefill([s[2] for s in segs], [s[3] for s in segs], qo_offset=[s[4] for s in segs],
                                             num_qo_heads=num_qo_heads, num_kv_heads=num_kv_heads, head_dim=head_dim,
                                             head_dim_v=head_dim_v, page_size=page_size, topk=topk, causal=flag,
                                             device=self.shard.owned.device, **kw)
        return out

    def _groups(self):
        return list(self._tables.values())


# ---------------------------------------------------------------------------------------------------
# The steps: local candidates, their merge, local attention and its merge
# ---------------------------------------------------------------------------------------------------

def local_candidates(step, q_index, k_index, topk: int, *, k_scale=None, out=None):
    """The rank's best topk blocks per (token, index head) among its own blocks: (scores fp32 [T, H, topk],
    global block ids int32 [T, H, topk]); empty slots have score NaN and id -1.

    q_index: [T, H, D], every index head of the layer; k_index: the rank's index-K pages
    [pages, Hk, page_size, D] (H % Hk == 0), fp8 with k_scale as for msa.block_scores.
    out: int32 [T, H, topk, 2] to write into, (score bits, id) per slot: the buffer an exchange sends as it is;
    the returned scores and ids are then its two strided halves."""
    T, H = q_index.shape[0], q_index.shape[1]
    if out is None:
        out = torch.empty((T, H, topk, 2), dtype=torch.int32, device=q_index.device)
    cand_s, cand_i = _unpack(out)
    nl = step.shard.local_blocks
    covered = False
    for rows, table, indptr, lkv, off, flag, owned in step._groups():
        if rows is not None and rows.numel() == T:
            rows = None  # the group holds every token, in order (its rows are distinct and ascending)
        q = q_index if rows is None else q_index.index_select(0, rows)
        scores = _msa.block_scores(q, k_index, table, indptr, lkv, qo_offset=off, k_scale=k_scale, max_blocks=nl,
                                   layout="THK", causal=flag)
        # Local block j of a (sub-)request is global block owned[request, j]: select_topk writes the global ids
        # and the scores of its picks (NaN, -1 at the empty slots).
        if rows is None:
            _msa.select_topk(scores, indptr, lkv, topk, qo_offset=off, layout="THK", force_begin=0, force_end=0,
                             causal=flag, block_map=owned, out=cand_i, out_scores=cand_s)
            covered = True
            continue
        ids, sc = _msa.select_topk(scores, indptr, lkv, topk, qo_offset=off, layout="THK", force_begin=0,
                                   force_end=0, causal=flag, block_map=owned, return_scores=True)
        if not covered:  # tokens in no group see none of the rank's keys
            cand_s.fill_(float("nan"))
            cand_i.fill_(-1)
            covered = True
        cand_s.index_copy_(0, rows, sc)
        cand_i.index_copy_(0, rows, ids)
    if not covered:
        cand_s.fill_(float("nan"))
        cand_i.fill_(-1)
    return cand_s, cand_i


def _request_of_rows(step, rows):
    """The request of each of the given token rows of a PrefillStep."""
    return torch.searchsorted(step.qo_indptr[1:].long(), rows, right=True)


def merge_candidates(cand_scores, cand_ids, qo_indptr, kv_lens, topk: int, max_blocks: int, *, qo_offset=None,
                     force_begin=0, force_end=1, causal=True, out=None):
    """The global selection from the ranks' candidates ([N, T, H, k] each, or lists of [T, H, k]): msa.merge_candidates,
    i.e. msa.select_topk with the single-device arguments over score rows holding the candidates' scores and NaN
    elsewhere (NaN ranks below every score, -inf included, so a block that no rank proposed never displaces one that
    was). Equal to the single-device selection (docs/sharding.md, "Why the merge is exact")."""
    if isinstance(cand_scores, (list, tuple)):
        cand_scores, cand_ids = torch.stack(list(cand_scores)), torch.stack(list(cand_ids))
    return _msa.merge_candidates(cand_scores, cand_ids, qo_indptr, kv_lens, topk, max_blocks, qo_offset=qo_offset,
                                 force_begin=force_begin, force_end=force_end, causal=causal, out=out)


def local_block_idx(step, block_idx):
    """The global selection restricted to the rank's blocks, in local ids (-1 elsewhere), [T, H, topk]."""
    shard = step.shard
    T = block_idx.shape[0]
    req = step.req if isinstance(step, DecodeStep) else _request_of_rows(
        step, torch.arange(T, device=block_idx.device))
    g = block_idx.long()
    g = torch.where(g >= 0, g.clamp(max=shard.max_blocks), shard.max_blocks)
    flat = req.view(T, 1, 1) * (shard.max_blocks + 1) + g
    return shard.local_of.reshape(-1)[flat].to(torch.int32)


def local_attention(step, plan, q, k_cache, v_cache, block_idx, *, sm_scale=None, q_scale=1.0, k_scale=1.0,
                    v_scale=1.0):
    """Sparse attention of every query token over the selected blocks that the rank owns: partial
    (o [T, Hq, Dv] in q's dtype, lse fp32 [T, Hq]); o = 0 and lse = -inf where it owns none of them.

    plan: step.plan(...) for a DecodeStep, step.plans(...) (a dict) for a PrefillStep. block_idx: the global
    selection [T, Hkv, topk]; k_cache / v_cache: the rank's pages."""
    T, Hq = q.shape[0], q.shape[1]
    Dv = v_cache.shape[-1]
    local = local_block_idx(step, block_idx)
    kw = dict(sm_scale=sm_scale, q_scale=q_scale, k_scale=k_scale, v_scale=v_scale)
    if isinstance(step, DecodeStep):
        return _msa.attention(plan, q, k_cache, v_cache, step.table, step.indptr, step.local_kv, block_idx=local,
                              qo_offset=step.zeros, return_lse=True, **kw)
    o = torch.zeros((T, Hq, Dv), dtype=q.dtype, device=q.device)
    lse = torch.full((T, Hq), float("-inf"), dtype=torch.float32, device=q.device)
    for rows, table, indptr, lkv, off, flag, _ in step._groups():
        og, lg = _msa.attention(plan[flag], q.index_select(0, rows), k_cache, v_cache, table, indptr, lkv,
                                block_idx=local.index_select(0, rows), qo_offset=off, return_lse=True, **kw)
        o.index_copy_(0, rows, og)
        lse.index_copy_(0, rows, lg)
    return o, lse


# ---------------------------------------------------------------------------------------------------
# Over a torch.distributed group
# ---------------------------------------------------------------------------------------------------

def _all_gather(group, t):
    import torch.distributed as dist
    n = dist.get_world_size(group)
    out = t.new_empty((n * t.shape[0], *t.shape[1:]))  # the concatenated form (gloo takes no stacked one)
    dist.all_gather_into_tensor(out, t.contiguous(), group=group)
    return out.view(n, *t.shape)


def exchange_candidates(group, cand_scores, cand_ids):
    """All ranks' candidates, [N, T, H, k] each (the two strided halves of the gathered buffer): one all-gather of
    (score, id) packed as 8 bytes per slot."""
    packed = torch.stack([cand_scores.view(torch.int32), cand_ids], dim=-1)  # bit copies, no float arithmetic
    return _unpack(_all_gather(group, packed))


def _unpack(packed):
    """(scores, ids) of a packed [..., 2] int32 candidate buffer, as strided views (merge_candidates takes them)."""
    return packed[..., 0].view(torch.float32), packed[..., 1]


def sharded_indexer(group, step, q_index, k_index, topk: int, *, k_scale=None, force_begin=0, force_end=1,
                    out=None):
    """The indexer step of a sparse layer with the index keys sharded over the group: every rank scores its own
    blocks for all index heads, the candidates are all-gathered and every rank merges them into the global
    selection [T, H, topk] (the single-device one). Tensor parallelism: a rank then uses the rows of its heads."""
    packed = torch.empty((q_index.shape[0], q_index.shape[1], topk, 2), dtype=torch.int32, device=q_index.device)
    local_candidates(step, q_index, k_index, topk, k_scale=k_scale, out=packed)  # sent as written: no packing copy
    s_all, i_all = _unpack(_all_gather(group, packed))
    return merge_candidates(s_all, i_all, step.qo_indptr, step.kv_lens, topk, step.shard.max_blocks,
                            qo_offset=step.qo_offset, force_begin=force_begin, force_end=force_end,
                            causal=step.causal, out=out)


def merge_partials(o_parts, lse_parts, *, out=None):
    """The LSE merge of the ranks' partial outputs ([N, T, Hq, Dv], [N, T, Hq]) into o (msa.merge_states)."""
    return _msa.merge_states(o_parts, lse_parts, out=out)


def sharded_layer(group, step, plan, q, k_cache, v_cache, q_index, k_index, topk: int, *, k_index_scale=None,
                  force_begin=0, force_end=1, sm_scale=None, q_scale=1.0, k_scale=1.0, v_scale=1.0, out=None,
                  return_block_idx=False):
    """One sparse layer under context parallelism: sharded_indexer, attention over each rank's selected
    blocks, all-gather of the partial (o, lse) and their LSE merge. Every rank returns the full output."""
    block_idx = sharded_indexer(group, step, q_index, k_index, topk, k_scale=k_index_scale,
                                force_begin=force_begin, force_end=force_end)
    o, lse = local_attention(step, plan, q, k_cache, v_cache, block_idx, sm_scale=sm_scale, q_scale=q_scale,
                             k_scale=k_scale, v_scale=v_scale)
    o = merge_partials(_all_gather(group, o), _all_gather(group, lse), out=out)
    return (o, block_idx) if return_block_idx else o


# ---------------------------------------------------------------------------------------------------
# Emulated ranks: the same steps for N ranks in one process
# ---------------------------------------------------------------------------------------------------

def emulate_indexer(steps, q_index, k_indexes, topk: int, *, k_scales=None, force_begin=0, force_end=1):
    """sharded_indexer for the ranks of `steps` (one step per rank, with its k_index in k_indexes)."""
    cands = [local_candidates(st, q_index, k, topk, k_scale=None if k_scales is None else k_scales[r])
             for r, (st, k) in enumerate(zip(steps, k_indexes))]
    st = steps[0]
    return merge_candidates([c[0] for c in cands], [c[1] for c in cands], st.qo_indptr, st.kv_lens, topk,
                            st.shard.max_blocks, qo_offset=st.qo_offset, force_begin=force_begin,
                            force_end=force_end, causal=st.causal)


def emulate_layer(steps, plans, q, k_caches, v_caches, q_index, k_indexes, topk: int, *, k_index_scales=None,
                  force_begin=0, force_end=1, sm_scale=None, q_scale=1.0, k_scale=1.0, v_scale=1.0):
    """sharded_layer for the ranks of `steps`: (o, block_idx)."""
    block_idx = emulate_indexer(steps, q_index, k_indexes, topk, k_scales=k_index_scales, force_begin=force_begin,
                                force_end=force_end)
    parts = [local_attention(st, p, q, k, v, block_idx, sm_scale=sm_scale, q_scale=q_scale, k_scale=k_scale,
                             v_scale=v_scale) for st, p, k, v in zip(steps, plans, k_caches, v_caches)]
    o = merge_partials(torch.stack([p[0] for p in parts]), torch.stack([p[1] for p in parts]))
    return o, block_idx
