"""torch tensors imported through DLPack's C exchange API (type(t).__dlpack_c_exchange_api__, torch >= 2.10)
against the same tensors through t.__dlpack__(): the same views (strides, storage offsets, empty tensors,
dtypes), the same refusals and acceptances, bitwise the same results; and on CUDA, the calls launched on torch's current
stream (resolved through the same API), eagerly and inside a captured graph. Skipped without torch; the
comparisons with the API skip where torch has none."""
import contextlib

import numpy as np
import pytest

import msa
import msa_testing as mt

torch = pytest.importorskip("torch")

HAS_API = hasattr(torch.Tensor, "__dlpack_c_exchange_api__") or hasattr(torch.Tensor, "__c_dlpack_exchange_api__")


@contextlib.contextmanager
def fast_import(on: bool):
    was = msa._C._set_fast_import(on)
    try:
        yield
    finally:
        msa._C._set_fast_import(was)


def problem_tensors(rng, device):
    """A strided problem (slot-major pool, [Hkv, T, topk] index rows, flat pages) with q a view at a nonzero
    storage offset, as torch tensors on `device`."""
    prob = mt.make_problem(rng, qo_lens=[5, 0, 19], kv_lens=[300, 64, 180], num_qo_heads=8, num_kv_heads=2,
                           head_dim=64, page_size=32, topk=3, dtype="bf16", slot_major=True, index_layout="HTK",
                           flat_pages=True)
    t = mt.to_torch(prob, device=device)
    big = torch.zeros((t["q"].shape[0] + 3,) + tuple(t["q"].shape[1:]), dtype=t["q"].dtype, device=device)
    big[3:] = t["q"]
    t["q"] = big[3:]
    return prob, t


def make_plan(prob, device):
    return msa.plan_prefill(prob.qo_lens, prob.kv_lens, num_qo_heads=prob.num_qo_heads,
                            num_kv_heads=prob.num_kv_heads, head_dim=prob.head_dim, page_size=prob.page_size,
                            topk=prob.topk, qo_offset=prob.qo_offset, device=device)


def run_attention(prob, t, device, plan=None, **kw):
    plan = plan or make_plan(prob, device)
    return msa.attention(plan, t["q"], t["k_cache"], t["v_cache"], t["page_table"], t["qo_indptr"], t["kv_lens"],
                         block_idx=t["block_idx"], page_indptr=t["page_indptr"], qo_offset=t["qo_offset"],
                         return_lse=True, **kw)


def test_switch_reports_the_previous_setting():
    with fast_import(False):
        assert msa._C._set_fast_import(False) is False
        with fast_import(True):
            assert msa._C._set_fast_import(True) is True


@pytest.mark.skipif(not HAS_API, reason="this torch has no DLPack C exchange API")
def test_both_imports_give_bitwise_the_same_results_on_cpu(rng):
    prob, t = problem_tensors(rng, "cpu")
    assert t["q"].storage_offset() > 0 and not t["k_cache"].is_contiguous()
    results = []
    for on in (True, False):
        with fast_import(on):
            results.append(run_attention(prob, t, "cpu"))
    (o1, l1), (o0, l0) = results
    assert torch.equal(o1, o0) and torch.equal(l1, l0)
    o_ref, lse_ref = mt.ref_attention(prob)
    mt.assert_close(o1.float().numpy(), o_ref)
    mt.assert_lse_close(l1.numpy(), lse_ref)


@pytest.mark.skipif(not HAS_API, reason="this torch has no DLPack C exchange API")
@pytest.mark.parametrize("case", ["requires_grad", "float64", "five_dims_more", "empty_any_strides"])
def test_both_imports_refuse_and_accept_alike(rng, case):
    prob, t = problem_tensors(rng, "cpu")
    if case == "requires_grad":
        t["q"] = t["q"].clone().requires_grad_(True)
    elif case == "float64":
        t["q"] = t["q"].double()
    elif case == "five_dims_more":
        t["q"] = t["q"].reshape((1,) * 5 + tuple(t["q"].shape))
    outcomes = []
    for on in (True, False):
        with fast_import(on):
            if case == "empty_any_strides":
                # no tokens: the empty q arrives with strides (0, 0, 0), which numpy 2 gives every empty array
                q0 = torch.from_numpy(np.zeros((0, 8, 64), np.float32)).to(torch.bfloat16).as_strided((0, 8, 64),
                                                                                                      (0, 0, 0))
                plan = msa.plan_prefill([0], [64], num_qo_heads=8, num_kv_heads=2, head_dim=64, page_size=32,
                                        device="cpu")
                o = msa.attention(plan, q0, t["k_cache"], t["v_cache"], torch.zeros(1, 2, dtype=torch.int32),
                                  torch.zeros(2, dtype=torch.int32), torch.full((1,), 64, dtype=torch.int32))
                outcomes.append(("ok", tuple(o.shape)))
                continue
            try:
                run_attention(prob, t, "cpu")
                outcomes.append(("ok", None))
            except Exception as e:  # noqa: BLE001 (the two paths must fail alike)
                outcomes.append((type(e).__name__, str(e)))
    assert outcomes[0] == outcomes[1], outcomes
    if case in ("float64", "five_dims_more"):
        kind, msg = outcomes[0]
        assert kind in ("TypeError", "ValueError") and "argument 'q'" in msg, outcomes
    else:  # a tensor that requires grad is read as it is (nanobind's to_dlpack fallback did so before)
        assert outcomes[0][0] == "ok", outcomes


@pytest.mark.gpu
@pytest.mark.parametrize("on", [True, False], ids=["c-api", "dlpack"])
def test_cuda_calls_launch_on_torchs_current_stream(rng, on):
    """On a side stream while the default stream is held by a long kernel (a launch on the default stream
    would leave the poisoned output for the side stream's copy), and inside a captured graph (whose capture a
    launch on any other stream would break): each result bitwise the eager one."""
    prob, t = problem_tensors(rng, "cuda")
    with fast_import(on):
        plan = make_plan(prob, "cuda")
        o_ref, l_ref = run_attention(prob, t, "cuda", plan)
        o = torch.full_like(o_ref, float("nan"))
        lse = torch.full_like(l_ref, float("nan"))
        torch.cuda.synchronize()
        side = torch.cuda.Stream()
        torch.cuda._sleep(200_000_000)  # ~0.1 s on the default stream
        with torch.cuda.stream(side):
            run_attention(prob, t, "cuda", plan, out=o, lse=lse)
            o_host, l_host = o.cpu(), lse.cpu()  # copies on the side stream, waited for by the host
        assert torch.equal(o_host, o_ref.cpu()) and torch.equal(l_host, l_ref.cpu())
        torch.cuda.synchronize()
        graph, (o_g, l_g) = mt.capture_graph(lambda: run_attention(prob, t, "cuda", plan))
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(o_g, o_ref) and torch.equal(l_g, l_ref)
