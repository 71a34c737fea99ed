"""Test utilities shared by the CPU and GPU Python tests: random problems and float64 references.

Everything here is numpy (float64 references written plainly from the contract) so that the GPU tests can
compare torch CUDA results with it after `.cpu().numpy()`. torch is imported lazily by `to_torch`.

    prob = make_problem(rng, qo_lens=[5, 130], kv_lens=[300, 700], pattern="random")
    o_ref, lse_ref = ref_attention(prob)
    t = to_torch(prob, device="cuda", dtype=torch.bfloat16)   # tensors with prob's strides
    assert_close(o, o_ref)

Problem fields (numpy): q [T, Hq, D], k_cache / v_cache [pages, Hkv, P, D|Dv] (maybe strided views of a
slot-major pool), page_table (dense [B, max_pages] or flat [n]), page_indptr ([B+1] or None), qo_indptr [B+1],
kv_lens [B], qo_offset [B] or None, block_idx [T, Hkv, topk] or None (maybe a transposed view of [Hkv, T, topk]),
plus the scalars num_qo_heads, num_kv_heads, head_dim, head_dim_v, page_size, topk, causal, sm_scale.
Float data are float32 values already rounded to the requested dtype's precision ("bf16", "fp16", "fp32").
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import numpy as np

BLOCK = 128


def round_to(x: np.ndarray, dtype: str) -> np.ndarray:
    """Rounds float values to bf16 / fp16 precision (nearest even), returned as float32."""
    x = np.asarray(x, dtype=np.float32)
    if dtype == "fp32":
        return x.copy()
    if dtype == "fp16":
        return x.astype(np.float16).astype(np.float32)
    if dtype == "bf16":
        u = x.view(np.uint32).astype(np.uint64)
        u = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) << 16
        return u.astype(np.uint32).view(np.float32)
    raise ValueError(dtype)


@dataclass
class Problem:
    q: np.ndarray
    k_cache: np.ndarray
    v_cache: np.ndarray
    page_table: np.ndarray
    page_indptr: np.ndarray | None
    qo_indptr: np.ndarray
    kv_lens: np.ndarray
    qo_offset: np.ndarray | None
    block_idx: np.ndarray | None
    num_qo_heads: int
    num_kv_heads: int
    head_dim: int
    head_dim_v: int
    page_size: int
    topk: int
    causal: bool
    sm_scale: float
    dtype: str = "bf16"
    extra: dict = field(default_factory=dict)

    @property
    def batch_size(self) -> int:
        return len(self.kv_lens)

    @property
    def qo_lens(self) -> np.ndarray:
        return np.diff(self.qo_indptr)

    def offsets(self) -> np.ndarray:
        if self.qo_offset is not None:
            return self.qo_offset.astype(np.int64)
        return self.kv_lens.astype(np.int64) - self.qo_lens.astype(np.int64)

    def positions(self) -> np.ndarray:
        """Absolute position p of every query token, [T]."""
        off = self.offsets()
        return np.concatenate([off[b] + np.arange(n) for b, n in enumerate(self.qo_lens)]).astype(np.int64) \
            if self.qo_indptr[-1] else np.zeros(0, np.int64)

    def request_of_token(self) -> np.ndarray:
        return np.repeat(np.arange(self.batch_size), self.qo_lens)


def _selection(rng, nvalid: int, own: int, topk: int, pattern: str, pool: np.ndarray | None,
               shared_row: np.ndarray | None) -> list[int]:
    """Blocks for one (token, KV head): the own block plus topk-1 among the earlier valid ones."""
    if shared_row is not None:
        return [int(b) for b in shared_row if b <= own and b < nvalid]
    earlier = np.arange(own)
    if pattern == "clustered" and pool is not None:
        cand = np.unique(np.concatenate([[0], pool[pool < own]]))
        cand = cand[cand < own]
    else:
        cand = earlier
    take = min(topk - 1, len(cand))
    chosen = rng.choice(cand, size=take, replace=False) if take else np.zeros(0, np.int64)
    if pattern == "clustered" and own > 0 and 0 not in chosen and take:
        chosen[0] = 0
    return [own] + [int(c) for c in chosen]


def make_problem(rng: np.random.Generator, *, qo_lens, kv_lens, qo_offset=None, num_qo_heads=16, num_kv_heads=1,
                 head_dim=128, head_dim_v=None, page_size=128, topk=16, causal=True, pattern="random",
                 neg_slot_prob=0.2, shuffle_rows=True, flat_pages=False, slot_major=False, index_layout="THK",
                 dtype="bf16", spare_pages=3, sm_scale=None, empty_row_prob=0.0) -> Problem:
    """A random problem. pattern: "random" | "clustered" | "shared" | None (dense: no block_idx).

    Selections hold each token's own block (the block of its position) plus earlier ones; -1 slots are
    scattered anywhere in a row (probability neg_slot_prob per spare slot) and rows are shuffled. With
    empty_row_prob > 0 some rows are all -1 (their queries see nothing: o = 0, lse = -inf).
    """
    qo_lens = np.asarray(qo_lens, np.int32)
    kv_lens = np.asarray(kv_lens, np.int32)
    B = len(kv_lens)
    Hq, Hkv, D = num_qo_heads, num_kv_heads, head_dim
    Dv = head_dim_v or head_dim
    P = page_size
    qo_indptr = np.concatenate([[0], np.cumsum(qo_lens)]).astype(np.int32)
    T = int(qo_indptr[-1])
    q = round_to(rng.standard_normal((T, Hq, D)), dtype)

    npages_req = [math.ceil(int(n) / P) for n in kv_lens]
    total_pages = sum(npages_req) + spare_pages
    perm = rng.permutation(total_pages).astype(np.int32)
    if slot_major:
        kpool = round_to(rng.standard_normal((total_pages * P, Hkv, D)), dtype)
        vpool = round_to(rng.standard_normal((total_pages * P, Hkv, Dv)), dtype)
        k_cache = kpool.reshape(total_pages, P, Hkv, D).transpose(0, 2, 1, 3)
        v_cache = vpool.reshape(total_pages, P, Hkv, Dv).transpose(0, 2, 1, 3)
    else:
        k_cache = round_to(rng.standard_normal((total_pages, Hkv, P, D)), dtype)
        v_cache = round_to(rng.standard_normal((total_pages, Hkv, P, Dv)), dtype)
    rows, start = [], 0
    for n in npages_req:
        rows.append(perm[start:start + n])
        start += n
    if flat_pages:
        page_table = np.concatenate(rows + [np.zeros(0, np.int32)]).astype(np.int32)
        page_indptr = np.concatenate([[0], np.cumsum(npages_req)]).astype(np.int32)
    else:
        width = max(max(npages_req, default=0), 1) + 1
        page_table = np.full((B, width), -1, np.int32)
        for b, r in enumerate(rows):
            page_table[b, :len(r)] = r
        page_indptr = None

    prob = Problem(q=q, k_cache=k_cache, v_cache=v_cache, page_table=page_table, page_indptr=page_indptr,
                   qo_indptr=qo_indptr, kv_lens=kv_lens,
                   qo_offset=None if qo_offset is None else np.asarray(qo_offset, np.int32), block_idx=None,
                   num_qo_heads=Hq, num_kv_heads=Hkv, head_dim=D, head_dim_v=Dv, page_size=P,
                   topk=topk if pattern else 0, causal=causal,
                   sm_scale=float(sm_scale) if sm_scale else 1.0 / math.sqrt(D), dtype=dtype)
    if not pattern:
        return prob

    pos = prob.positions()
    req = prob.request_of_token()
    bi = np.full((T, Hkv, topk), -1, np.int32)
    for b in range(B):
        nvalid = math.ceil(int(kv_lens[b]) / BLOCK)
        toks = range(int(qo_indptr[b]), int(qo_indptr[b + 1]))
        for g in range(Hkv):
            pools, shared = {}, {}
            for t in toks:
                if nvalid == 0 or rng.random() < empty_row_prob:
                    continue
                own = int(min(pos[t] // BLOCK, nvalid - 1)) if causal else int(rng.integers(nvalid))
                qblk = int(pos[t] // BLOCK)
                pool = None
                if pattern == "clustered":
                    pool = pools.setdefault(qblk, rng.choice(max(own, 1), size=min(24, max(own, 1)), replace=False))
                srow = None
                if pattern == "shared":
                    if qblk not in shared:
                        last = min(qblk, nvalid - 1)
                        others = rng.choice(last, size=min(topk - 1, last), replace=False) if last else []
                        shared[qblk] = np.array([last] + list(others), np.int64)
                    srow = shared[qblk]
                sel = _selection(rng, nvalid, own, topk, pattern, pool, srow)
                if neg_slot_prob and len(sel) > 1 and rng.random() < neg_slot_prob:
                    # empty slots anywhere in the row: drop a few non-own entries
                    ndrop = int(rng.integers(1, min(3, len(sel) - 1) + 1))
                    sel = [sel[0]] + sel[1:len(sel) - ndrop]
                slots = np.full(topk, -1, np.int32)
                where = rng.permutation(topk) if shuffle_rows else np.arange(topk)
                for s_, blk in zip(where, sel):
                    slots[s_] = blk
                bi[t, g] = slots
    if index_layout == "HTK":
        store = np.ascontiguousarray(bi.transpose(1, 0, 2))
        prob.block_idx = store.transpose(1, 0, 2)
    else:
        prob.block_idx = bi
    return prob


def visible_keys(prob: Problem, t: int, g: int, b: int, p: int) -> np.ndarray:
    """Sorted key indices visible to token t (request b, position p) under KV head g."""
    kl = int(prob.kv_lens[b])
    hi = min(kl, p + 1) if prob.causal else kl
    if hi <= 0:
        return np.zeros(0, np.int64)
    if prob.block_idx is None:
        return np.arange(hi)
    nblk = math.ceil(kl / BLOCK)
    blocks = sorted({int(e) for e in prob.block_idx[t, g] if 0 <= e < nblk})
    keys = [np.arange(blk * BLOCK, min((blk + 1) * BLOCK, hi)) for blk in blocks if blk * BLOCK < hi]
    return np.concatenate(keys) if keys else np.zeros(0, np.int64)


def page_row(prob: Problem, b: int) -> np.ndarray:
    """Request b's page ids (either page-table form)."""
    if prob.page_indptr is not None:
        return prob.page_table[prob.page_indptr[b]:prob.page_indptr[b + 1]]
    return prob.page_table[b]


def cache_slot(prob: Problem, b: int, key: int) -> tuple[int, int]:
    """(page, slot) of request b's logical key in the pool: k_cache[page, g, slot] holds it."""
    return int(page_row(prob, b)[key // prob.page_size]), key % prob.page_size


def gather_kv(prob: Problem, b: int, g: int, keys: np.ndarray):
    """K and V rows (float64) of request b, KV head g at the given logical key indices."""
    P = prob.page_size
    pages = page_row(prob, b)[keys // P]
    off = keys % P
    return (prob.k_cache[pages, g, off].astype(np.float64), prob.v_cache[pages, g, off].astype(np.float64))


def ref_attention(prob: Problem):
    """float64 o [T, Hq, Dv] and lse [T, Hq] (natural log; -inf and o = 0 for rows with no visible key)."""
    T = prob.q.shape[0]
    G = prob.num_qo_heads // prob.num_kv_heads
    o = np.zeros((T, prob.num_qo_heads, prob.head_dim_v))
    lse = np.full((T, prob.num_qo_heads), -np.inf)
    pos, req = prob.positions(), prob.request_of_token()
    for t in range(T):
        b, p = int(req[t]), int(pos[t])
        for g in range(prob.num_kv_heads):
            keys = visible_keys(prob, t, g, b, p)
            if len(keys) == 0:
                continue
            k, v = gather_kv(prob, b, g, keys)
            qh = prob.q[t, g * G:(g + 1) * G].astype(np.float64)
            s = qh @ k.T * prob.sm_scale
            m = s.max(axis=1, keepdims=True)
            with np.errstate(invalid="ignore"):  # inf - inf: a row that meets an Inf key is NaN, as in the kernels
                e = np.exp(s - m)
            l = e.sum(axis=1, keepdims=True)
            o[t, g * G:(g + 1) * G] = (e @ v) / l
            lse[t, g * G:(g + 1) * G] = (m + np.log(l))[:, 0]
    return o, lse


def ref_block_scores(q, k_index, page_table, page_indptr, qo_indptr, kv_lens, qo_offset=None, causal=True,
                     max_blocks=None, page_size=None, k_scale=None):
    """float64 [T, H, max_blocks]: max over visible keys of raw q.k per 128-key block, -inf where none."""
    T, H, D = q.shape
    Hk = k_index.shape[1]
    P = page_size or k_index.shape[2]
    qo_lens = np.diff(qo_indptr)
    off = (np.asarray(kv_lens) - qo_lens) if qo_offset is None else np.asarray(qo_offset)
    nb = max_blocks or max(math.ceil(int(n) / BLOCK) for n in kv_lens)
    out = np.full((T, H, nb), -np.inf)
    for b in range(len(kv_lens)):
        kl = int(kv_lens[b])
        row = page_table[page_indptr[b]:page_indptr[b + 1]] if page_indptr is not None else page_table[b]
        for i in range(int(qo_lens[b])):
            t = int(qo_indptr[b]) + i
            p = int(off[b]) + i
            hi = min(kl, p + 1) if causal else kl
            if hi <= 0:
                continue
            keys = np.arange(hi)
            pages, offs = row[keys // P], keys % P
            for h in range(H):
                kh = h // (H // Hk)
                k = k_index[pages, kh, offs].astype(np.float64)
                if k_scale is not None:
                    k = k * k_scale[pages, kh, offs][:, None]
                s = k @ q[t, h].astype(np.float64)
                for blk in range(math.ceil(hi / BLOCK)):
                    out[t, h, blk] = s[blk * BLOCK:(blk + 1) * BLOCK].max()
    return out


# fp8 index keys on sm_90: prefill-shaped block_scores run on fp8 MMAs with the queries rounded to e4m3
# (src/cuda/indexer/scores_sm90_fp8.cuh); every other path scores the exact queries.

def round_e4m3(x) -> np.ndarray:
    """Values rounded to float8 e4m3 (nearest even, subnormals included; |x| <= 464), as float64."""
    x = np.asarray(x, np.float64)
    _, e = np.frexp(np.abs(x))
    quantum = np.ldexp(1.0, np.maximum(e - 1, -6) - 3)
    return np.round(x / quantum) * quantum


def fp8_mma_queries(q) -> np.ndarray:
    """float64 copy of q [..., D] as the fp8-MMA index-score kernel multiplies it, in its fp32 arithmetic: per
    row, scale = 448 / max(amax, 2^-100) (correctly rounded), the products q * scale rounded to e4m3 (nearest
    even), times the inverse scale max(amax, 2^-100) * (1 / 448). The division must be the correctly rounded
    one (torch's `448.0 / t` is t.reciprocal() * 448, which differs in the last bit for ~20% of rows): bf16
    and fp16 rows put elements exactly on e4m3 rounding ties (~25% of unit-normal bf16 rows hold one), where
    one ulp of the scale moves the element by a whole e4m3 step and a score by up to ~1.5."""
    q = np.asarray(q, np.float32)
    amax = np.maximum(np.abs(q).max(axis=-1, keepdims=True), np.float32(2.0 ** -100))
    scaled = q * (np.float32(448.0) / amax)  # float32 division and product, as on the device
    inverse = amax * np.float32(1.0 / 448.0)
    return round_e4m3(scaled) * inverse.astype(np.float64)


# |got - ref| <= atol + rtol |ref| between the fp8-MMA kernel and ref_block_scores over fp8_mma_queries: the
# tensor core's fp32 accumulation of e4m3 products, errors of ~1e-3 on unit-variance scores of ~30.
FP8_MMA_TOL = dict(rtol=2e-3, atol=2e-2)


def non_finite_rows(rng, s, keep_shares):
    """s [T, H, nb] in place: each row keeps a share of its values drawn from keep_shares (none, a few, about
    half, nearly all); the rest become NaN (40%), -inf (55%) or +inf (5%). Returns s."""
    keep = rng.choice(list(keep_shares), (s.shape[0], s.shape[1], 1))
    gone = rng.random(s.shape) >= keep
    kind = rng.random(s.shape)
    s[gone & (kind < 0.4)] = np.nan
    s[gone & (kind >= 0.4) & (kind < 0.95)] = -np.inf
    s[gone & (kind >= 0.95)] = np.inf
    return s


def kernel_capability() -> tuple[int, int]:
    """(major, minor) msa's kernels run as on the current GPU (msa.cuda_compute_capability: below the GPU's own
    for a build without its code, e.g. sm_80 PTX on an H200); the GPU tests' choice of expected paths."""
    import msa

    return divmod(msa.cuda_compute_capability(), 10)


def fp8_mma_scores(total_q, batch_size, num_heads, num_k_heads, capability, env) -> bool:
    """Whether CUDA block_scores with fp8 keys runs the fp8-MMA kernel (src/cuda/indexer/dispatch.cu):
    prefill-shaped calls (total_q = q.shape[0] > 4 x batch) on sm_90 with head groups of at most 256, unless
    env (a mapping like os.environ) sets MSA_INDEXER_PREFILL=portable, the exact path."""
    return (tuple(capability) == (9, 0) and total_q > 4 * batch_size and num_heads // num_k_heads <= 256
            and env.get("MSA_INDEXER_PREFILL", "auto") != "portable")


def ref_select_topk(scores_thk, qo_indptr, kv_lens, topk, qo_offset=None, force_begin=0, force_end=1,
                    causal=True):
    """int32 [T, H, topk] per contract §4 (ascending, -1 tail, NaN lowest, ties to the lower block)."""
    T, H, NB = scores_thk.shape
    qo_lens = np.diff(qo_indptr)
    off = (np.asarray(kv_lens) - qo_lens) if qo_offset is None else np.asarray(qo_offset)
    out = np.full((T, H, topk), -1, np.int32)
    for b in range(len(kv_lens)):
        nkv = math.ceil(int(kv_lens[b]) / BLOCK)
        for i in range(int(qo_lens[b])):
            t = int(qo_indptr[b]) + i
            p = int(off[b]) + i
            n = min(p // BLOCK + 1, nkv) if causal else nkv
            n = max(n, 0)
            for h in range(H):
                if n == 0:
                    continue
                valid = list(range(n))
                forced = set(valid[:force_begin]) | set(valid[max(n - force_end, 0):] if force_end else [])
                rest = [blk for blk in valid if blk not in forced]
                s = scores_thk[t, h]
                # sort key: NaN lowest, then score descending, then index ascending
                rest.sort(key=lambda blk: (0 if np.isnan(s[blk]) else 1, -np.inf if np.isnan(s[blk]) else s[blk],
                                           -blk), reverse=True)
                chosen = sorted(list(forced)[:topk] if len(forced) > topk else
                                list(forced) + rest[:topk - len(forced)])
                out[t, h, :len(chosen)] = chosen
    return out


def ref_merge_states(v, lse):
    """float64 merge of v [S, T, H, D] by lse [S, T, H] (natural log); a part at lse = -inf weighs
    nothing and its v is never read (NaN there is ignored); rows whose parts are all -inf give 0 and -inf."""
    v, lse = np.asarray(v, np.float64), np.asarray(lse, np.float64)
    m = np.max(lse, axis=0)
    finite = ~np.isneginf(m)
    w = np.where(finite, np.exp(lse - np.where(finite, m, 0.0)), 0.0)
    total = w.sum(axis=0)
    o = np.where(finite[..., None], (w[..., None] * np.nan_to_num(v)).sum(axis=0)
                 / np.where(finite, total, 1.0)[..., None], 0.0)
    return o, np.where(finite, m + np.log(np.where(finite, total, 1.0)), -np.inf)


def rel_l2(x, ref) -> float:
    x = np.asarray(x, np.float64)
    ref = np.asarray(ref, np.float64)
    den = np.linalg.norm(ref)
    return float(np.linalg.norm(x - ref) / den) if den > 0 else float(np.linalg.norm(x - ref))


def assert_close(o, o_ref, *, rel=1e-2, atol=2e-2, what="o"):
    """The contract's tolerance: relative L2 < rel and no element off by more than atol; NaN never passes."""
    o = np.asarray(o, np.float64)
    assert not np.isnan(o).any(), f"{what}: NaN in output"
    err = np.abs(o - o_ref)
    assert rel_l2(o, o_ref) < rel, f"{what}: relative L2 error {rel_l2(o, o_ref):.3e} >= {rel}"
    assert err.max(initial=0.0) <= atol, f"{what}: max abs error {err.max():.3e} > {atol}"


def assert_lse_close(lse, lse_ref, atol=1e-2):
    lse = np.asarray(lse, np.float64)
    assert not np.isnan(lse).any(), "lse: NaN"
    inf_ref = np.isneginf(lse_ref)
    assert (np.isneginf(lse) == inf_ref).all(), "lse: -inf pattern differs (empty rows)"
    d = np.abs(lse[~inf_ref] - lse_ref[~inf_ref])
    assert d.max(initial=0.0) <= atol, f"lse: max abs error {d.max():.3e}"


def _spanned_memory(a: np.ndarray):
    """A 1-D copy of the memory that the view `a` spans (from its first element to its last, in a's dtype)
    and a's strides in elements, so that the view can be rebuilt over other storage. Reading the span
    through `a` itself, not through a.base: the base may hold another dtype (round_to's bf16 values are a
    float32 view of a uint32 array) or start before the view."""
    assert all(s >= 0 for s in a.strides), "negative strides"
    strides = tuple(s // a.itemsize for s in a.strides)
    span = 1 + sum((n - 1) * s for n, s in zip(a.shape, strides)) if a.size else 0
    flat = np.lib.stride_tricks.as_strided(a, shape=(span,), strides=(a.itemsize,)).copy()
    return flat, strides


def to_torch(prob: Problem, device="cuda", dtype=None):
    """torch tensors of the problem on `device`, float data in `dtype` (default from prob.dtype), keeping the
    strided views (slot-major pool, [Hkv, T, topk] index layout) as views of contiguous storage."""
    import torch

    dt = dtype or {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[prob.dtype]

    def ften(a):
        base = a
        if not a.flags["C_CONTIGUOUS"] and a.base is not None:
            # rebuild the same view over a contiguous torch storage
            owner, strides = _spanned_memory(a)
            return torch.from_numpy(owner).to(device=device, dtype=dt).as_strided(a.shape, strides)
        return torch.from_numpy(np.ascontiguousarray(base)).to(device=device, dtype=dt)

    def iten(a):
        if a is None:
            return None
        if not a.flags["C_CONTIGUOUS"] and a.base is not None:
            owner, strides = _spanned_memory(a)
            return torch.from_numpy(owner).to(device=device).as_strided(a.shape, strides)
        return torch.from_numpy(np.ascontiguousarray(a)).to(device=device)

    return {
        "q": torch.from_numpy(prob.q).to(device=device, dtype=dt),
        "k_cache": ften(prob.k_cache),
        "v_cache": ften(prob.v_cache),
        "page_table": iten(prob.page_table),
        "page_indptr": iten(prob.page_indptr),
        "qo_indptr": iten(prob.qo_indptr),
        "kv_lens": iten(prob.kv_lens),
        "qo_offset": iten(prob.qo_offset),
        "block_idx": iten(prob.block_idx),
    }


def numpy_dtype(dtype: str) -> np.dtype:
    """The numpy dtype of "fp32" / "fp16" / "bf16" / "fp8" (bfloat16 and float8_e4m3fn come from ml_dtypes,
    imported here)."""
    if dtype in ("bf16", "fp8"):
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16 if dtype == "bf16" else ml_dtypes.float8_e4m3fn)
    return np.dtype({"fp32": np.float32, "fp16": np.float16}[dtype])


def fp8_kv(prob: Problem, k_scale: float, v_scale: float, interleaved: bool = False):
    """prob's K and V quantized to float8_e4m3fn with per-tensor scales: the pools hold k / k_scale and v / v_scale
    (ml_dtypes' round to nearest even), as two pools in prob's layout or, interleaved, as the two halves of one
    [pages, Hkv, P, 2D] pool (D = Dv). Returns (k8, v8, k_deq, v_deq): the fp8 views and their dequantized values
    (e4m3 value x scale, float64, the same shapes), which ref_attention takes in place of prob's."""
    f8 = numpy_dtype("fp8")
    if interleaved:
        assert prob.head_dim == prob.head_dim_v, "an interleaved pool holds K and V rows of one width"
        D = prob.head_dim
        pool = np.empty((*prob.k_cache.shape[:3], 2 * D), f8)
        pool[..., :D] = (prob.k_cache / k_scale).astype(f8)
        pool[..., D:] = (prob.v_cache / v_scale).astype(f8)
        k8, v8 = pool[..., :D], pool[..., D:]
    else:
        k8 = np.empty_like(prob.k_cache, dtype=f8)  # keeps prob's strides (slot-major views)
        v8 = np.empty_like(prob.v_cache, dtype=f8)
        k8[...] = (prob.k_cache / k_scale).astype(f8)
        v8[...] = (prob.v_cache / v_scale).astype(f8)
    return k8, v8, k8.astype(np.float64) * k_scale, v8.astype(np.float64) * v_scale


def scaled_reference(prob: Problem, k_values=None, v_values=None, *, q_scale=1.0, k_scale=1.0, v_scale=1.0):
    """ref_attention over the given K/V values (default prob's) with the per-tensor scales of msa.attention:
    logits (q . k) * sm_scale * q_scale * k_scale, output times v_scale."""
    k = prob.k_cache if k_values is None else k_values
    v = prob.v_cache if v_values is None else v_values
    scaled = replace(prob, k_cache=np.asarray(k, np.float64) * k_scale, v_cache=np.asarray(v, np.float64) * v_scale,
                     sm_scale=prob.sm_scale * q_scale)
    return ref_attention(scaled)


def to_numpy(prob: Problem, dtype=None) -> dict:
    """numpy arrays of the problem, float data in `dtype` (default prob.dtype). astype keeps the memory
    order (order="K"), so the strided views (slot-major pool, [Hkv, T, topk] index layout) stay strided."""
    dt = numpy_dtype(dtype or prob.dtype)
    return {
        "q": prob.q.astype(dt),
        "k_cache": prob.k_cache.astype(dt),
        "v_cache": prob.v_cache.astype(dt),
        "page_table": prob.page_table,
        "page_indptr": prob.page_indptr,
        "qo_indptr": prob.qo_indptr,
        "kv_lens": prob.kv_lens,
        "qo_offset": prob.qo_offset,
        "block_idx": prob.block_idx,
    }


def capture_graph(fn):
    """(graph, output) of fn captured in a CUDA graph after a warm-up on a side stream (as sglang captures its
    decode), so that the capture records no first-call work."""
    import torch

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn()
    torch.cuda.synchronize()
    return graph, out


class no_host_sync:
    """A block in which any torch operation that synchronizes with the host raises (torch's sync debug mode
    "error"): a decode step as an engine replays it between CUDA graph launches."""

    def __enter__(self):
        import torch

        torch.cuda.set_sync_debug_mode("error")

    def __exit__(self, *exc):
        import torch

        torch.cuda.set_sync_debug_mode("default")
        return False


def flashinfer_topk_reference(scores, nvp, fb: int, fe: int, topk: int) -> np.ndarray:
    """FlashInfer's msa_topk_select rule: scores (H, tiles, T); per (token, head) the forced first fb / last fe
    blocks of the token's extent [0, nvp[t]) (all tiles when nvp is None), then the best finite scores among the
    others (ties to the lower index), ascending, -1 padded to (T, H, topk)."""
    H, P, T = scores.shape
    out = np.full((T, H, topk), -1, np.int32)
    for t in range(T):
        valid = P if nvp is None else max(0, min(int(nvp[t]), P))
        forced = set(range(min(fb, valid))) | set(range(max(valid - fe, 0), valid))
        for h in range(H):
            col = scores[h, :valid, t]
            cands = sorted((i for i in range(valid) if i not in forced and np.isfinite(col[i])),
                           key=lambda i: (-col[i], i))
            chosen = sorted(forced | set(cands[:topk - len(forced)]))
            out[t, h, :len(chosen)] = chosen
    return out
