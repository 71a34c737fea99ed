"""Bad input raises ValueError / TypeError / NotImplementedError whose message names the function and
the argument (contract §6), from the Python layer and from the C++ checks alike."""
import numpy as np
import pytest

import msa
import msa_testing as mt


@pytest.fixture
def case(rng):
    prob = mt.make_problem(rng, qo_lens=[5, 9], kv_lens=[300, 140], num_qo_heads=4, num_kv_heads=2, head_dim=64,
                           topk=3, dtype="fp32")
    plan = msa.plan_prefill(prob.qo_lens, prob.kv_lens, num_qo_heads=4, num_kv_heads=2, head_dim=64, topk=3)
    return prob, plan, mt.to_numpy(prob)


def call(plan, a, **over):
    args = dict(q=a["q"], k_cache=a["k_cache"], v_cache=a["v_cache"], page_table=a["page_table"],
                qo_indptr=a["qo_indptr"], kv_lens=a["kv_lens"])
    kw = dict(block_idx=a["block_idx"])
    for k, v in over.items():
        (args if k in args else kw)[k] = v
    return msa.attention(plan, *args.values(), **kw)


def test_baseline_runs(case):
    prob, plan, a = case
    call(plan, a)


@pytest.mark.parametrize("arg,bad,exc,name", [
    ("q", lambda a: a["q"].astype(np.float64), TypeError, "'q'"),
    ("q", lambda a: a["q"][:, :2], ValueError, "'q'"),
    ("q", lambda a: np.asfortranarray(a["q"]), ValueError, "'q'"),
    ("q", lambda a: a["q"].tolist(), TypeError, "'q'"),
    ("k_cache", lambda a: a["k_cache"].astype(np.float16), TypeError, "'k"),
    ("v_cache", lambda a: a["v_cache"][:, :, :, :32], ValueError, "'v"),
    ("qo_indptr", lambda a: a["qo_indptr"].astype(np.int64), TypeError, "'qo_indptr'"),
    ("kv_lens", lambda a: a["kv_lens"][:1], ValueError, "'kv_lens'"),
    ("kv_lens", lambda a: a["kv_lens"] + 1, ValueError, "'qo_indptr'/'kv_lens'"),
    ("page_table", lambda a: a["page_table"][:, :1], ValueError, "'page_table'"),
    ("block_idx", lambda a: a["block_idx"][..., :2], ValueError, "'block_idx'"),
    ("block_idx", lambda a: None, ValueError, "'block_idx'"),
    ("block_idx", lambda a: a["block_idx"].astype(np.int64), TypeError, "'block_idx'"),
    ("out", lambda a: np.zeros((14, 4, 64), np.float16), TypeError, "'o"),
    ("lse", lambda a: np.zeros((14, 3), np.float32), ValueError, "'lse'"),
])
def test_attention_argument_errors(case, arg, bad, exc, name):
    prob, plan, a = case
    with pytest.raises(exc, match=name) as info:
        call(plan, a, **{arg: bad(a)})
    assert str(info.value).startswith("msa.attention")


def test_read_only_output_is_rejected(case):
    prob, plan, a = case
    out = np.zeros((14, 4, 64), np.float32)
    out.flags.writeable = False
    with pytest.raises(ValueError, match="'out': expected a writable tensor"):
        call(plan, a, out=out)


def test_read_only_inputs_are_accepted(case):
    prob, plan, a = case
    for x in a.values():
        if x is not None:
            x.flags.writeable = False
    call(plan, a)


def test_validate_reports_bad_block_entries(case):
    prob, plan, a = case
    bi = a["block_idx"].copy()
    bi[3, 1, 0] = 7  # request 0 has ceil(300 / 128) = 3 blocks
    with pytest.raises(ValueError, match=r"'block_idx': token 3, head 1.*block 7"):
        call(plan, a, block_idx=bi, validate=True)
    bi = np.full_like(a["block_idx"], -1)
    bi[6, 0, :2] = 1  # a duplicate
    with pytest.raises(ValueError, match=r"'block_idx': token 6, head 0.*twice"):
        call(plan, a, block_idx=bi, validate=True)


def test_validate_reports_bad_page_ids(case):
    prob, plan, a = case
    pt = a["page_table"].copy()
    pt[1, 0] = 10_000
    with pytest.raises(ValueError, match="'page_table': request 1, logical page 0"):
        call(plan, a, page_table=pt, validate=True)


def test_dtype_errors_name_the_first_wrong_argument(case):
    """The first argument (in the order of the signature) whose dtype is wrong is named, with the dtypes it
    takes: only float types for q, q's dtype (or fp8 e4m3) for k, k's for v, q's for out. Dtypes msa takes
    nowhere (float64, bool) are reported by the same checks, not by the import."""
    prob, plan, a = case
    with pytest.raises(TypeError) as info:
        call(plan, a, q=a["q"].astype(np.int32), k_cache=a["k_cache"].astype(np.float64))
    assert str(info.value) == ("msa.attention: argument 'q': expected dtype bfloat16, float16 or float32, "
                               "got int32")
    with pytest.raises(TypeError) as info:
        call(plan, a, q=a["q"].astype(np.float64))
    assert str(info.value) == ("msa.attention: argument 'q': expected dtype bfloat16, float16 or float32, "
                               "got float64")
    with pytest.raises(TypeError, match=r"^msa.attention: argument 'k': expected dtype float32 or float8_e4m3fn "
                                        r"\(the dtype of q, or fp8 e4m3 with k_scale and v_scale\), got float16$"):
        call(plan, a, k_cache=a["k_cache"].astype(np.float16))
    with pytest.raises(TypeError, match=r"argument 'v': expected dtype float32 \(the dtype of q, as k: .*\), "
                                        r"got float64"):
        call(plan, a, v_cache=a["v_cache"].astype(np.float64))
    with pytest.raises(TypeError, match=r"argument 'kv_lens': expected dtype int32, got bool"):
        call(plan, a, kv_lens=a["kv_lens"].astype(bool))
    with pytest.raises(TypeError, match=r"argument 'block_idx': expected dtype int32, got int8"):
        call(plan, a, block_idx=a["block_idx"].astype(np.int8))


def test_cpu_backend_always_checks_page_ids_and_block_indexes(case):
    """The CPU backend reads the index tensors on the host anyway: without validate= it refuses what the GPU
    kernels would skip, naming the argument, the entry, the range and the value."""
    prob, plan, a = case
    pt = a["page_table"].copy()
    pt[1, 0] = 10_000
    num_pages = a["k_cache"].shape[0]
    with pytest.raises(ValueError, match=rf"^msa.attention: argument 'page_table': request 1, logical page 0: "
                                         rf"expected a page id in \[0, {num_pages}\) .*got 10000$"):
        call(plan, a, page_table=pt)
    bi = a["block_idx"].copy()
    bi[3, 1, 0] = 7  # request 0 has ceil(300 / 128) = 3 blocks
    with pytest.raises(ValueError, match=r"^msa.attention: argument 'block_idx': token 3, head 1, slot 0: block 7 "
                                         r"is out of range: expected a block in \[0, 3\)"):
        call(plan, a, block_idx=bi)
    bi = np.full_like(a["block_idx"], -1)
    bi[6, 0, :2] = 1
    with pytest.raises(ValueError, match=r"'block_idx': token 6, head 0: block 1 is selected twice"):
        call(plan, a, block_idx=bi)


def test_block_scores_checks_page_ids_on_the_cpu(rng):
    prob = mt.make_problem(rng, qo_lens=[5], kv_lens=[300], num_qo_heads=4, num_kv_heads=1, head_dim=64,
                           pattern=None, dtype="fp32")
    pt = prob.page_table.copy()
    pt[0, 2] = -3
    with pytest.raises(ValueError, match=r"msa.block_scores: argument 'page_table': request 0, logical page 2: "
                                         r"expected a page id in \[0, \d+\) .*got -3"):
        msa.block_scores(prob.q, prob.k_cache, pt, prob.qo_indptr, prob.kv_lens)


def test_decode_lengths_past_the_plans_max_kv_len(rng):
    """plan_decode's max_kv_len is enforced where the lengths are host-readable (CPU tensors; CUDA tensors with
    validate=True), by attention and by the whole layer before its indexer steps."""
    prob = mt.make_problem(rng, qo_lens=[1, 1], kv_lens=[300, 140], num_qo_heads=4, num_kv_heads=2, head_dim=64,
                           page_size=64, topk=3, dtype="fp32")
    kw = dict(num_qo_heads=4, num_kv_heads=2, head_dim=64, page_size=64, topk=3)
    plan = msa.plan_decode(2, 1, 200, **kw)
    a = mt.to_numpy(prob)
    msg = r"'kv_lens': request 0 has kv_len = 300, more than the plan's max_kv_len = 200"
    with pytest.raises(ValueError, match="^msa.attention: argument " + msg):
        call(plan, a)
    q_index = rng.standard_normal((2, 2, 64)).astype(np.float32)
    k_index = rng.standard_normal((a["k_cache"].shape[0], 1, 64, 64)).astype(np.float32)
    with pytest.raises(ValueError, match="^msa.sparse_attention_layer: argument " + msg):
        msa.sparse_attention_layer(plan, a["q"], a["k_cache"], a["v_cache"], q_index, k_index, a["page_table"],
                                   a["qo_indptr"], a["kv_lens"])
    call(msa.plan_decode(2, 1, 300, **kw), a)  # at the bound: fine


@pytest.mark.parametrize("layout", ["THK", "HKT"])
def test_select_topk_names_scores_of_the_wrong_shape(rng, layout):
    """Scores whose shape does not fit the lengths are named (with the shape expected and the one passed) before
    the lengths are checked against them."""
    prob = mt.make_problem(rng, qo_lens=[5, 9], kv_lens=[300, 140], num_qo_heads=4, num_kv_heads=1, head_dim=64,
                           pattern=None, dtype="fp32")
    scores = msa.block_scores(prob.q, prob.k_cache, prob.page_table, prob.qo_indptr, prob.kv_lens, layout=layout)
    short = scores[:10] if layout == "THK" else scores[:, :, :10]  # 10 of the 14 tokens
    want = ("[total_q >= 14, num_heads, max_blocks >= 3]" if layout == "THK"
            else "[num_heads, max_blocks >= 3, total_q >= 14]")
    got = "[10, 4, 3]" if layout == "THK" else "[4, 3, 10]"
    with pytest.raises(ValueError) as info:
        msa.select_topk(short, prob.qo_indptr, prob.kv_lens, 2, layout=layout)
    assert str(info.value).startswith(f"msa.select_topk: argument 'scores': expected shape {want}"), info.value
    assert str(info.value).endswith(f"got {got}"), info.value
    other = "HKT" if layout == "THK" else "THK"  # scores passed with the other layout's name
    with pytest.raises(ValueError, match=r"^msa.select_topk: argument 'scores': expected shape"):
        msa.select_topk(scores, prob.qo_indptr, prob.kv_lens, 2, layout=other)


def test_dense_plan_refuses_block_idx(case):
    prob, plan, a = case
    dense = msa.plan_prefill(prob.qo_lens, prob.kv_lens, num_qo_heads=4, num_kv_heads=2, head_dim=64)
    with pytest.raises(ValueError, match="'block_idx'"):
        call(dense, a)


def test_python_layer_errors(case):
    prob, plan, a = case
    with pytest.raises(TypeError, match="'plan'"):
        call("plan", a)
    with pytest.raises(ValueError, match="'sm_scale'"):
        call(plan, a, sm_scale=0)
    with pytest.raises(ValueError, match="'sm_scale'"):
        call(plan, a, sm_scale=float("nan"))
    with pytest.raises(TypeError, match="'stream'"):
        call(plan, a, stream="default")
    with pytest.raises(ValueError, match="'stream'"):
        call(plan, a, stream=-1)


class DLPackOnly:
    """A tensor of an unknown framework: only the DLPack protocol, no numpy or torch type."""

    def __init__(self, a):
        self._a = a
        self.shape = a.shape

    def __dlpack__(self, **kw):
        return self._a.__dlpack__(**kw)

    def __dlpack_device__(self):
        return self._a.__dlpack_device__()


def test_other_frameworks_must_pass_out(case):
    prob, plan, a = case
    q = DLPackOnly(a["q"])
    with pytest.raises(TypeError, match="'out' is required"):
        call(plan, a, q=q)
    out = np.zeros((14, 4, 64), np.float32)
    call(plan, a, q=q, out=out)
    mt.assert_close(out, mt.ref_attention(prob)[0])


def test_plan_errors():
    kw = dict(num_qo_heads=4, num_kv_heads=2, head_dim=64)
    with pytest.raises(ValueError, match="'num_qo_heads'"):
        msa.plan_prefill([1], [10], num_qo_heads=6, num_kv_heads=4)
    with pytest.raises(ValueError, match="'kv_lens'"):
        msa.plan_prefill([1, 2], [10], **kw)
    with pytest.raises(ValueError, match="qo_offset"):
        msa.plan_prefill([5], [10], qo_offset=[6], **kw)
    with pytest.raises(ValueError, match="'qo_lens'"):
        msa.plan_prefill([11], [10], **kw)
    with pytest.raises(TypeError, match="'qo_lens'"):
        msa.plan_prefill([1.5], [10], **kw)
    with pytest.raises(ValueError, match="'kv_lens'"):
        msa.plan_prefill([1], [2**31], **kw)
    with pytest.raises(ValueError, match="'qo_lens'"):
        msa.plan_prefill([[1]], [10], **kw)
    with pytest.raises(TypeError, match="'head_dim'"):
        msa.plan_prefill([1], [10], num_qo_heads=4, num_kv_heads=2, head_dim=64.0)
    with pytest.raises(ValueError, match="'topk'"):
        msa.plan_prefill([1], [10], topk=-1, **kw)
    with pytest.raises(ValueError, match="'page_size'"):
        msa.plan_decode(1, 1, 10, page_size=0, **kw)


@pytest.mark.parametrize("device,exc", [("tpu", ValueError), ("cuda:x", ValueError), ("cpu:1", ValueError),
                                        (1.5, TypeError), (True, TypeError)])
def test_bad_devices(device, exc):
    with pytest.raises(exc, match="'device'"):
        msa.plan_decode(1, 1, 10, num_qo_heads=2, num_kv_heads=1, device=device)


@pytest.mark.skipif(msa.cuda_available(), reason="a usable CUDA backend is present")
@pytest.mark.parametrize("device", ["cuda", "cuda:1", 0])
def test_cuda_plan_without_cuda_is_not_implemented(device):
    with pytest.raises(NotImplementedError, match="msa.plan_decode: argument 'device'"):
        msa.plan_decode(1, 1, 10, num_qo_heads=2, num_kv_heads=1, device=device)


def test_indexer_errors(rng):
    prob = mt.make_problem(rng, qo_lens=[5], kv_lens=[300], num_qo_heads=4, num_kv_heads=1, head_dim=64,
                           pattern=None, dtype="fp32")
    q, k, pt, qi, kl = prob.q, prob.k_cache, prob.page_table, prob.qo_indptr, prob.kv_lens
    with pytest.raises(ValueError, match="'layout'"):
        msa.block_scores(q, k, pt, qi, kl, layout="TKH")
    with pytest.raises(ValueError, match="'out'"):
        msa.block_scores(q, k, pt, qi, kl, max_blocks=2)
    with pytest.raises(ValueError, match="'k_scale'"):
        msa.block_scores(q, k, pt, qi, kl, k_scale=np.ones(k.shape[:3], np.float32))
    with pytest.raises(ValueError, match="'k_index'"):
        msa.block_scores(q, k[:, :, :, :32], pt, qi, kl)
    scores = msa.block_scores(q, k, pt, qi, kl, layout="THK")
    with pytest.raises(ValueError, match="'layout'"):
        msa.select_topk(scores, qi, kl, 2, layout="KHT")
    with pytest.raises(ValueError, match="'topk'"):
        msa.select_topk(scores, qi, kl, 0, layout="THK")
    with pytest.raises(ValueError, match="force_begin"):
        msa.select_topk(scores, qi, kl, 2, layout="THK", force_begin=2, force_end=1)
    with pytest.raises(TypeError, match="'scores'"):
        msa.select_topk(scores.astype(np.float16), qi, kl, 2, layout="THK")
    with pytest.raises(TypeError, match="'topk'"):
        msa.select_topk(scores, qi, kl, 2.0, layout="THK")


def test_merge_errors(rng):
    v = np.zeros((2, 3, 4, 8), np.float32)
    lse = np.zeros((2, 3, 4), np.float32)
    with pytest.raises(ValueError, match="'lse_parts'"):
        msa.merge_states(v, lse[:1])
    with pytest.raises(TypeError, match="'lse_parts'"):
        msa.merge_states(v, lse.astype(np.float16))
    with pytest.raises(ValueError, match="'out'"):
        msa.merge_states(v, lse, out=np.zeros((3, 4, 4), np.float32))
