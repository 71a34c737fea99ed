"""msa.distributed on CUDA with N emulated ranks on one device: the sharded selection equals the single-device
one bitwise and the merged output is within bf16 tolerance, as on the CPU (tests/python/cpu/
test_distributed_emulated.py), at M3's index width (head_dim 128); and the decode step under CUDA-graph capture."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")

import msa_testing as mt  # noqa: E402
from distributed_testing import check, make_batch, run_emulated, reference, shards  # noqa: E402

pytestmark = pytest.mark.gpu

WORLDS = [1, 2, 4, 8]
LAYOUTS = ["round_robin", "contiguous", "owner"]


def batch_for(rng, qo_lens, kv_lens, **kw):
    kw.setdefault("head_dim", 128)
    kw.setdefault("page_size", 64)
    return make_batch(torch, rng, qo_lens, kv_lens, device="cuda", **kw)


@pytest.mark.parametrize("index_fp8", [False, True])
@pytest.mark.parametrize("world", WORLDS)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_decode(rng, world, layout, index_fp8):
    batch = batch_for(rng, [1, 1, 3, 1, 2, 16], [700, 1500, 129, 2000, 64, 1800], index_fp8=index_fp8)
    check(torch, batch, "decode", layout, world, 16, rng, max_kv=2048)


@pytest.mark.parametrize("index_fp8", [False, True])
@pytest.mark.parametrize("world", WORLDS)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_prefill(rng, world, layout, index_fp8):
    batch = batch_for(rng, [600, 37, 1000, 1], [3000, 37, 2400, 513], page_size=128, index_fp8=index_fp8)
    check(torch, batch, "prefill", layout, world, 16, rng, max_kv=3072)


def test_decode_step_in_cuda_graph(rng):
    """DecodeSteps and the emulated layer captured once (plans built before), replayed after the lengths
    change in place: no host read in the step."""
    import msa.distributed as dist
    world, topk, max_kv = 4, 8, 4096
    batch = batch_for(rng, [1] * 8, [4000, 300, 129, 2500, 1, 3000, 1024, 2049])
    sh = shards(torch, "round_robin", world, batch, max_kv // 128, rng, "cuda")
    tables = [dist.shard_page_table(batch["page_table"], s, 64) for s in sh]
    T = batch["q"].shape[0]

    def steps():
        return [dist.DecodeStep(s, t, batch["qo_indptr"], batch["kv_lens"], T) for s, t in zip(sh, tables)]

    plans = [st.plan(num_qo_heads=batch["hq"], num_kv_heads=batch["hkv"], page_size=64, topk=topk)
             for st in steps()]

    def run():
        n = len(sh)
        return dist.emulate_layer(steps(), plans, batch["q"], [batch["k_cache"]] * n, [batch["v_cache"]] * n,
                                  batch["q_index"], [batch["k_index"]] * n, topk)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        run()  # warm-up outside the capture
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        o, bi = run()
    batch["kv_lens"].copy_(torch.tensor([3000, 250, 129, 2400, 1, 2900, 1000, 2049], dtype=torch.int32))
    batch["kv_lens_host"] = batch["kv_lens"].tolist()
    g.replay()
    torch.cuda.synchronize()
    o_ref, bi_ref = reference(batch, "decode", topk, max_kv)
    np.testing.assert_array_equal(bi.cpu().numpy(), bi_ref.cpu().numpy())
    mt.assert_close(o.float().cpu().numpy(), o_ref.float().cpu().numpy())


def _merge_case(rng, qo_lens, kv_lens, ranks, per_rank, extra_blocks=2, heads=4):
    """Random candidates [N, T, H, k] with NaN, -inf, ties, empty and out-of-range ids, duplicates."""
    qo_indptr = np.concatenate([[0], np.cumsum(qo_lens)]).astype(np.int32)
    kv = np.asarray(kv_lens, np.int32)
    offset = (kv - np.asarray(qo_lens) - rng.integers(0, 2, len(kv))).astype(np.int32)
    nb = int(-(-kv.max() // 128)) + extra_blocks
    shape = (ranks, int(qo_indptr[-1]), heads, per_rank)
    u = rng.random(shape)
    cs = np.where(u < 0.05, np.nan, np.where(u < 0.1, -np.inf, rng.integers(-50, 50, shape))).astype(np.float32)
    ci = rng.integers(-2, nb + 2, shape).astype(np.int32)
    return qo_indptr, kv, offset, nb, cs, ci


@pytest.mark.parametrize("ranks,per_rank", [(1, 16), (2, 16), (4, 16), (8, 64), (3, 5)])
@pytest.mark.parametrize("kv_max", [2000, 65536, 1 << 20, (4 << 20) - 512])
@pytest.mark.parametrize("forced", [(0, 1), (2, 1)])
def test_merge_candidates_kernel_equals_cpu(rng, ranks, per_rank, kv_max, forced):
    """The CUDA merge_candidates against the CPU backend's (select_topk over the scattered rows), bitwise: rows in
    registers' reach and rows of up to 32768 blocks, ragged batches, prefixes, duplicates; outputs poisoned."""
    import msa

    qo_lens = [1, 3, 1, 16, 2]
    kv_lens = [kv_max, 1500, 129, kv_max - 77, 640]
    qo_indptr, kv, offset, nb, cs, ci = _merge_case(rng, qo_lens, kv_lens, ranks, per_rank)
    fb, fe = forced
    for causal in (True, False):
        want = msa.merge_candidates(cs, ci, qo_indptr, kv, 16, nb, qo_offset=offset, force_begin=fb, force_end=fe,
                                    causal=causal)
        d = {k: torch.from_numpy(v).cuda() for k, v in dict(cs=cs, ci=ci, qo=qo_indptr, kv=kv, off=offset).items()}
        out = torch.full((cs.shape[1], cs.shape[2], 16), -777, dtype=torch.int32, device="cuda")
        msa.merge_candidates(d["cs"], d["ci"], d["qo"], d["kv"], 16, nb, qo_offset=d["off"], force_begin=fb,
                             force_end=fe, causal=causal, out=out, validate=True)
        np.testing.assert_array_equal(out.cpu().numpy(), want)


def test_merge_candidates_in_cuda_graph_with_changing_lengths(rng):
    """Captured once, replayed with the lengths, offsets and candidates rewritten in place: equal to eager CPU."""
    import msa

    qo_indptr, kv, offset, nb, cs, ci = _merge_case(rng, [1] * 64, [65536] * 64, 2, 16)
    d = {k: torch.from_numpy(v).cuda() for k, v in dict(cs=cs, ci=ci, qo=qo_indptr, kv=kv, off=offset).items()}
    out = torch.full((64, 4, 16), -777, dtype=torch.int32, device="cuda")
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        msa.merge_candidates(d["cs"], d["ci"], d["qo"], d["kv"], 16, nb, qo_offset=d["off"], out=out)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        msa.merge_candidates(d["cs"], d["ci"], d["qo"], d["kv"], 16, nb, qo_offset=d["off"], out=out)
    for _ in range(50):
        kv2 = rng.integers(1, 65537, 64).astype(np.int32)
        off2 = np.maximum(kv2 - 1 - rng.integers(0, 300, 64), 0).astype(np.int32)
        _, _, _, _, cs2, ci2 = _merge_case(rng, [1] * 64, [65536] * 64, 2, 16)
        for k, v in dict(cs=cs2, ci=ci2, kv=kv2, off=off2).items():
            d[k].copy_(torch.from_numpy(v))
        out.fill_(-777)
        g.replay()
        torch.cuda.synchronize()
        want = msa.merge_candidates(cs2, ci2, qo_indptr, kv2, 16, nb, qo_offset=off2)
        np.testing.assert_array_equal(out.cpu().numpy(), want)
