"""A small pass over every path of the paged CUDA kernels, sized for compute-sanitizer (each launch
runs once): sparse and dense decode, split and unsplit (merge in a cluster, pulled or pushed, through
the workspace, or by the second kernel), multi-token tiles, padded groups, odd page sizes, the flat table and the
slot-major pool, prefill tiles, merge_states and build_page_table, plus device values that must be
clamped. Exits non-zero on a wrong result.

    PYTHONPATH=build/python compute-sanitizer --tool memcheck  python3 tests/python/sanitize_decode.py
    PYTHONPATH=build/python compute-sanitizer --tool racecheck python3 tests/python/sanitize_decode.py
"""
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import msa  # noqa: E402
import msa_testing as mt  # noqa: E402

DEV = "cuda"
FP8_SCALE = 1.0 / 64


def run(prob, decode=True, tamper=None, fp8=False, **split):
    kw = dict(num_qo_heads=prob.num_qo_heads, num_kv_heads=prob.num_kv_heads, head_dim=prob.head_dim,
              page_size=prob.page_size, topk=prob.topk, causal=prob.causal, device=DEV, **split)
    if decode:
        plan = msa.plan_decode(prob.batch_size, int(prob.qo_lens.max()), int(prob.kv_lens.max()), **kw)
    else:
        plan = msa.plan_prefill(prob.qo_lens, prob.kv_lens, qo_offset=prob.qo_offset, **kw)
    t = mt.to_torch(prob, DEV, torch.bfloat16)
    if tamper:
        tamper(t)
    scales = {}
    if fp8:  # the halves of one interleaved fp8 pool
        k8, _, _, _ = mt.fp8_kv(prob, FP8_SCALE, FP8_SCALE, interleaved=True)
        pool = torch.from_numpy(k8.base.view(np.uint8)).to(DEV).view(torch.float8_e4m3fn)
        t["k_cache"], t["v_cache"] = pool[..., :prob.head_dim], pool[..., prob.head_dim:]
        scales = dict(k_scale=FP8_SCALE, v_scale=FP8_SCALE)
    o, lse = msa.attention(plan, t["q"], t["k_cache"], t["v_cache"], t["page_table"], t["qo_indptr"], t["kv_lens"],
                           block_idx=t["block_idx"], qo_offset=t["qo_offset"], page_indptr=t["page_indptr"],
                           return_lse=True, **scales)
    torch.cuda.synchronize()
    return o.float().cpu().numpy(), lse.cpu().numpy()


def check(name, prob, **kw):
    print(f"begin {name}", flush=True)  # sanitizer reports print between begin and ok
    o, lse = run(prob, **kw)
    if kw.get("fp8"):
        _, _, kd, vd = mt.fp8_kv(prob, FP8_SCALE, FP8_SCALE, interleaved=True)
        o_ref, lse_ref = mt.scaled_reference(prob, kd, vd)
    else:
        o_ref, lse_ref = mt.ref_attention(prob)
    mt.assert_close(o, o_ref, what=name)
    mt.assert_lse_close(lse, lse_ref)
    print(f"ok {name}", flush=True)


def main():
    rng = np.random.default_rng(7)

    def prob(qo, kv, g=16, hkv=1, d=128, **kw):
        return mt.make_problem(rng, qo_lens=qo, kv_lens=kv, num_qo_heads=g * hkv, num_kv_heads=hkv, head_dim=d, **kw)

    check("decode sparse, split", prob([1, 1], [3000, 700]))
    check("decode sparse, unsplit", prob([1, 1], [3000, 700]), max_splits=1)
    check("decode sparse, fixed split", prob([1, 1], [3000, 700], topk=32), fixed_split_blocks=3)
    # 24 splits: more than a cluster holds, so the merge goes through the workspace and the last CTA
    # (on sm_90 the splits above merge inside a thread-block cluster).
    check("decode sparse, workspace merge", prob([1, 1], [3000, 700], topk=32), fixed_split_blocks=1)
    # 80 items x 4 splits: more clusters than fit at once, so CTAs of a second wave reuse shared memory
    check("decode sparse, push merge, several waves", prob([1] * 80, [3000] * 80), fixed_split_blocks=4)
    check("decode dense, split", prob([1, 1], [3000, 130], pattern=None))
    check("decode 4 tokens, token kernel, a CTA per token", prob([4, 3], [2000, 900], hkv=2, pattern="clustered"))
    check("decode 4 tokens, token kernel, split, ragged", prob([4, 0, 2], [9000, 50, 900], topk=32), max_splits=4)
    os.environ["MSA_PAGED_TOKEN_KERNEL"] = "0"  # the general kernel's tiles of one MTP token
    check("decode 4 tokens, one tile per token", prob([4, 3], [2000, 900], hkv=2, pattern="clustered"))
    del os.environ["MSA_PAGED_TOKEN_KERNEL"]
    check("decode 4 tokens, G=4 union tile (CTA sort)",
          prob([4, 3], [2000, 900], g=4, hkv=2, pattern="clustered"))
    check("decode 2 tokens, G=32 union tile (64 rows)", prob([2, 1], [1500, 700], g=32))
    check("decode 8 tokens, G=16, D=64", prob([8, 2], [1000, 300], d=64))
    check("decode G=12 padded, page 7, flat", prob([2, 1], [500, 90], g=12, page_size=7, flat_pages=True))
    check("decode G=1, D=256, slot-major", prob([1, 2], [400, 800], g=1, hkv=4, d=256, slot_major=True,
                                                 index_layout="HTK"))
    check("prefill sparse", prob([70, 5], [300, 5], hkv=2, g=4), decode=False)
    check("prefill dense, D=256", prob([33, 64], [100, 64], hkv=1, g=4, d=256, pattern=None), decode=False)
    # Page sizes the Hopper prefill kernels do not take: the paged family's prefill tiles (scan of
    # qo_indptr, CTA-wide sort of 32 tokens x 16 entries) run on every arch.
    check("prefill sparse, page 64 (paged family)", prob([70, 5], [300, 5], hkv=2, g=4, page_size=64), decode=False)
    check("prefill dense, page 16 (paged family)", prob([40, 3], [250, 600], hkv=1, g=16, page_size=16,
                                                         pattern=None), decode=False)

    # fp8 K/V: the token kernel (K fragments from fp8 rows, V converted), the general kernel's converted tiles,
    # the dense merges of many splits (the single-token kernel's merge kernel, the general kernel's two levels), and
    # the Hopper prefill kernels' fp8 paths (query-major on the plan's 16-bit copy and on widened tiles, KV-major).
    check("fp8 decode sparse, token kernel, split", prob([1, 1], [3000, 700]), fp8=True)
    # more than four waves of CTAs: the tile loop cycles through all 6 ring stages (3 on the grids above)
    n = 8 * torch.cuda.get_device_properties(0).multi_processor_count // 4 + 1
    check("fp8 decode sparse, token kernel, 6-stage ring", prob([1] * n, [int(x) for x in rng.integers(1, 900, n)],
                                                                hkv=4), fp8=True)
    # one unsplit CTA per SM, 16 blocks each: the 5-stage ring
    n = torch.cuda.get_device_properties(0).multi_processor_count // 4
    check("fp8 decode sparse, token kernel, 5-stage ring", prob([1] * n, [int(x) for x in rng.integers(2048, 4000, n)],
                                                                hkv=4), fp8=True)
    check("fp8 decode 4 tokens, G=4 union tile", prob([4, 3], [2000, 900], g=4, hkv=2, pattern="clustered"), fp8=True)
    check("fp8 decode dense, token kernel, merge kernel", prob([1], [40000], pattern=None), fp8=True)
    check("decode dense, token kernel, merge kernel, MTP", prob([2, 1], [40000, 300], pattern=None))
    # fp8 dense plans of more requests than one wave of splits holds (the bf16 cache's general kernel beside): one
    # cluster of 8 splits per item at two CTAs a SM, and splits without clusters past 512 blocks (the merge kernel)
    short = [int(x) for x in rng.integers(0, 3000, 29)]
    check("fp8 decode dense, token kernel in waves, one cluster", prob([1] * 30, [16500] + short, pattern=None),
          fp8=True)
    check("fp8 decode dense, token kernel in waves, merge kernel", prob([1] * 8, [66000] + short[:7], pattern=None),
          fp8=True)
    os.environ["MSA_PAGED_TOKEN_KERNEL"] = "0"  # the general kernel's two-level merge
    check("fp8 decode dense, general kernel, two-level merge", prob([1], [40000], pattern=None), fp8=True)
    del os.environ["MSA_PAGED_TOKEN_KERNEL"]
    # query-major on the plan's 16-bit copy (the widen kernel on every block beside the tile lists, or, past 1024
    # (block, KV head) pairs, on the blocks the lists flag) and on tiles widened in shared memory; KV-major
    for mode, qmajor_fp8 in (("qmajor", "auto"), ("qmajor", "tiles"), ("kvmajor", "auto")):
        os.environ["MSA_SM90_PREFILL"], os.environ["MSA_SM90_FP8_QMAJOR"] = mode, qmajor_fp8
        check(f"fp8 prefill sparse, {mode}, {qmajor_fp8}", prob([70, 5, 130], [300, 5, 900], hkv=2, g=16),
              decode=False, fp8=True)
        del os.environ["MSA_SM90_PREFILL"], os.environ["MSA_SM90_FP8_QMAJOR"]
    check("fp8 prefill sparse, auto: KV-major tiles on the copy", prob([70, 5, 130], [300, 5, 900], hkv=2, g=16),
          decode=False, fp8=True)
    os.environ["MSA_SM90_PREFILL"] = "qmajor"
    check("fp8 prefill sparse, qmajor, flagged copy", prob([70, 130], [300, 33000], hkv=4, g=16, pattern="clustered"),
          decode=False, fp8=True)
    del os.environ["MSA_SM90_PREFILL"]
    check("fp8 prefill dense, page 64 (paged family)", prob([40, 3], [250, 600], hkv=1, g=16, page_size=64,
                                                            pattern=None), decode=False, fp8=True)

    def tamper(t):
        t["page_table"][0, 2] = 10**9
        t["kv_lens"][1] = 10**8
        t["block_idx"][0, 0, 0] = 2**31 - 1
    print("begin clamped device values", flush=True)
    o, lse = run(prob([1, 1], [900, 300]), tamper=tamper)
    assert not np.isnan(o).any() and not np.isnan(lse).any()
    print("ok clamped device values", flush=True)

    print("begin merge_states, build_page_table", flush=True)
    v = torch.randn(3, 9, 4, 64, device=DEV)
    l = torch.randn(3, 9, 4, device=DEV)
    l[0, :2] = float("-inf")
    msa.merge_states(v, l, return_lse=True)
    r2t = torch.arange(3 * 256, device=DEV, dtype=torch.int32).view(3, 256)
    msa.build_page_table(r2t, torch.tensor([2, 0, 7], device=DEV, dtype=torch.int32),
                         torch.tensor([256, 17, 5], device=DEV, dtype=torch.int32), 16)
    torch.cuda.synchronize()
    print("ok merge_states, build_page_table", flush=True)


if __name__ == "__main__":
    main()
