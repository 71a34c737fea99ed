"""A NaN or an Inf in K across the kernels' split merges: a row that sees such a key is NaN in o and in lse, as the
float64 reference is, whichever split, partial or cluster rank holds the key, also where it is the row's only
non-empty split; no other row changes. Decode on both paged kernels (splits in a cluster, the workspace merge,
dense splits merged by the second kernel), bf16 and fp8 caches; prefill on the Hopper decompositions and the
portable ones (the KV-major partials and their LSE merge). Outputs are poisoned (NaN) before every run.

    PYTHONPATH=build/python python3 -m pytest -q -m gpu tests/python/gpu/test_gpu_non_finite.py
"""
import numpy as np
import pytest

torch = pytest.importorskip("torch")

import msa_testing as mt  # noqa: E402
from test_gpu_attention import plan_for, problem, run_gpu  # noqa: E402
from test_gpu_attention_fp8 import K_SCALE, V_SCALE, call, to_device_fp8  # noqa: E402

pytestmark = pytest.mark.gpu

BLOCK = 128


def seen_keys(prob, count, rng, lone=False):
    """(request, KV head, key) for `count` tokens spread over the batch, each a key the token sees; lone: the
    token's selection row keeps only that key's block (its other slots -1), so the key's split is the row's
    only non-empty one."""
    pos, req = prob.positions(), prob.request_of_token()
    picks = []
    for t in np.unique(np.linspace(0, len(pos) - 1, count).astype(int)):
        g = int(rng.integers(prob.num_kv_heads))
        keys = mt.visible_keys(prob, int(t), g, int(req[t]), int(pos[t]))
        if len(keys) == 0:
            continue
        key = int(keys[rng.integers(len(keys))])
        if lone:
            row = prob.block_idx[t, g]
            row[:] = -1
            row[rng.integers(len(row))] = key // BLOCK
        picks.append((int(req[t]), g, key))
    assert picks, "no token sees a key"
    return picks


def check_non_finite(o, lse, o_ref, lse_ref):
    nan_o, nan_l = np.isnan(o_ref), np.isnan(lse_ref)
    assert nan_o.any() and nan_l.any(), "the poisoned keys reach the reference"
    np.testing.assert_array_equal(np.isnan(o), nan_o)
    np.testing.assert_array_equal(np.isnan(lse), nan_l)
    mt.assert_close(np.where(nan_o, 0.0, o), np.where(nan_o, 0.0, o_ref))
    mt.assert_lse_close(lse[~nan_l], lse_ref[~nan_l])


DECODE = {  # name: (kv_lens, KV heads, pattern, MSA_PAGED_TOKEN_KERNEL)
    "token_splits": ([20000], 2, "random", "1"),           # 16 splits in a cluster (push merge)
    "token_batch": ([9000, 130, 5000, 2600], 2, "random", "1"),
    "general_splits": ([20000], 2, "random", "0"),         # the general kernel's cluster / workspace merges
    "general_batch": ([9000, 130, 5000, 2600], 2, "random", "0"),
    "dense_merge_kernel": ([40000], 2, None, "1"),         # splits without clusters, merged by a second kernel
    "dense_general": ([40000, 3000], 2, None, "0"),
}
# lone: the key's split is its row's only non-empty one (sparse rows only: a dense row has no selection to narrow)
DECODE_CASES = [(c, lone) for c in DECODE for lone in (False, True) if not (lone and DECODE[c][2] is None)]


@pytest.mark.parametrize("value", [np.nan, np.inf])
@pytest.mark.parametrize("case,lone", DECODE_CASES)
def test_decode_bf16(rng, monkeypatch, case, lone, value):
    kv, hkv, pattern, token = DECODE[case]
    monkeypatch.setenv("MSA_PAGED_TOKEN_KERNEL", token)
    prob = problem(rng, [1] * len(kv), kv, num_kv_heads=hkv, pattern=pattern)
    for b, g, key in seen_keys(prob, 3, rng, lone):
        page, slot = mt.cache_slot(prob, b, key)
        prob.k_cache[page, g, slot, int(rng.integers(prob.head_dim))] = value
    o, lse = run_gpu(plan_for(prob, max_qo_len=1), prob)
    check_non_finite(o, lse, *mt.ref_attention(prob))


@pytest.mark.parametrize("byte", [0xFF, 0x7F])  # e4m3's two NaN encodings
@pytest.mark.parametrize("case,lone", [c for c in DECODE_CASES if DECODE[c[0]][3] == "1"])
def test_decode_fp8(rng, case, lone, byte):
    kv, hkv, pattern, _ = DECODE[case]
    prob = problem(rng, [1] * len(kv), kv, num_kv_heads=hkv, pattern=pattern)
    picks = seen_keys(prob, 3, rng, lone)
    k8, v8, _, _ = mt.fp8_kv(prob, K_SCALE, V_SCALE)
    for b, g, key in picks:
        page, slot = mt.cache_slot(prob, b, key)
        k8.view(np.uint8)[page, g, slot, int(rng.integers(prob.head_dim))] = byte
    kd, vd = k8.astype(np.float64) * K_SCALE, v8.astype(np.float64) * V_SCALE
    out, lse = call(plan_for(prob, max_qo_len=1), prob, mt.to_torch(prob, "cuda", torch.bfloat16),
                    to_device_fp8(k8), to_device_fp8(v8), k_scale=K_SCALE, v_scale=V_SCALE)
    check_non_finite(out.float().cpu().numpy(), lse.cpu().numpy(), *mt.scaled_reference(prob, kd, vd))


PREFILL = {  # name: environment of the plan
    "sm90_auto": {},
    "sm90_kvmajor": {"MSA_SM90_PREFILL": "kvmajor"},
    "sm90_qmajor": {"MSA_SM90_PREFILL": "qmajor"},
    "portable_kvmajor": {"MSA_PORTABLE_PREFILL": "kvmajor"},
    "portable_qmajor": {"MSA_PORTABLE_PREFILL": "qmajor"},
}


@pytest.mark.parametrize("value", [np.nan, np.inf])
@pytest.mark.parametrize("case", list(PREFILL))
def test_prefill(rng, monkeypatch, case, value):
    """K only: a non-finite V value reaches the rows of every token whose tile reads its block (the contract's
    stated exception), K reaches only the rows that see the key."""
    for name, v in PREFILL[case].items():
        monkeypatch.setenv(name, v)
    if case.startswith("sm90") and mt.kernel_capability() != (9, 0):
        pytest.skip("the Hopper prefill kernels run on sm_90 code only")
    prob = problem(rng, [300, 64, 129], [3000, 900, 2000], pattern="random", topk=16)
    for b, g, key in seen_keys(prob, 6, rng):
        page, slot = mt.cache_slot(prob, b, key)
        prob.k_cache[page, g, slot, int(rng.integers(prob.head_dim))] = value
    o, lse = run_gpu(plan_for(prob, decode=False), prob)
    check_non_finite(o, lse, *mt.ref_attention(prob))
