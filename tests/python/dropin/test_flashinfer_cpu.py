"""msa.flashinfer (FlashInfer's msa_ops API as vLLM's MiniMax-M3 backend calls it) on CPU tensors, the reference
backend: every entry point against msa_testing's float64 references, fp8 interleaved and bf16 pools, MTP's
right-aligned positions, the -inf / -1 conventions and the argument errors."""
import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("ml_dtypes")

import msa_testing as mt  # noqa: E402
from msa import flashinfer as fi  # noqa: E402

HQ, HKV, D, TOPK = 8, 2, 64, 4
BLOCK = 128


def t32(a):
    return torch.from_numpy(np.ascontiguousarray(np.asarray(a, np.int32)))


def fp8_tensor(a):
    """An ml_dtypes float8_e4m3fn array as a torch float8_e4m3fn tensor (same bytes)."""
    return torch.from_numpy(np.ascontiguousarray(a).view(np.uint8)).view(torch.float8_e4m3fn)


def problem(rng, qo_lens, kv_lens, *, causal=True, qo_offset=None, hq=HQ, hkv=HKV, topk=TOPK):
    """A problem in vLLM's layouts: pages of 128 tokens [pages, Hkv, 128, D], a dense page table, block
    indexes stored [Hkv, T, topk]."""
    return mt.make_problem(rng, qo_lens=qo_lens, kv_lens=kv_lens, qo_offset=qo_offset, num_qo_heads=hq,
                           num_kv_heads=hkv, head_dim=D, page_size=BLOCK, topk=topk, causal=causal,
                           index_layout="HTK")


def q2k(prob):
    """(Hkv, total_q, topk) int32, contiguous, as vLLM passes it."""
    return t32(prob.block_idx.transpose(1, 0, 2))


def bf16(a):
    return torch.from_numpy(np.ascontiguousarray(a, np.float32)).to(torch.bfloat16)


def index_inputs(rng, qo_lens, kv_lens, *, hq=4, hk=1, qo_offset=None):
    """Index queries [T, hq, D] and paged index keys [pages, hk, 128, D] (bf16 values) for the proxy score."""
    prob = mt.make_problem(rng, qo_lens=qo_lens, kv_lens=kv_lens, qo_offset=qo_offset, num_qo_heads=hq,
                           num_kv_heads=hk, head_dim=D, page_size=BLOCK, pattern=None)
    return prob


# ------------------------------------------------------------------------------------------ msa_proxy_score


@pytest.mark.parametrize("reduce_heads", [False, True])
def test_proxy_score_paged_matches_reference(rng, reduce_heads):
    prob = index_inputs(rng, [5, 130, 1], [300, 700, 129])
    tiles = 7  # one column past the longest request's 6 blocks: all -inf
    got = fi.msa_proxy_score(bf16(prob.q), bf16(prob.k_cache), t32(prob.qo_indptr), page_table=t32(prob.page_table),
                             seqused_k=t32(prob.kv_lens), causal=True, max_seqlen_q=130, max_k_tiles=tiles,
                             reduce_heads=reduce_heads)
    ref = mt.ref_block_scores(prob.q, prob.k_cache, prob.page_table, None, prob.qo_indptr, prob.kv_lens,
                              max_blocks=tiles).transpose(1, 2, 0)  # (H, tiles, T)
    if reduce_heads:
        ref = ref.max(axis=0, keepdims=True)
    assert got.dtype == torch.float32 and tuple(got.shape) == ref.shape
    got = got.numpy()
    assert (np.isneginf(got) == np.isneginf(ref)).all(), "-inf pattern differs"
    assert np.isneginf(got[:, tiles - 1]).all()
    finite = np.isfinite(ref)
    np.testing.assert_allclose(got[finite], ref[finite], rtol=1e-5, atol=1e-4)


def test_proxy_score_fp8_keys_flat_keys_offsets_and_output(rng):
    prob = index_inputs(rng, [40, 3], [260, 500], hq=4, hk=2, qo_offset=[100, 400])
    f8 = mt.numpy_dtype("fp8")
    k8 = (prob.k_cache / 2).astype(f8)
    args = dict(page_table=t32(prob.page_table), seqused_k=t32(prob.kv_lens), max_k_tiles=4)
    out = torch.empty((4, 4, 43))
    got = fi.msa_proxy_score(bf16(prob.q), fp8_tensor(k8), t32(prob.qo_indptr), q_offset=t32(prob.qo_offset),
                             output=out, **args)
    assert got is out
    ref = mt.ref_block_scores(prob.q, k8.astype(np.float32), prob.page_table, None, prob.qo_indptr, prob.kv_lens,
                              qo_offset=prob.qo_offset, max_blocks=4).transpose(1, 2, 0)
    finite = np.isfinite(ref)
    assert (np.isfinite(got.numpy()) == finite).all()
    np.testing.assert_allclose(got.numpy()[finite], ref[finite], rtol=1e-5, atol=1e-4)
    # fp8 queries are converted to bf16 exactly
    q8 = prob.q.astype(f8)
    got8 = fi.msa_proxy_score(fp8_tensor(q8), fp8_tensor(k8), t32(prob.qo_indptr), q_offset=t32(prob.qo_offset),
                              **args)
    ref8 = mt.ref_block_scores(q8.astype(np.float32), k8.astype(np.float32), prob.page_table, None, prob.qo_indptr,
                               prob.kv_lens, qo_offset=prob.qo_offset, max_blocks=4).transpose(1, 2, 0)
    np.testing.assert_allclose(got8.numpy()[finite], ref8[finite], rtol=1e-5, atol=1e-4)
    # flat keys [total_k, Hk, D] with cu_seqlens_k, an int q_offset, the default extent (host read)
    rows = [np.concatenate([prob.k_cache[p, :, :, :] for p in prob.page_table[b][:math.ceil(n / BLOCK)]],
                           axis=1)[:, :n].transpose(1, 0, 2) for b, n in enumerate(prob.kv_lens)]
    flat = np.concatenate(rows)
    cu_k = np.concatenate([[0], np.cumsum(prob.kv_lens)])
    gotf = fi.msa_proxy_score(bf16(prob.q), bf16(flat), t32(prob.qo_indptr), t32(cu_k), q_offset=90)
    reff = mt.ref_block_scores(prob.q, prob.k_cache, prob.page_table, None, prob.qo_indptr, prob.kv_lens,
                               qo_offset=[90, 90]).transpose(1, 2, 0)
    assert tuple(gotf.shape) == reff.shape == (4, 4, 43)
    finite = np.isfinite(reff)
    assert (np.isfinite(gotf.numpy()) == finite).all()
    np.testing.assert_allclose(gotf.numpy()[finite], reff[finite], rtol=1e-5, atol=1e-4)


# ------------------------------------------------------------------------------------------ msa_topk_select


def test_topk_select_matches_msa_reference_on_finite_scores(rng):
    H, P, T = 2, 20, 9
    scores = rng.standard_normal((H, P, T)).astype(np.float32)
    nvp = rng.integers(1, P + 1, T).astype(np.int32)
    got = fi.msa_topk_select(torch.from_numpy(scores), 6, num_valid_pages=t32(nvp), force_begin_blocks=1,
                             force_end_blocks=2)
    ref = mt.ref_select_topk(scores.transpose(2, 0, 1), np.arange(T + 1), nvp * BLOCK, 6, force_begin=1,
                             force_end=2, causal=False)
    assert got.dtype == torch.int32 and tuple(got.shape) == (T, H, 6)
    np.testing.assert_array_equal(got.numpy(), ref)
    np.testing.assert_array_equal(got.numpy(), mt.flashinfer_topk_reference(scores, nvp, 1, 2, 6))


def test_topk_select_never_picks_non_finite_blocks_and_pads_with_minus_one(rng):
    H, P, T = 2, 24, 12
    scores = rng.standard_normal((H, P, T)).astype(np.float32)
    scores[:, 10:, :6] = -np.inf  # short tokens: few finite blocks
    scores[0, 3, :] = np.nan
    scores[:, 0, 2] = -np.inf  # a forced sink block without a visible key is still forced
    nvp = np.array([11, 11, 3, 1, 0, 30, 24, 24, 24, 12, 5, 24], np.int32)  # clamped to [0, P]
    out = torch.full((T, H, 16), 7, dtype=torch.int32)
    got = fi.msa_topk_select(torch.from_numpy(scores), 16, t32(nvp), out, force_begin_blocks=1, force_end_blocks=1)
    assert got is out
    np.testing.assert_array_equal(got.numpy(), mt.flashinfer_topk_reference(scores, nvp, 1, 1, 16))
    rows = got.numpy().reshape(-1, 16)
    for r in rows:  # ascending, -1 only as a tail
        n = int((r >= 0).sum())
        assert (r[n:] == -1).all() and (np.diff(r[:n]) > 0).all()
    # the scalar and default extents, as vLLM's decode-only tests call it
    dense = rng.standard_normal((4, 64, 32)).astype(np.float32)
    got = fi.msa_topk_select(torch.from_numpy(dense), 16)
    np.testing.assert_array_equal(got.numpy(), mt.flashinfer_topk_reference(dense, None, 0, 0, 16))
    got = fi.msa_topk_select(torch.from_numpy(dense), 16, 40, force_begin_blocks=2, force_end_blocks=3)
    np.testing.assert_array_equal(got.numpy(), mt.flashinfer_topk_reference(dense, [40] * 32, 2, 3, 16))


@pytest.mark.parametrize("kwargs,match", [
    (dict(topk=0), "'topk'"),
    (dict(force_begin_blocks=3, force_end_blocks=2, topk=4), "force_begin_blocks"),
    (dict(num_valid_pages=0), "'num_valid_pages'"),
    (dict(num_valid_pages=9), "'num_valid_pages'"),
    (dict(num_valid_pages=torch.ones(5, dtype=torch.int64)), "'num_valid_pages'"),
    (dict(output=torch.empty((5, 2, 3), dtype=torch.int32)), "'output'"),
])
def test_topk_select_argument_errors(kwargs, match):
    kwargs = dict(kwargs)
    topk = kwargs.pop("topk", 4)
    with pytest.raises(ValueError, match=match):
        fi.msa_topk_select(torch.zeros((2, 8, 5)), topk, **kwargs)
    with pytest.raises(ValueError, match="'max_score'"):
        fi.msa_topk_select(torch.zeros((2, 8, 5), dtype=torch.float16), 4)


# ------------------------------------------------------------------------------------------ msa_sparse_attention


@pytest.mark.parametrize("causal", [True, False])
def test_sparse_attention_prefill_with_prefix_and_chunks(rng, causal):
    """Chunked prefill: new tokens at the end of cached prefixes (right-aligned), ragged batch, LSE."""
    prob = problem(rng, [130, 5, 1], [300, 700, 129], causal=causal)
    o, lse = fi.msa_sparse_attention(bf16(prob.q), bf16(prob.k_cache), bf16(prob.v_cache), q2k(prob),
                                     t32(prob.qo_indptr), causal=causal, page_table=t32(prob.page_table),
                                     seqused_k=t32(prob.kv_lens), return_softmax_lse=True)
    o_ref, lse_ref = mt.ref_attention(prob)
    assert o.dtype == torch.bfloat16 and tuple(o.shape) == (136, HQ, D)
    mt.assert_close(o.float().numpy(), o_ref)
    mt.assert_lse_close(lse.numpy(), lse_ref)


@pytest.mark.parametrize("convention", ["global_scales", "vllm_folded"])
def test_sparse_attention_fp8_interleaved_pool(rng, convention):
    """vLLM's fp8 cache: one [pages, Hkv, 128, 2D] pool, k = pool[..., :D], v = pool[..., D:]."""
    prob = problem(rng, [64, 3], [400, 260])
    ks, vs = 0.5, 2.0
    k8, v8, k_deq, v_deq = mt.fp8_kv(prob, ks, vs)
    pool = fp8_tensor(np.concatenate([k8, v8], axis=-1))
    k, v = pool[..., :D], pool[..., D:]
    scales = dict(k_global_scale=ks, v_global_scale=vs) if convention == "global_scales" else \
        dict(softmax_scale=D ** -0.5 * ks, v_global_scale=vs)
    out = torch.empty((67, HQ, D), dtype=torch.bfloat16)
    o = fi.msa_sparse_attention(bf16(prob.q), k, v, q2k(prob), t32(prob.qo_indptr), causal=True,
                                page_table=t32(prob.page_table), seqused_k=t32(prob.kv_lens), out=out, **scales)
    assert o is out
    mt.assert_close(o.float().numpy(), mt.scaled_reference(prob, k_deq, v_deq)[0])


def test_sparse_attention_flat_kv_separate_pools_fp16_and_q_offset(rng):
    prob = problem(rng, [20, 7], [300, 250], qo_offset=[200, 100])
    rows_k, rows_v = [], []
    for b, n in enumerate(prob.kv_lens):
        keys = np.arange(n)
        k, v = mt.gather_kv(prob, b, slice(None), keys)  # [n, Hkv, D]
        rows_k.append(k)
        rows_v.append(v)
    cu_k = np.concatenate([[0], np.cumsum(prob.kv_lens)])
    half = lambda a: torch.from_numpy(np.concatenate(a).astype(np.float32)).to(torch.float16)  # noqa: E731
    o = fi.msa_sparse_attention(torch.from_numpy(prob.q).to(torch.float16), half(rows_k), half(rows_v), q2k(prob),
                                t32(prob.qo_indptr), t32(cu_k), causal=True, q_offset=t32(prob.qo_offset),
                                softmax_scale=0.1)
    prob.sm_scale = 0.1
    assert o.dtype == torch.float16
    mt.assert_close(o.float().numpy(), mt.ref_attention(prob)[0])


# ------------------------------------------------------------------------------------------ decode and MTP


@pytest.mark.parametrize("seqlen_q", [1, 3])
def test_decode_and_mtp_right_aligned_with_lengths_changing(rng, seqlen_q):
    """One cached decode plan serves steps whose seqused_k, page table and selections change (as under a
    CUDA graph); token i of a request sits at seqused_k - seqlen_q + i."""
    fi._decode_plans.clear()
    width = 9  # page-table columns: keys per request up to 9 * 128
    for kv_lens in ([130, 5, 700], [131, 6, 1100], [900, 129, 3]):
        prob = problem(rng, [seqlen_q] * 3, kv_lens)
        table = np.full((3, width), -1, np.int32)
        used = min(width, prob.page_table.shape[1])  # the problem's table has a spare -1 column
        table[:, :used] = prob.page_table[:, :used]
        o, lse = fi.msa_sparse_decode_attention(bf16(prob.q), bf16(prob.k_cache), bf16(prob.v_cache), q2k(prob),
                                                page_table=t32(table), seqused_k=t32(prob.kv_lens),
                                                seqlen_q=seqlen_q, causal=True, return_softmax_lse=True)
        o_ref, lse_ref = mt.ref_attention(prob)
        mt.assert_close(o.float().numpy(), o_ref)
        mt.assert_lse_close(lse.numpy(), lse_ref)
    assert len(fi._decode_plans) == 1


def test_decode_fp8_pool_q_offset_lse_out_and_long_mtp(rng):
    prob = problem(rng, [2, 2], [300, 200], qo_offset=[100, 7])
    k8, v8, k_deq, v_deq = mt.fp8_kv(prob, 1.5, 0.25)
    pool = fp8_tensor(np.concatenate([k8, v8], axis=-1))
    lse_out = torch.empty((4, HQ))
    o, lse = fi.msa_sparse_decode_attention(bf16(prob.q), pool[..., :D], pool[..., D:], q2k(prob),
                                            page_table=t32(prob.page_table), seqused_k=t32(prob.kv_lens), seqlen_q=2,
                                            q_offset=t32(prob.qo_offset), k_global_scale=1.5, v_global_scale=0.25,
                                            return_softmax_lse=True, lse_out=lse_out, force_fused=True)
    assert lse is lse_out
    o_ref, lse_ref = mt.scaled_reference(prob, k_deq, v_deq)
    mt.assert_close(o.float().numpy(), o_ref)
    mt.assert_lse_close(lse.numpy(), lse_ref)
    # seqlen_q above msa's decode bound (16) is planned as a prefill
    prob = problem(rng, [20, 20], [300, 600])
    o = fi.msa_sparse_decode_attention(bf16(prob.q), bf16(prob.k_cache), bf16(prob.v_cache), q2k(prob),
                                       page_table=t32(prob.page_table), seqused_k=t32(prob.kv_lens), seqlen_q=20)
    mt.assert_close(o.float().numpy(), mt.ref_attention(prob)[0])


def test_index_score_topk_attention_pipeline(rng):
    """vLLM's decode step: proxy score over the index cache -> per-token top-k -> sparse decode attention."""
    B, seqlen_q, topk = 3, 2, 3
    kv_lens = np.array([700, 260, 129])
    prob = problem(rng, [seqlen_q] * B, kv_lens, topk=topk)
    index = index_inputs(rng, [seqlen_q] * B, kv_lens, hq=HKV, hk=1)
    tiles = prob.page_table.shape[1]
    pos = prob.positions()
    nvp = t32(pos // BLOCK + 1)
    scores = fi.msa_proxy_score(bf16(index.q), bf16(index.k_cache), t32(index.qo_indptr),
                                page_table=t32(index.page_table), seqused_k=t32(kv_lens), causal=True,
                                max_k_tiles=tiles)
    sel = fi.msa_topk_select(scores, topk, num_valid_pages=nvp, force_begin_blocks=1, force_end_blocks=1)
    ref_scores = mt.ref_block_scores(index.q, index.k_cache, index.page_table, None, index.qo_indptr, kv_lens,
                                     max_blocks=tiles).transpose(1, 2, 0)
    np.testing.assert_array_equal(sel.numpy(), mt.flashinfer_topk_reference(ref_scores, nvp.numpy(), 1, 1, topk))
    o = fi.msa_sparse_decode_attention(bf16(prob.q), bf16(prob.k_cache), bf16(prob.v_cache),
                                       sel.transpose(0, 1).contiguous(), page_table=t32(prob.page_table),
                                       seqused_k=t32(kv_lens), seqlen_q=seqlen_q)
    prob.block_idx = sel.numpy()
    mt.assert_close(o.float().numpy(), mt.ref_attention(prob)[0])


# ------------------------------------------------------------------------------------------ errors and the rest


def test_argument_errors_name_the_argument(rng):
    prob = problem(rng, [1, 1], [200, 300])
    q, k, v = bf16(prob.q), bf16(prob.k_cache), bf16(prob.v_cache)
    common = dict(page_table=t32(prob.page_table), seqused_k=t32(prob.kv_lens))
    with pytest.raises(ValueError, match="'seqlen_q'"):
        fi.msa_sparse_decode_attention(q, k, v, q2k(prob), seqlen_q=3, **common)
    with pytest.raises(ValueError, match="'q2k_indices'"):
        fi.msa_sparse_decode_attention(q, k, v, q2k(prob)[:1], **common)
    with pytest.raises(ValueError, match="'seqused_k'"):
        fi.msa_sparse_decode_attention(q, k, v, q2k(prob), page_table=t32(prob.page_table))
    with pytest.raises(ValueError, match="'cu_seqlens_k'"):
        fi.msa_sparse_attention(q, k, v, q2k(prob), t32(prob.qo_indptr))
    with pytest.raises(ValueError, match="'cu_seqlens_q'"):
        fi.msa_sparse_attention(q, k, v, q2k(prob), t32([0, 2]), **common)
    with pytest.raises(ValueError, match="'out'"):
        fi.msa_sparse_attention(q, k, v, q2k(prob), t32(prob.qo_indptr), out=torch.empty(3, HQ, D), **common)
    with pytest.raises(NotImplementedError, match="'return_temperature_lse'"):
        fi.msa_sparse_attention(q, k, v, q2k(prob), t32(prob.qo_indptr), return_temperature_lse=True, **common)
    packed = torch.zeros((4, HKV, BLOCK, D // 2), dtype=torch.uint8)
    with pytest.raises(NotImplementedError, match="'k'"):
        fi.msa_sparse_decode_attention(q, packed, packed, q2k(prob), **common)
    with pytest.raises(NotImplementedError, match="'k_scale'"):
        fi.msa_sparse_attention(q, k, v, q2k(prob), t32(prob.qo_indptr), k_scale=torch.ones(1), **common)
    with pytest.raises(ValueError, match="'max_k_tiles'"):
        fi.msa_proxy_score(q, k, t32(prob.qo_indptr), max_k_tiles=2, output=torch.empty(HQ, 3, 2), **common)


def test_preload_sm90_programs_is_a_no_op():
    assert fi.preload_sm90_programs() == {k: 0 for k in ("sparse_decode", "proxy_decode", "proxy_prefill",
                                                         "topk_select", "sparse_prefill")}
    assert fi.preload_sm90_programs(("proxy_prefill",)) == {"proxy_prefill": 0}
    with pytest.raises(ValueError, match="unknown"):
        fi.preload_sm90_programs(("no_such_kind",))


def test_module_alias_and_exports():
    import msa.engines.flashinfer as engine

    assert fi is engine
    assert set(fi.__all__) == {"msa_proxy_score", "msa_topk_select", "msa_sparse_attention",
                               "msa_sparse_decode_attention", "preload_sm90_programs"}
